"""Pipeline-parallel aux capture, lifted and fixed inside SGLang's processes.

Two upstream fixes of :mod:`pytest_eagle3.worker.upstream_fixes` live here:

``pp-capture-gate-lifted`` lifts SGLang's two PP checks on EAGLE-3, as the
open upstream PRs that loosen the PP gates would (SGLang #39378, #39602,
#38698): the capture-only mode's (``handle_aux_hidden_state_capture``,
``srt/arg_groups/validation_hook.py:725`` on 0.5.23: "only supports pp_size ==
1") runs on a view of the server args whose ``pp_size`` reads 1, and
``check_pipeline_parallel_compat`` (``:132``, "only supports EAGLE") on one
whose ``speculative_algorithm`` reads ``EAGLE`` for ``EAGLE3``, so EAGLE-3 meets
the checks EAGLE meets (SGLang's PP speculative relay, ``SGLANG_ENABLE_PP_SPEC``,
included); every other check and the engine see the real values.  Behind
them, SGLang's own capture path runs unchanged: only the last stage captures
(``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` returns at once on
every other stage, ``srt/models/deepseek_v2.py:3459``; SGLang issue #39634).

``pp-capture-relay`` is those lifts plus a minimal fix, in three parts:

1. every stage learns the ids: ``set_eagle3_layers_to_capture`` runs SGLang's
   own rule on a non-last stage too (its ``pp_group`` read as the last rank),
   which sets the inner model's ``layers_to_capture`` and leaves
   ``capture_aux_hidden_states`` off there, as the stage returns proxy tensors;
2. each stage captures the ids among its own layers
   (``start_layer <= id < end_layer``) through SGLang's own packer, and the
   stage's captures travel to the next stage with the hidden states, in the
   proxy tensors under :data:`STAGE_KEY` (``[tokens, k * H]``, the earlier
   stages' columns first, so the last stage's ``[tokens, K * H]`` holds the
   slots in layer order, as at PP 1);
3. the per-request return travels back: the last stage's
   ``logits_output.hidden_states`` rides in the output tensors the ring sends
   to the first stage (:data:`RETURN_KEY`; SGLang sends none, "Do not send
   logits and hidden states because they are large",
   ``srt/managers/utils.py`` ``get_logprob_from_pp_outputs``), where the
   stage that answers the request reads it; without this a request with
   ``return_hidden_states`` fails on stage 0 at
   ``srt/managers/scheduler_components/batch_result_processor.py:331``.

Written against 0.5.23's DeepSeek file (the packer, ``AuxHiddenStatePacker``)
and ``SchedulerPPMixin``, for eager forwards: the relayed rows have no CUDA-graph
buffer, so an engine at PP under the relay runs without CUDA graphs
(:func:`pytest_eagle3.engine.config.build_engine_config`).  Imported inside SGLang's processes only where a PP fix
or the fault ``pp-earlier-stage-zeroed`` is asked for (:func:`around_send_proxy_zeroed`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

#: The capture-only mode's argument check and the PP check that refuses EAGLE-3 (lifted),
#: and the DeepSeek entry points (fixed).
CAPTURE_CHECK = "sglang.srt.arg_groups.validation_hook.handle_aux_hidden_state_capture"
PP_CHECK = "sglang.srt.arg_groups.validation_hook.check_pipeline_parallel_compat"
SET_LAYERS = "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"
STAGE_FORWARD = "sglang.srt.models.deepseek_v2.DeepseekV2Model.forward"
PREPARE_OUTPUTS = "sglang.srt.managers.scheduler_pp_mixin.SchedulerPPMixin._pp_prepare_tensor_dict"
PREP_RESULT = "sglang.srt.managers.scheduler_pp_mixin.SchedulerPPMixin._pp_prep_batch_result"
#: Where a stage sends its proxy tensors to the next (the ``pp-earlier-stage-zeroed`` fault's place).
SEND_PROXY = "sglang.srt.managers.scheduler_pp_mixin.SchedulerPPMixin._pp_send_proxy_to_next_stage"
#: Proxy-tensor key of the earlier stages' captures, ``[tokens, k * H]``.
STAGE_KEY = "pytest_eagle3_aux_hidden_states"
#: Output-tensor key of the last stage's per-request hidden states.
RETURN_KEY = "pytest_eagle3_return_hidden_states"
#: Output-tensor key of each request's prefill rows in them (a list; SGLang sends it only with logprobs).
RETURN_LENS_KEY = "pytest_eagle3_extend_input_len_per_req"
#: Logged once per process at the relay's first capture (the e2e test reads it back).
RELAY_LINE = "pytest-eagle3 pp relay: stage {stage} of {stages} captured layers {layers} (pid {pid})"

logger = logging.getLogger("pytest_eagle3.pp_relay")
_logged: set[int] = set()


class _PpSizeOne:
    """A view of SGLang's server args whose ``pp_size`` reads 1 (writes pass through)."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        return 1 if name == "pp_size" else getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


