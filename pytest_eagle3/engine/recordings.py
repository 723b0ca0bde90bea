"""Test-process side of the per-rank recorder: switch it on, read what each rank wrote.

The worker side is :mod:`pytest_eagle3.worker.recorder_hook`; the two share a
directory (``EnginePool.record_dir``) and the file names defined there.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from pytest_eagle3.worker.draft_recorder import PREFIX as DRAFT_PREFIX
from pytest_eagle3.worker.recorder_hook import ENABLED_FILE, FAULT_FILE, FAULTS
from pytest_eagle3.errors import Eagle3Error

if TYPE_CHECKING:
    import torch

MISSING_RANKS = (
    "per-rank recorder: ranks {missing} wrote nothing within {timeout:.0f} s (ranks with "
    "records: {present}); is the pytest-eagle3 SGLang plugin loaded in the workers "
    "(entry point group sglang.srt.plugins)? See the engine log"
)
NO_PREFILL = (
    "per-rank recorder: rank {rank} recorded no prefill rows of request {rid} ({n} forwards recorded, "
    "request ids seen: {seen})"
)
NOT_SERVED_BY_ANY = (
    "per-rank recorder: no DP rank recorded prefill rows of request {rid} (request ids each rank saw: {seen})"
)
UNEVEN = (
    "per-rank recorder: ranks recorded different numbers of forwards after {timeout:.0f} s: {counts}"
)


@dataclass(frozen=True)
class Record:
    """One forward as one TP rank saw it.

    Attributes:
        rank: TP rank.  seq: the worker's forward counter.  mode: SGLang forward
        mode name (``EXTEND``, ``DECODE``, ...).  aux: ``[tokens, K*H]`` float32.
        input_ids: ``[tokens]`` int64.  positions: ``[tokens]`` int64 or None.
        shard: this rank's ``(start, end)`` of the original vocabulary, or None.
        rids: the request ids of the forward's batch (``()``: not recorded, an
            SGLang without ``ForwardBatch.rids``).
        lens: rows of ``aux`` per request, in ``rids`` order.
        chunks: for one request's prefill rows joined over several forwards (a
            chunked prefill), the rows of each forward in order (``()``: one forward).
        parents: a speculative verify's token tree, per row: the row of its parent
            node within the same request's rows (-1: the root; -2: a node SGLang's
            tree links do not reach); ``()``: no tree recorded
            (:func:`tree_parents`).
        reference: the token sequence whose transformers reference holds these rows
            at their positions, where that is not the request's final sequence (a
            verify's tree nodes off the accepted path,
            :func:`pytest_eagle3.engine.verify_tree.verify_node_records`); ``()``: the
            final sequence.
    """

    rank: int
    seq: int
    mode: str
    aux: "torch.Tensor"
    input_ids: "torch.Tensor"
    positions: "torch.Tensor | None"
    shard: tuple[int, int] | None
    rids: tuple[str, ...] = ()
    lens: tuple[int, ...] = ()
    chunks: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    reference: tuple[int, ...] = ()

    def for_request(self, rid: str) -> "Record | None":
        """This forward's rows of request ``rid`` as a record of their own (None:
        ``rid`` is not in this forward)."""
        if rid not in self.rids or len(self.lens) != len(self.rids):
            return None
        i = self.rids.index(rid)
        start = sum(self.lens[:i])
        rows = slice(start, start + self.lens[i])
        pos = self.positions[rows] if self.positions is not None else None
        parents = self.parents[rows] if len(self.parents) == self.aux.shape[0] else ()
        return Record(self.rank, self.seq, self.mode, self.aux[rows], self.input_ids[rows], pos, self.shard,
                      (rid,), (self.lens[i],), parents=parents)


def prefill_records(records: Mapping[int, Sequence[Record]], rids: Sequence[str | None]
                    ) -> dict[int, list[Record]]:
    """Per rank, the prefill (``EXTEND``) rows of each request in ``rids``, in
    ``rids`` order: forwards of other requests (a health check's one-token
    generation, another client) are dropped, and a batch is split per request.

    Records without request ids (an SGLang whose ``ForwardBatch`` has no
    ``rids``) are kept in forward order, prefill forwards only.

    Raises:
        Eagle3Error: a rank recorded no prefill rows for one of ``rids``
            (:data:`NO_PREFILL`), naming the request and what the rank recorded.
    """
    out: dict[int, list[Record]] = {}
    for rank, recs in records.items():
        prefill = [r for r in recs if r.mode.startswith("EXTEND") or r.mode == "MIXED"]
        if not any(r.rids for r in prefill) or any(rid is None for rid in rids):
            out[rank] = list(prefill)
            continue
        mine = []
        for rid in rids:
            parts = [part for r in prefill if (part := r.for_request(str(rid))) is not None]
            if not parts:
                seen = sorted({x for r in recs for x in r.rids})
                raise Eagle3Error(NO_PREFILL.format(rank=rank, rid=rid, n=len(recs), seen=seen[:6]))
            mine.append(_joined(parts, rank, str(rid), chunks=True))  # chunked prefill: rows over several forwards
        out[rank] = mine
    return out


def served_requests(records: Mapping[int, Sequence[Record]], rids: Sequence[str]) -> dict[int, list[int]]:
    """Under attention DP: rank -> the indices (into ``rids``) of the requests whose
    prefill rows the rank recorded, i.e. the requests its DP rank served, in order.

    Raises:
        Eagle3Error: a request no rank recorded (:data:`NOT_SERVED_BY_ANY`).
    """
    out: dict[int, list[int]] = {}
    for rank, recs in records.items():
        held = {rid for r in recs if r.mode.startswith("EXTEND") or r.mode == "MIXED" for rid in r.rids}
        out[rank] = [i for i, rid in enumerate(rids) if str(rid) in held]
    for i, rid in enumerate(rids):
        if not any(i in mine for mine in out.values()):
            seen = {rank: sorted({x for r in recs for x in r.rids})[:4] for rank, recs in records.items()}
            raise Eagle3Error(NOT_SERVED_BY_ANY.format(rid=rid, seen=seen))
    return out


def _joined(parts: "list[Record]", rank: int, rid: str, *, chunks: bool = False) -> "Record":
    """One record of ``rid``'s rows over several forwards, in forward order
    (``chunks``: the rows of each forward kept in :attr:`Record.chunks`)."""
    if len(parts) == 1:
        return parts[0]
    import torch

    pos = [p.positions for p in parts]
    return Record(rank, parts[0].seq, parts[0].mode, torch.cat([p.aux for p in parts]),
                  torch.cat([p.input_ids for p in parts]),
                  torch.cat(pos) if all(x is not None for x in pos) else None, parts[0].shard,
                  (rid,), (sum(p.lens[0] for p in parts),),
                  tuple(p.lens[0] for p in parts) if chunks else ())


def decode_records(records: Mapping[int, Sequence[Record]], rids: Sequence[str | None]
                   ) -> dict[int, list[Record]]:
    """Per rank, the decode (``DECODE``) rows of each request in ``rids``, in ``rids``
    order, one row per decode forward (positions ``T .. T+d-1``), joined into one
    record per request; a request with no decode forward gets an empty record.
    ``{}`` when the records carry no request ids (nothing can be attributed)."""
    import torch

    out: dict[int, list[Record]] = {}
    for rank, recs in records.items():
        decode = [r for r in recs if r.mode == "DECODE"]
        if not any(r.rids for r in decode) or any(rid is None for rid in rids):
            return {}
        mine = []
        for rid in rids:
            parts = [part for r in decode if (part := r.for_request(str(rid))) is not None]
            if parts:
                mine.append(_joined(parts, rank, str(rid)))
            else:
                width = recs[0].aux.shape[1] if recs else 0
                mine.append(Record(rank, -1, "DECODE", torch.zeros(0, width), torch.zeros(0, dtype=torch.long),
                                   torch.zeros(0, dtype=torch.long), None, (str(rid),), (0,)))
        out[rank] = mine
    return out


def request_forwards(records: Mapping[int, Sequence[Record]], rids: Sequence[str | None]
                     ) -> dict[int, list[Record]]:
    """Per rank, every forward (prefill chunks, decode, verify) that holds rows of one
    of ``rids``, restricted to those rows, in forward order: what the ranks must
    agree on.  Records without request ids are kept whole."""
    wanted = [str(r) for r in rids if r is not None]
    out: dict[int, list[Record]] = {}
    for rank, recs in records.items():
        mine = []
        for r in recs:
            if not r.rids:
                mine.append(r)
                continue
            mine += [part for rid in wanted if (part := r.for_request(rid)) is not None]
        out[rank] = mine
    return out


def verified_rows(record: Record, sequence: Sequence[int]) -> list[int]:
    """Rows of a verify forward (``TARGET_VERIFY``, one request) whose input chain is
    the request's final token sequence: row ``k`` counts when the inputs of rows
    ``0 .. k`` are the tokens at their positions (a rejected draft token and
    everything after it are not the sequence the reference computes).  A record
    without positions gives ``[]``."""
    if record.positions is None:
        return []
    rows = []
    for k, (pos, tok) in enumerate(zip(record.positions.tolist(), record.input_ids.tolist())):
        if not 0 <= pos < len(sequence) or int(sequence[pos]) != int(tok):
            break
        rows.append(k)
    return rows


#: Seconds without a new record after which an uneven (DP attention) recording is read.
SETTLE_S = 1.0


class Recorder:
    """Controls one engine's recorder directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"<Recorder {self.directory}>"

    @contextmanager
    def recording(self, fault: Mapping[str, Any] | None = None) -> Iterator["Recorder"]:
        """Record every forward inside the block (earlier records are deleted).

        Args:
            fault: ``{"kind": one of FAULTS, "rank": r, "slot": s, ...}`` to make
                rank ``r`` record a deliberately wrong copy (self-tests only).

        Raises:
            ValueError: an unknown fault kind.
        """
        if fault is not None and fault.get("kind") not in FAULTS:
            raise ValueError(f"unknown fault {fault.get('kind')!r}; known: {', '.join(FAULTS)}")
        self.directory.mkdir(parents=True, exist_ok=True)
        for old in [*self.directory.glob("rank*"), *self.directory.glob(f"{DRAFT_PREFIX}*")]:
            shutil.rmtree(old, ignore_errors=True)
        fault_file = self.directory / FAULT_FILE
        if fault is not None:
            fault_file.write_text(json.dumps(dict(fault)))
        else:
            fault_file.unlink(missing_ok=True)
        enabled = self.directory / ENABLED_FILE
        enabled.touch()
        try:
            yield self
        finally:
            enabled.unlink(missing_ok=True)
            fault_file.unlink(missing_ok=True)

    def read(self, tp: int, *, timeout: float = 30.0, even: bool = True) -> dict[int, list[Record]]:
        """Every rank's records in forward order, once all ``tp`` ranks have written
        the same number of forwards; with ``even=False`` (attention DP: each DP rank
        records the forwards of the requests it served, and none of its idle ones),
        once every rank has written and no count changed for :data:`SETTLE_S`.

        Raises:
            Eagle3Error: a rank wrote nothing, or counts stay uneven, by ``timeout``.
        """
        deadline = time.monotonic() + timeout
        last: dict[int, int] = {}
        since = time.monotonic()
        while True:
            counts = {r: len(list((self.directory / f"rank{r}").glob("*.safetensors"))) for r in range(tp)}
            if counts != last:
                last, since = counts, time.monotonic()
            if all(counts.values()) and (len(set(counts.values())) == 1 if even
                                         else time.monotonic() - since >= SETTLE_S):
                break
            if time.monotonic() > deadline:
                missing = [r for r, n in counts.items() if n == 0]
                if missing:
                    present = [r for r, n in counts.items() if n]
                    raise Eagle3Error(MISSING_RANKS.format(missing=missing, timeout=timeout, present=present))
                raise Eagle3Error(UNEVEN.format(timeout=timeout, counts=counts))
            time.sleep(0.1)
        return {r: [_load(r, p) for p in sorted((self.directory / f"rank{r}").glob("*.safetensors"))]
                for r in range(tp)}


