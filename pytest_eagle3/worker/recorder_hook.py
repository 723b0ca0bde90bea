"""Per-rank recorder: runs inside every SGLang TP worker (never in the test process).

Installed by :mod:`pytest_eagle3.worker.sglang_hooks` when the hook set
``record`` is enabled.  It wraps the inner model's ``forward`` whose loop
captures (``$PYTEST_EAGLE3_RECORD_TARGET``, read from the installed model file by
:attr:`pytest_eagle3.sglang_source.model_code.ModelCode.capture_forward`, e.g.
``sglang.srt.models.gemma3_causal.Gemma3TextModel.forward``; default
``DeepseekV2Model.forward`` of ``srt/models/deepseek_v2.py``), which returns
``(hidden_states, aux)`` when captures are on (``aux`` a list of per-layer
tensors before 0.5.23 in DeepSeek, and in Gemma 3 and other files), with an *after* hook through SGLang's own
``HookRegistry`` (``srt/plugins/hook_registry.py``) and writes a copy of each
rank's packed aux hidden states to ``$PYTEST_EAGLE3_RECORD_DIR/rank<r>/``.
It observes: the tensor SGLang uses is never modified.

Recording is off unless the test process created ``<dir>/ENABLED``: a disabled
recorder costs one ``stat`` per forward.  ``<dir>/FAULT`` (JSON) makes the
recorder store a deliberately wrong copy, so the project's tests can prove each
per-rank check fires through the real path (:data:`FAULTS`).

Files: ``rank<r>/<seq:06d>-<mode>.safetensors`` with tensors ``aux``
``[tokens, K*H]`` (the worker's dtype), ``input_ids`` ``[tokens]`` int64,
``positions`` ``[tokens]`` int64, and metadata ``shard`` = this rank's
``"start,end"`` slice of the original vocabulary, ``rids`` = the JSON list of
the batch's request ids (``ForwardBatch.rids``) and ``lens`` = each request's
rows in ``aux`` (``extend_seq_lens_cpu``; one per request in decode), so the
test process attributes every row to its request.  A speculative verify
(``TARGET_VERIFY``) also stores its token tree's links as SGLang's verify walks
them, ``tree_next_token`` and ``tree_next_sibling`` ``[requests, draft tokens]``
int64 (``EagleVerifyInput.retrieve_next_token`` / ``retrieve_next_sibling``,
0.5.23 ``srt/speculative/eagle_info.py``: node ``p``'s first child, and the next
child of the same parent; -1 none), from which the test process finds each
node's root path.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any
from pytest_eagle3.worker import tbo_proof
from pytest_eagle3.worker.env import RECORD_DIR_ENV, RECORD_TARGET_ENV

ENABLED_FILE = "ENABLED"
FAULT_FILE = "FAULT"
TARGET = "sglang.srt.models.deepseek_v2.DeepseekV2Model.forward"
#: Set by the engine host to the architecture's capturing ``forward`` (dotted path).

#: Fault kinds a test may ask the recorder to apply to its copy on one rank:
#: ``unreduced-embedding``: slot ``slot`` keeps only the rows of tokens in this
#: rank's vocab shard, zeros elsewhere (a rank's embedding before the all-reduce);
#: ``partial-sum``: slot ``slot`` scaled by ``fraction`` (default 1/tp), a
#: residual whose all-reduce is missing.
FAULTS = ("unreduced-embedding", "partial-sum")

logger = logging.getLogger("pytest_eagle3.recorder")
_seq = 0


def tp_rank_and_size() -> tuple[int, int]:
    """This worker's TP rank and TP size (``srt/distributed/parallel_state.py``
    ``get_tp_group``; ``torch.distributed`` rank where that is missing)."""
    try:
        from sglang.srt.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        return int(group.rank_in_group), int(group.world_size)
    except (ImportError, AttributeError, AssertionError):
        import torch.distributed as dist

        return int(dist.get_rank()), int(dist.get_world_size())


def is_last_pp_stage() -> bool:
    """Whether this worker is on the last pipeline stage (always, without PP): the stage
    whose captures reach the draft (``srt/distributed/parallel_state.py`` ``get_pp_group``)."""
    try:
        from sglang.srt.distributed.parallel_state import get_pp_group

        return bool(get_pp_group().is_last_rank)
    except (ImportError, AttributeError, AssertionError, RuntimeError):  # no groups in this process: no PP
        return True


def _shard(model: Any) -> tuple[int, int] | None:
    indices = getattr(getattr(model, "embed_tokens", None), "shard_indices", None)
    if indices is None:
        return None
    return int(indices.org_vocab_start_index), int(indices.org_vocab_end_index)


def _apply_fault(aux: Any, fault: dict[str, Any], *, input_ids: Any, shard: tuple[int, int] | None,
                 tp: int, hidden: int) -> Any:
    kind = fault.get("kind")
    slot = int(fault.get("slot", 0))
    cols = slice(slot * hidden, (slot + 1) * hidden)
    aux = aux.clone()
    if kind == "unreduced-embedding":
        if shard is None:
            raise RuntimeError("pytest-eagle3 recorder: no vocab shard on this model for the fault")
        outside = (input_ids < shard[0]) | (input_ids >= shard[1])
        aux[outside, cols] = 0
    elif kind == "partial-sum":
        aux[:, cols] = aux[:, cols] * float(fault.get("fraction", 1.0 / tp))
    else:
        raise RuntimeError(f"pytest-eagle3 recorder: unknown fault {kind!r}; known: {FAULTS}")
    return aux


def _after_forward(result: Any, model: Any, input_ids: Any = None, positions: Any = None,
                   forward_batch: Any = None, *args: Any, **kwargs: Any) -> None:
    global _seq
    root = os.environ.get(RECORD_DIR_ENV)
    if not root or not os.path.exists(os.path.join(root, ENABLED_FILE)):
        return None
    if not (isinstance(result, tuple) and len(result) == 2):
        return None
    aux = result[1]
    if isinstance(aux, (list, tuple)):
        # Releases before 0.5.23 return one [tokens, H] tensor per captured
        # layer; the logits processor concatenates them (0.5.9 deepseek_v2.py).
        if not aux:
            return None
        import torch

        aux = torch.cat(list(aux), dim=-1)
    mode = getattr(getattr(forward_batch, "forward_mode", None), "name", "UNKNOWN")
    if mode == "IDLE" or aux is None or aux.shape[0] == 0:
        return None
    if input_ids is None:
        input_ids = kwargs.get("input_ids")
    if input_ids is None:
        # A multimodal wrapper calls its language model with input embeddings and no ids
        # (0.5.23 srt/managers/mm_utils.py general_mm_embed_routine): the batch holds them.
        input_ids = getattr(forward_batch, "input_ids", None)
    if positions is None:
        positions = kwargs.get("positions")
    if input_ids is None:
        logger.warning("pytest-eagle3 recorder: a %s forward without input ids; not recorded", mode)
        return None
    rank, tp = tp_rank_and_size()
    shard = _shard(model)
    import torch
    from safetensors.torch import save_file

    copy = aux.detach().to("cpu").contiguous()
    ids = input_ids.detach().to("cpu").to(torch.int64).contiguous()
    fault_path = Path(root) / FAULT_FILE
    if fault_path.exists():
        fault = json.loads(fault_path.read_text())
        if int(fault.get("rank", 0)) == rank:
            hidden = int(getattr(getattr(model, "config", None), "hidden_size", 0)) or copy.shape[1]
            copy = _apply_fault(copy, fault, input_ids=ids, shard=shard, tp=tp, hidden=hidden)
    out = Path(root) / f"rank{rank}"
    out.mkdir(parents=True, exist_ok=True)
    _seq += 1
    tensors = {"aux": copy, "input_ids": ids}
    if positions is not None:
        if positions.dim() > 1:
            # M-RoPE (Qwen2.5-VL, Qwen3-VL, Qwen3.5): [sections, tokens]; a text token's
            # sections are equal, the first is its position.
            positions = positions[0]
        tensors["positions"] = positions.detach().to("cpu").to(torch.int64).contiguous()
    rids = list(getattr(forward_batch, "rids", None) or [])
    if mode == "TARGET_VERIFY":
        tensors.update(tree_links(getattr(forward_batch, "spec_info", None), len(rids)))
    lens = getattr(forward_batch, "extend_seq_lens_cpu", None) if mode.startswith("EXTEND") else None
    if rids and lens is None:
        lens = [copy.shape[0] // len(rids)] * len(rids)
    meta = {"mode": mode, "rank": str(rank), "tp": str(tp),
            "shard": "" if shard is None else f"{shard[0]},{shard[1]}",
            "rids": json.dumps([str(r) for r in rids]), "lens": json.dumps([int(n) for n in (lens or [])])}
    tmp = out / f".{_seq:06d}.{os.getpid()}.tmp"
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, out / f"{_seq:06d}-{mode}.safetensors")
    return None


def tree_links(spec_info: Any, requests: int) -> dict[str, Any]:
    """A verify's tree links (``tree_next_token``, ``tree_next_sibling``: ``[requests, n]``
    int64) from SGLang's ``EagleVerifyInput``; ``{}`` where it has none of that shape."""
    first = getattr(spec_info, "retrieve_next_token", None)
    sibling = getattr(spec_info, "retrieve_next_sibling", None)
    if first is None or sibling is None or requests == 0:
        return {}
    import torch

    first, sibling = first.detach().to("cpu").to(torch.int64), sibling.detach().to("cpu").to(torch.int64)
    if first.shape != sibling.shape or first.numel() % requests:
        return {}
    return {"tree_next_token": first.reshape(requests, -1).contiguous(),
            "tree_next_sibling": sibling.reshape(requests, -1).contiguous()}


def install() -> None:
    """Register the after-hook with SGLang's HookRegistry (applied by ``load_plugins``),
    and the two-batch overlap proof's before-hook (:mod:`pytest_eagle3.worker.tbo_proof`).

    Where the registry is missing (releases before 0.5.11), wrap the class
    attribute directly.
    """
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        HookRegistry = None  # type: ignore[assignment]
    target = os.environ.get(RECORD_TARGET_ENV) or TARGET
    if HookRegistry is not None:
        HookRegistry.register(target, _after_forward, HookType.AFTER)
        tbo_proof.install(target)
        return
    import functools
    import importlib

    module_name, class_name, _ = target.rsplit(".", 2)
    cls = getattr(importlib.import_module(module_name), class_name)
    original = cls.forward

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _after_forward(result, self, *args, **kwargs)
        return result

    cls.forward = forward