class _Eagle3AsEagle:
    """A view of SGLang's resolved config whose ``speculative_algorithm`` reads ``EAGLE``
    where it is ``EAGLE3`` (reads only; everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name == "speculative_algorithm" and isinstance(value, str) and value.upper() == "EAGLE3":
            return "EAGLE"
        return value


def around_pp_check(original: Callable, cfg: Any) -> Any:
    """AROUND ``check_pipeline_parallel_compat``: EAGLE-3 meets the checks EAGLE meets
    (0.5.23 ``validation_hook.py:132`` accepts only EAGLE; its PP speculative relay,
    ``SGLANG_ENABLE_PP_SPEC``, and the other checks apply unchanged)."""
    return original(_Eagle3AsEagle(cfg))


def around_capture_check(original: Callable, server_args: Any) -> Any:
    """AROUND ``handle_aux_hidden_state_capture``: its checks on a view with ``pp_size`` 1."""
    import sglang.srt.arg_groups.validation_hook as vh

    real_view = vh.resolving_view
    vh.resolving_view = lambda args: _PpSizeOne(real_view(args))
    try:
        return original(server_args)
    finally:
        vh.resolving_view = real_view


class _LastRankView:
    """A ``pp_group`` that reads as the last rank (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    is_last_rank = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def around_set_layers(original: Callable, model: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``set_eagle3_layers_to_capture``: SGLang's own rule on every stage."""
    group = model.pp_group
    if group.is_last_rank:
        return original(model, *args, **kwargs)
    model.pp_group = _LastRankView(group)
    try:
        return original(model, *args, **kwargs)
    finally:
        model.pp_group = group
        model.capture_aux_hidden_states = False  # this stage returns proxy tensors, not captures


def stage_ids(layers_to_capture: list[int], start: int, end: int, *, first: bool = False,
              last: bool = False) -> list[int]:
    """The ids this stage's layers capture: ``start <= id < end`` (id ``i`` is layer ``i``'s
    input).  An id outside every stage stays with the first (below 0) or the last stage
    (``L`` and above), whose packer then falls short as SGLang's does at PP 1."""
    return [i for i in layers_to_capture if (first or start <= i) and (last or i < end)]


def merge(earlier: Any, own: Any) -> Any:
    """``[tokens, a * H]`` and ``[tokens, b * H]`` -> ``[tokens, (a + b) * H]``, earlier columns first
    (either may be ``None``)."""
    if earlier is None:
        return own
    if own is None:
        return earlier
    import torch

    return torch.cat([earlier, own], dim=-1)


def around_stage_forward(original: Callable, model: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``DeepseekV2Model.forward``: the stage captures its own layers and relays them."""
    group = model.pp_group
    wanted = list(getattr(model, "layers_to_capture", None) or [])
    if not wanted or (group.is_first_rank and group.is_last_rank):
        return original(model, *args, **kwargs)
    proxy = kwargs.get("pp_proxy_tensors", args[4] if len(args) > 4 else None)
    earlier = None if proxy is None else proxy.tensors.get(STAGE_KEY)
    own_ids = stage_ids(wanted, model.start_layer, model.end_layer, first=group.is_first_rank,
                        last=group.is_last_rank)
    model.layers_to_capture = own_ids  # SGLang's packer is sized by this list
    try:
        if group.is_last_rank:
            out = original(model, *args, **kwargs)
        else:
            out, own = _with_recorded_packer(original, model, bool(own_ids), *args, **kwargs)
    finally:
        model.layers_to_capture = wanted
    _log_once(group, own_ids)
    if not group.is_last_rank:
        rows = merge(earlier, own)
        if rows is not None:
            out.tensors[STAGE_KEY] = rows
        return out
    if isinstance(out, tuple):
        hidden, own = out
        return hidden, merge(earlier, own)
    if earlier is None:  # SGLang's caller unpacks (hidden, aux): fail as its packer does
        raise RuntimeError(f"captured 0 of {len(wanted)} aux hidden states (pytest-eagle3 pp relay: none "
                           f"arrived from earlier stages, none on this stage's layers)")
    return out, earlier


def _with_recorded_packer(original: Callable, model: Any, asked: bool, *args: Any,
                          **kwargs: Any) -> tuple[Any, Any]:
    """A non-last stage's forward, and the rows SGLang's packer collected in it (``None``: the
    stage was ``asked`` for none).  A packer short of what it was asked for raises as SGLang's
    ``finalize`` does ("captured n of k").

    The packer is local to the forward, which returns proxy tensors only; the
    module's ``AuxHiddenStatePacker`` is a recording subclass for the call."""
    import sglang.srt.models.deepseek_v2 as dsv2

    real = dsv2.AuxHiddenStatePacker
    made: list[Any] = []

    class _Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            made.append(self)

    dsv2.AuxHiddenStatePacker = _Recording
    try:
        out = original(model, *args, **kwargs)
    finally:
        dsv2.AuxHiddenStatePacker = real
    return out, (made[-1].finalize() if made and asked else None)


def _log_once(group: Any, ids: list[int]) -> None:
    stage = int(getattr(group, "rank_in_group", 0))
    if stage in _logged:
        return
    _logged.add(stage)
    logger.warning(RELAY_LINE.format(stage=stage, stages=int(getattr(group, "world_size", 0)), layers=ids,
                                     pid=os.getpid()))


def after_prepare_outputs(tensor_dict: dict[str, Any], scheduler: Any, result: Any, batch: Any,
                          *args: Any, **kwargs: Any) -> dict[str, Any]:
    """AFTER ``_pp_prepare_tensor_dict`` (last stage): the per-request hidden states ride along."""
    logits = getattr(result, "logits_output", None)
    hidden = getattr(logits, "hidden_states", None)
    if getattr(batch, "return_hidden_states", False) and hidden is not None:
        tensor_dict[RETURN_KEY] = hidden.contiguous()
        tensor_dict[RETURN_LENS_KEY] = getattr(result, "extend_input_len_per_req", None)
    return tensor_dict


def around_prep_result(original: Callable, scheduler: Any, batch: Any, mb_metadata: Any, pp_outputs: Any,
                       *args: Any, **kwargs: Any) -> Any:
    """AROUND ``_pp_prep_batch_result`` (earlier stages): the relayed hidden states in the result."""
    result = original(scheduler, batch, mb_metadata, pp_outputs, *args, **kwargs)
    hidden = pp_outputs.tensors.get(RETURN_KEY) if pp_outputs is not None else None
    if hidden is None or result is None:
        return result
    if result.logits_output is None:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        result.logits_output = LogitsProcessorOutput(next_token_logits=None)
    result.logits_output.hidden_states = hidden
    if getattr(result, "extend_input_len_per_req", None) is None:
        result.extend_input_len_per_req = pp_outputs.tensors.get(RETURN_LENS_KEY)
    return result


def around_send_proxy_zeroed(original: Callable, scheduler: Any, result: Any, *args: Any, **kwargs: Any) -> Any:
    """The fault ``pp-earlier-stage-zeroed`` (:mod:`pytest_eagle3.worker.fault_injection`): the
    relayed captures leave this stage as zeros; the hidden states and every other proxy tensor
    are sent as they are."""
    tensors = getattr(getattr(result, "pp_hidden_states_proxy_tensors", None), "tensors", None)
    if tensors is not None and tensors.get(STAGE_KEY) is not None:
        tensors[STAGE_KEY] = tensors[STAGE_KEY].new_zeros(tensors[STAGE_KEY].shape)
    return original(scheduler, result, *args, **kwargs)


def install(relay: bool) -> None:
    """Register the lift (and with ``relay`` the fix) with SGLang's ``HookRegistry``."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(CAPTURE_CHECK, around_capture_check, HookType.AROUND)
    HookRegistry.register(PP_CHECK, around_pp_check, HookType.AROUND)
    if not relay:
        return
    HookRegistry.register(SET_LAYERS, around_set_layers, HookType.AROUND)
    HookRegistry.register(STAGE_FORWARD, around_stage_forward, HookType.AROUND)
    HookRegistry.register(PREPARE_OUTPUTS, after_prepare_outputs, HookType.AFTER)
    HookRegistry.register(PREP_RESULT, around_prep_result, HookType.AROUND)
