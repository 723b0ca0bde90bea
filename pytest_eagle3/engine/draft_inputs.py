"""Test-process side of the draft's input recorder: what the EAGLE draft was fed.

The worker side is :mod:`pytest_eagle3.worker.draft_recorder`: each TP rank's
draft extend forwards, with the aux hidden states and token ids the draft model
consumed, in ``draft<r>/`` of the engine's record directory (switched on with the
per-rank recorder, :class:`pytest_eagle3.engine.recordings.Recorder`).

:func:`fed_rows` keeps, per request, the rows the draft reads and says what each
must hold.  EAGLE's rule (SGLang 0.5.23 ``srt/speculative/eagle_worker_v2.py``):
the draft input at position ``p`` pairs the target's aux hidden states at ``p``
with the token at ``p + 1``:

* after a prefill (``EXTEND``): every prompt position, ids rotated by one; at
  the end of a prefill chunk that is not the prompt's last the token at ``p + 1``
  is the next prompt token (``_eagle_prefill_tail_tokens``, PR #26800 fixing
  #26329), at the prompt's end the target's first token;
* after a verify (``DRAFT_EXTEND_V2``): the first ``accept`` rows of the
  request's block of ``speculative_num_draft_tokens`` rows, the accepted path
  from the root at ``p0``, whose aux states SGLang moved to the block's front
  after a token-tree verify (``eagle_worker_common.py``
  ``_finalize_accept_tree_path``); the rows past ``accept`` are not read.  An
  older worker's ``DRAFT_EXTEND`` (0.5.12's v1 worker) hands over the accepted
  rows only, every one read.

So with the request's final tokens ``S`` every read row at position ``p`` must
hold ``S[p + 1]`` and the aux states of ``S`` at ``p``, whatever the forward.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from pytest_eagle3.worker.draft_recorder import PREFIX

if TYPE_CHECKING:
    import torch

PREFILL = "prefill"
AFTER_VERIFY = "after-verify"


@dataclass(frozen=True)
class DraftFeed:
    """The rows one draft extend forward fed the draft for one request.

    Attributes:
        rank: TP rank.  seq: the worker's draft-forward counter.  rid: request id.
        kind: :data:`PREFILL` (after a prefill chunk) or :data:`AFTER_VERIFY`.
        aux: ``[rows, K*H]`` float32, the aux hidden states the draft read.
        input_ids: ``[rows]`` int64, the tokens it read beside them.
        positions: ``[rows]`` int64.
        chunk_end: for a prefill chunk that is not the prompt's last, the position of
            its last row (where the #26800 rule applies); -1 otherwise.
    """

    rank: int
    seq: int
    rid: str
    kind: str
    aux: "torch.Tensor"
    input_ids: "torch.Tensor"
    positions: "torch.Tensor"
    chunk_end: int = -1


def read_draft_inputs(directory: Path, tp: int) -> dict[int, list[dict]]:
    """Every rank's recorded draft extend forwards, in forward order, as raw dicts
    (``mode``, ``rids``, ``lens``, ``aux``, ``input_ids``, ``positions``, ``accept``);
    ``{}`` for a rank that recorded none."""
    from safetensors import safe_open

    out: dict[int, list[dict]] = {}
    for rank in range(tp):
        forwards = []
        for path in sorted((Path(directory) / f"{PREFIX}{rank}").glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
                item = {name: fh.get_tensor(name) for name in fh.keys()}
            item["aux"] = item["aux"].float()
            item.update(mode=meta.get("mode", ""), seq=int(path.name.split("-", 1)[0]),
                        rids=json.loads(meta.get("rids") or "[]"), lens=json.loads(meta.get("lens") or "[]"))
            forwards.append(item)
        out[rank] = forwards
    return out


def fed_rows(forwards: Mapping[int, Sequence[dict]], prompts: Mapping[str, Sequence[int]],
             sequences: Mapping[str, Sequence[int]]) -> dict[int, list[DraftFeed]]:
    """Per rank, the rows each draft extend forward fed the draft for each request of
    ``sequences`` (rid -> final tokens; ``prompts``: rid -> its prompt), in forward
    order.  Rows whose position has no next token in the final sequence (the last
    step's overshoot) are left out."""
    out: dict[int, list[DraftFeed]] = {}
    for rank, items in forwards.items():
        mine = []
        for item in items:
            rids, lens = [str(r) for r in item["rids"]], [int(n) for n in item["lens"]]
            if not rids or len(lens) != len(rids) or "positions" not in item:
                continue
            # After a prefill the draft runner's mode is EXTEND; after a verify DRAFT_EXTEND(_V2).
            after_verify = item["mode"] != "EXTEND"
            start = 0
            for i, (rid, n) in enumerate(zip(rids, lens)):
                rows = slice(start, start + n)
                start += n
                if rid not in sequences:
                    continue
                # The v2 worker pads each request's block to the tree width and reads its first
                # ``accept`` rows; a worker without that count hands over the read rows only.
                read = int(item["accept"][i]) if "accept" in item else n
                pos = item["positions"][rows][:read]
                keep = pos + 1 < len(sequences[rid])
                if not bool(keep.any()):
                    continue
                last = int(pos[-1])
                chunk_end = last if not after_verify and last + 1 < len(prompts[rid]) else -1
                mine.append(DraftFeed(rank, int(item["seq"]), rid, AFTER_VERIFY if after_verify else PREFILL,
                                      item["aux"][rows][:read][keep], item["input_ids"][rows][:read][keep],
                                      pos[keep], chunk_end))
        out[rank] = mine
    return out
