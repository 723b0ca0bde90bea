"""Test-process side of the per-rank recorder: switch it on, read what each rank wrote.

The worker side is :mod:`pytest_eagle3.engine.recorder_hook`; the two share a
directory (``EnginePool.record_dir``) and the file names defined there.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from pytest_eagle3.engine.recorder_hook import ENABLED_FILE, FAULT_FILE, FAULTS
from pytest_eagle3.errors import Eagle3Error

if TYPE_CHECKING:
    import torch

MISSING_RANKS = (
    "per-rank recorder: ranks {missing} wrote nothing within {timeout:.0f} s (ranks with "
    "records: {present}); is the pytest-eagle3 SGLang plugin loaded in the workers "
    "(entry point group sglang.srt.plugins)? See the engine log"
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
    """

    rank: int
    seq: int
    mode: str
    aux: "torch.Tensor"
    input_ids: "torch.Tensor"
    positions: "torch.Tensor | None"
    shard: tuple[int, int] | None


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
        for old in self.directory.glob("rank*"):
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

    def read(self, tp: int, *, timeout: float = 30.0) -> dict[int, list[Record]]:
        """Every rank's records in forward order, once all ``tp`` ranks have written
        the same number of forwards.

        Raises:
            Eagle3Error: a rank wrote nothing, or counts stay uneven, by ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            counts = {r: len(list((self.directory / f"rank{r}").glob("*.safetensors"))) for r in range(tp)}
            if all(counts.values()) and len(set(counts.values())) == 1:
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
    shard = None
    if meta.get("shard"):
        start, end = meta["shard"].split(",")
        shard = (int(start), int(end))
    seq = int(path.name.split("-", 1)[0])
    return Record(rank, seq, meta.get("mode", "UNKNOWN"), aux, ids, pos, shard)
