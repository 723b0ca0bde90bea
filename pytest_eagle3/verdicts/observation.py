"""One verdict of the run with its context: the run-level diagnosis's unit of evidence.

An :class:`Observation` says which comparison was judged (its test and check),
whether it was right, and where it ran: TP size and rank, path, forward mode,
the request's order on its engine, the batch it was sent in, the prefill chunk,
and inside the comparison which slots and rows were wrong.
:mod:`pytest_eagle3.verdicts.separation` reads them as attributes;
:mod:`pytest_eagle3.verdicts.run_cause` weighs them.  Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

#: Levels: the captures SGLang returned or recorded, the served draft's accept
#: length, the offline accept length of the draft on SGLang's own captures.
CAPTURE, SERVED, OFFLINE = "capture", "served-draft", "offline-draft"
#: :attr:`Observation.chunk` where the chunk's number is not known: a later chunk
#: (the API's last chunk), and prefill rows joined over a prompt's chunks.
LATER_CHUNK_UNNUMBERED, CHUNKS_JOINED = -1, -2


def forward_mode(sglang_mode: str, first_position: int | None) -> str:
    """The diagnosis's mode of one recorded forward (SGLang's ``ForwardMode`` name
    and the first row's position): ``decode``, ``verify``, ``later-chunk`` (an
    extend that starts past position 0 on an engine whose cache was flushed),
    else ``prefill``."""
    name = str(sglang_mode).upper()
    if "VERIFY" in name:
        return "verify"
    if "DECODE" in name:
        return "decode"
    return "later-chunk" if first_position else "prefill"


@dataclass(frozen=True)
class Observation:
    """One verdict of the run, with its context.

    Attributes:
        test: the test's node id.
        check: what was judged (``captures``, ``pair``, ``ranks``, ``acceptance``).
        ok: the verdict passed.
        tp: the test's TP size.
        path: the path variant or case (``plain``, ``batch``, ``radix-cache-hit``...).
        ids: the aux layer ids asked for (``None``: SGLang's default).
        mode: forward mode of the rows (:data:`MODES`).
        rank: the TP rank the rows came from (``None``: the API's, rank 0's).
        level: :data:`CAPTURE`, :data:`SERVED` or :data:`OFFLINE`.
        order: position of the send (the test's prompts, sent once) among the
            engine's sends, from 0 (``-1``: unknown).
        request: position of the request among that send's, from 0 (``-1``: unknown).
        engine: the engine's name.
        kinds: the per-test diagnosis tags.
        right_snapshots: every wrong slot's best match is its expected snapshot.
        worst_err: largest relative L2 error of an expected snapshot (``nan``: none).
        tol: the tolerance the verdict used (``nan``: none).
        value: accept length (acceptance levels).
        line: first line of the test's own verdict.
        snapshots: the snapshots the comparison examined (``None``: its every slot; the
            embedding check: ``(0,)``).  wrong_snapshots: the expected snapshots of its wrong slots.
        batch: how many requests its send held together (``1``: sent alone; ``0``: unknown).
        chunk: the prefill chunk of its prompt the rows are, from 1 (``1``: the first
            chunk or a whole prompt in one forward; :data:`LATER_CHUNK_UNNUMBERED`,
            :data:`CHUNKS_JOINED`; ``0``: not prefill rows, decode, verify or a
            radix-cache hit's tail).
        slot_count: how many aux slots it compared (``0``: no slot comparison).
        wrong_slots: the slot positions it found wrong (``()``: none, or not a slot comparison).
        rows: the positions ``(first, stop)`` of the rows it compared (``None``: unknown).
        wrong_rows: the position ranges ``(start, stop)`` where its wrong slots are wrong,
            when the rows separate clearly (``()``: every row, or unknown;
            :func:`pytest_eagle3.verdicts.compare.wrong_rows`).
    """

    test: str
    check: str
    ok: bool
    tp: int = 1
    path: str = "plain"
    ids: tuple[int, ...] | None = None
    mode: str = "prefill"
    rank: int | None = None
    level: str = CAPTURE
    order: int = -1
    request: int = -1
    engine: str = ""
    kinds: tuple[str, ...] = ()
    right_snapshots: bool = False
    worst_err: float = math.nan
    tol: float = math.nan
    value: float | None = None
    line: str = ""
    snapshots: tuple[int, ...] | None = None
    wrong_snapshots: tuple[int, ...] = ()
    batch: int = 0
    chunk: int = 0
    slot_count: int = 0
    wrong_slots: tuple[int, ...] = ()
    rows: tuple[int, int] | None = None
    wrong_rows: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ids"] = list(self.ids) if self.ids is not None else None
        out["kinds"] = list(self.kinds)
        for key in ("worst_err", "tol"):
            if isinstance(out[key], float) and math.isnan(out[key]):
                out[key] = None
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Observation":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if known.get("ids") is not None:
            known["ids"] = tuple(int(i) for i in known["ids"])
        known["kinds"] = tuple(known.get("kinds") or ())
        for key in ("snapshots", "wrong_snapshots", "wrong_slots"):
            if known.get(key) is not None:
                known[key] = tuple(int(i) for i in known[key])
        if known.get("rows") is not None:
            known["rows"] = (int(known["rows"][0]), int(known["rows"][1]))
        known["wrong_rows"] = tuple((int(a), int(b)) for a, b in known.get("wrong_rows") or ())
        for key in ("worst_err", "tol"):
            if known.get(key) is None:
                known[key] = math.nan
        return cls(**known)

    def context(self) -> str:
        parts = [f"tp {self.tp}", self.path, self.mode]
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.order >= 0:
            parts.append(f"send {self.order + 1} on its engine")
        if self.level != CAPTURE:
            parts.append(self.level)
        return ", ".join(parts)