def _load(rank: int, path: Path) -> Record:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        names = set(fh.keys())
        aux = fh.get_tensor("aux").float()
        ids = fh.get_tensor("input_ids")
        pos = fh.get_tensor("positions") if "positions" in names else None
        links = ((fh.get_tensor("tree_next_token"), fh.get_tensor("tree_next_sibling"))
                 if {"tree_next_token", "tree_next_sibling"} <= names else None)
    shard = None
    if meta.get("shard"):
        start, end = meta["shard"].split(",")
        shard = (int(start), int(end))
    seq = int(path.name.split("-", 1)[0])
    rids = tuple(json.loads(meta.get("rids") or "[]"))
    lens = tuple(int(n) for n in json.loads(meta.get("lens") or "[]"))
    parents: tuple[int, ...] = ()
    if links is not None and links[0].shape[0] == len(lens) and all(n == links[0].shape[1] for n in lens):
        parents = tuple(p for first, sibling in zip(links[0].tolist(), links[1].tolist())
                        for p in tree_parents(first, sibling))
    return Record(rank, seq, meta.get("mode", "UNKNOWN"), aux, ids, pos, shard, rids, lens, parents=parents)


def tree_parents(first_child: Sequence[int], next_sibling: Sequence[int]) -> list[int]:
    """Each node's parent in one request's verify tree, from SGLang's links
    (``retrieve_next_token[p]``: node ``p``'s first child; ``retrieve_next_sibling[c]``:
    the next child of ``c``'s parent; -1: none): -1 for the root (node 0), -2 for a
    node the links never reach."""
    n = len(first_child)
    parent = [-2] * n
    if n:
        parent[0] = -1
    for p in range(n):
        child, hops = int(first_child[p]), 0
        while 0 <= child < n and hops < n:
            parent[child] = p
            child, hops = int(next_sibling[child]), hops + 1
    return parent
