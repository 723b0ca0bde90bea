"""Aux capture under two-batch overlap (TBO), fixed inside SGLang's processes.

The upstream fix ``tbo-capture-per-microbatch`` of
:mod:`pytest_eagle3.worker.upstream_fixes`, following the proposal of SGLang PR
#32680 (closed unmerged): each micro-batch captures its layers over its own
token rows, and the two are merged in token order.

What 0.5.23 does (``srt/models/deepseek_v2.py``): under TBO,
``DeepseekV2Model.forward`` runs only the layers before ``first_k_dense_replace``
itself, each handed the packer (``captured_last_layer_outputs=``, line 3193);
the rest run through ``model_forward_stages(..., enable_tbo=True)`` (line 3203),
whose operations (``DeepseekV2DecoderLayer.op_comm_prepare_attn``, line 2863)
call ``attn_boundary.prepare`` without a capture, and whose micro-batches carry no
aux buffer (``srt/batch_overlap/two_batch_overlap.py:858``).  The packer is then
short and its ``finalize`` raises ("captured 1 of 3 aux hidden states",
``srt/layers/aux_hidden_states.py:87``).

The fix, for one ``DeepseekV2Model.forward`` that runs TBO with ids at or after
``first_k_dense_replace``:

1. ``op_comm_prepare_attn`` of a layer whose id is asked for passes SGLang's own
   collector (``AuxHiddenStateList``) to ``attn_boundary.prepare`` as
   ``capture_gathered``, as ``DeepseekV2DecoderLayer.forward`` does (line 2810), so
   each micro-batch captures the residual stream its own rows formed;
2. after ``model_forward_stages`` returns, each layer's two captures are merged
   in token order over the micro-batches' ``tbo_parent_token_range`` (their
   padding rows dropped), as SGLang merges their hidden states
   (``_model_forward_tbo_merge_key``), and appended to the forward's packer after
   the layers it already holds, so its slots stay in layer order.

Imported inside SGLang's processes only where the fix, or one of the faults on its
merge (:data:`MERGE_FAULTS`, applied where the fix runs), is asked for.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from typing import Any, Callable

from pytest_eagle3.worker.faults import NEEDS_TBO

MODEL_FORWARD = "sglang.srt.models.deepseek_v2.DeepseekV2Model.forward"
PREPARE_ATTN = "sglang.srt.models.deepseek_v2.DeepseekV2DecoderLayer.op_comm_prepare_attn"
#: Logged once per process at the fix's first merge: the proof, in the engine log, that it ran.
MERGED_LINE = ("pytest-eagle3 TBO capture: layers {layers} captured per micro-batch ({a} + {b} tokens) and "
               "merged in token order (pid {pid})")
#: The fault kinds of :mod:`pytest_eagle3.worker.faults` the merge applies (self-test kinds).
MERGE_FAULTS = NEEDS_TBO
#: The one of them this process runs, set by :mod:`pytest_eagle3.worker.fault_injection`.
MERGE_FAULT: list[str | None] = [None]

logger = logging.getLogger("pytest_eagle3.tbo_capture")
_state = threading.local()
_logged: set[str] = set()


def _active() -> dict | None:
    return getattr(_state, "capture", None)


def around_prepare_attn(original: Callable, layer: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``op_comm_prepare_attn``: an asked-for layer's micro-batch captures its rows."""
    active = _active()
    index = kwargs.get("tbo_subbatch_index", args[4] if len(args) > 4 else None)
    if active is None or index is None or layer.layer_id not in active["ids"]:
        return original(layer, state, *args, **kwargs)
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStateList

    boundary = layer.attn_boundary
    collector = AuxHiddenStateList()
    real_prepare = boundary.prepare

    def prepare(hidden_states: Any, forward_batch: Any, **kw: Any) -> Any:
        return real_prepare(hidden_states, forward_batch, capture_gathered=collector, **kw)

    boundary.prepare = prepare
    try:
        out = original(layer, state, *args, **kwargs)
    finally:
        del boundary.prepare
    active["rows"][(layer.layer_id, int(index))] = collector[0]
    return out


def merge(parts: list[tuple[Any, tuple[int, int]]], rows: int, fault: str | None = None) -> Any:
    """One layer's capture over the parent batch's ``rows`` tokens from the micro-batches'
    ``(capture [padded, H], (start, end))``, each micro-batch's rows at its token range
    (its padding rows dropped).

    ``fault`` (one of :data:`MERGE_FAULTS`) misplaces them on purpose: the second
    micro-batch's rows left as zeros, or the micro-batches concatenated in reverse order."""
    import torch

    first = parts[0][0]
    out = torch.zeros((rows, *first.shape[1:]), dtype=first.dtype, device=first.device)
    valid = [(value[:max(0, min(end - start, value.shape[0]))], start) for value, (start, end) in parts]
    if fault == "tbo-microbatches-swapped":
        merged = torch.cat([value for value, _ in reversed(valid)])
        start = min(start for _, start in valid)
        out[start:start + merged.shape[0]] = merged
        return out
    for i, (value, start) in enumerate(valid):
        if fault == "tbo-microbatch-dropped" and i == 1:
            continue
        out[start:start + value.shape[0]] = value
    return out


def around_model_forward(original: Callable, model: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``DeepseekV2Model.forward``: a TBO forward captures its split layers per micro-batch."""
    batch = kwargs.get("forward_batch", args[2] if len(args) > 2 else None)
    wanted = sorted(getattr(model, "layers_to_capture", None) or [])
    first_split = max(getattr(model, "first_k_dense_replace", 0), getattr(model, "start_layer", 0))
    split_ids = [i for i in wanted if first_split <= i < getattr(model, "end_layer", 0)]
    if batch is None or not getattr(batch, "can_run_tbo", False) or not split_ids:
        return original(model, *args, **kwargs)
    import sglang.srt.models.deepseek_v2 as dsv2

    real_stages, real_packer = dsv2.model_forward_stages, dsv2.AuxHiddenStatePacker
    packers: list[Any] = []

    class _Recording(real_packer):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            packers.append(self)

    def stages(*a: Any, **k: Any) -> Any:
        bound = inspect.signature(real_stages).bind(*a, **k).arguments
        active = {"ids": set(split_ids), "rows": {}}
        _state.capture = active
        try:
            hidden = real_stages(*a, **k)
        finally:
            _state.capture = None
        children = list(bound["forward_batch"].tbo_children)
        ranges = [tuple(child.tbo_parent_token_range) for child in children]
        for layer_id in split_ids:
            parts = [(active["rows"][(layer_id, i)], ranges[i]) for i in range(len(children))]
            packers[-1].append(merge(parts, int(bound["hidden_states"].shape[0]), MERGE_FAULT[0]))
        _log_once(split_ids, ranges)
        return hidden

    dsv2.model_forward_stages, dsv2.AuxHiddenStatePacker = stages, _Recording
    try:
        return original(model, *args, **kwargs)
    finally:
        dsv2.model_forward_stages, dsv2.AuxHiddenStatePacker = real_stages, real_packer


def _log_once(ids: list[int], ranges: list[tuple[int, int]]) -> None:
    if "merged" in _logged:
        return
    _logged.add("merged")
    (s0, t0), (s1, t1) = ranges
    logger.warning(MERGED_LINE.format(layers=ids, a=t0 - s0, b=t1 - s1, pid=os.getpid()))


def install() -> None:
    """Register the fix with SGLang's ``HookRegistry``."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(MODEL_FORWARD, around_model_forward, HookType.AROUND)
    HookRegistry.register(PREPARE_ATTN, around_prepare_attn, HookType.AROUND)
