"""Proof, from inside every TP worker, of which reduce-scatters SGLang ran in each forward.

SGLang's decoder layer completes a tensor-parallel sum in a reduce-scatter
instead of an all-reduce on two routes (0.5.23):

* attention DP: an MoE output gathered over the DP ranks comes back to each
  rank's tokens through ``dp_reduce_scatter`` (``srt/layers/layer_boundary/ops.py``)
  when the batch is padded to the max length (``exit.py``
  ``_select_dp_reduce_scatter``: ``dp_padding_mode.is_max_len()`` and
  ``can_use_dp_reduce_scatter()``), which ``DpPaddingMode.get_dp_padding_mode``
  picks for decode (``srt/layers/dp_attention.py:165-205``);
* input-scattered attention (``--enable-attn-tp-input-scattered``): an extend
  batch's FFN output is summed onto each rank's slice of the rows through
  ``tp_reduce_scatter`` (``ops.py``, from ``residual_slice_output``).

Every route ends in the TP group's ``GroupCoordinator.reduce_scatter_tensor``
or ``reduce_scatterv`` (``srt/distributed/parallel_state.py``).  This module
wraps those two methods with an observer that calls the original unchanged and
notes, for the forward in progress, the SGLang function that asked for it (the
innermost frame in ``srt/layers/layer_boundary/``, else in
``srt/layers/dp_attention.py``) and the decoder layer running it (a forward
pre-hook on each of the capturing model's ``layers``).  After each forward of
the capturing model (the recorder's target) it logs :data:`PROOF_LINE`: the
forward's order in this process, its mode and token count, the rows of the
aux hidden states it returned, the batch's attention-DP padding mode and the DP
ranks' token counts it was chosen from, and every reduce-scatter with its layers,
``none`` when there was none.  :mod:`pytest_eagle3.engine.route_proof` reads the lines.

Active only where the engine host set :data:`pytest_eagle3.worker.env.ROUTE_PROOF_ENV`
(engines of a variant with a reduce-scatter route); it only reads.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

from pytest_eagle3.worker.post_import import when_imported

logger = logging.getLogger("pytest_eagle3.reduce_scatter_proof")

PROOF_LINE = ("pytest-eagle3 reduce-scatter: TP rank {rank} forward {seq} {mode} of {tokens} token(s), "
              "DP padding {padding} over {global_tokens}, captured rows {rows}: {routes} (pid {pid})")
#: One route inside :data:`PROOF_LINE`: ``name (file:line) in layers 1,2,3``.
ROUTE_TEXT = "{name} ({where}) in layers {layers}"
PROOF = re.compile(r"pytest-eagle3 reduce-scatter: TP rank (?P<rank>-?\d+) forward (?P<seq>\d+) (?P<mode>\w+) of "
                   r"(?P<tokens>\d+) token\(s\), DP padding (?P<padding>[\w-]+) over (?P<global>[\d,]+|-), "
                   r"captured rows (?P<rows>\d+): (?P<routes>.*) \(pid (?P<pid>\d+)\)$",
                   re.MULTILINE)
ROUTE = re.compile(r"(?P<name>\w+) \((?P<where>[^)]*)\) in layers (?P<layers>[\d,?]+)")

#: The coordinator methods every reduce-scatter route ends in.
METHODS = ("reduce_scatter_tensor", "reduce_scatterv")

_state: dict[str, Any] = {"seq": 0, "layer": None, "calls": None, "hooked": set()}


def _where(frame: Any) -> tuple[str, str]:
    """(function name, ``srt/...:first line``) of ``frame``."""
    path = frame.f_code.co_filename.replace(os.sep, "/")
    cut = path.rfind("/sglang/")
    rel = path[cut + len("/sglang/"):] if cut >= 0 else path
    return frame.f_code.co_name, f"{rel}:{frame.f_code.co_firstlineno}"


def _caller() -> tuple[str, str]:
    """The SGLang step that asked for the reduce-scatter: the innermost frame in
    ``layer_boundary/``, else in ``dp_attention.py``, else the first frame
    outside ``parallel_state.py``."""
    frame = sys._getframe(2)
    fallback = None
    for _ in range(16):
        if frame is None:
            break
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/layer_boundary/" in path:
            return _where(frame)
        if fallback is None and "/dp_attention.py" in path:
            fallback = _where(frame)
        if fallback is None and "parallel_state.py" not in path and "reduce_scatter_proof" not in path:
            fallback = _where(frame)
        frame = frame.f_back
    return fallback or ("?", "?")


def _observe(method: str, original: Any) -> Any:
    def observed(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls = _state["calls"]
        if calls is not None:
            try:
                name, where = _caller()
                layers = calls.setdefault((name, where, method), [])
                layer = _state["layer"]
                if layer not in layers:
                    layers.append(layer)
            except Exception:  # noqa: BLE001 - an observer never breaks the forward it observes
                pass
        return original(self, *args, **kwargs)

    observed.__wrapped__ = original  # type: ignore[attr-defined]
    observed.__name__ = method
    return observed


def wrap_coordinator(module: Any) -> None:
    """Wrap :data:`METHODS` of ``module.GroupCoordinator`` (``srt/distributed/parallel_state.py``)."""
    cls = getattr(module, "GroupCoordinator", None)
    for method in METHODS:
        original = getattr(cls, method, None)
        if original is None or hasattr(original, "__wrapped__"):
            continue
        setattr(cls, method, _observe(method, original))


def _hook_layers(model: Any) -> None:
    layers = getattr(model, "layers", None)
    if layers is None or id(model) in _state["hooked"]:
        return
    _state["hooked"].add(id(model))
    start = int(getattr(model, "start_layer", 0) or 0)
    for index, layer in enumerate(layers):
        if not hasattr(layer, "register_forward_pre_hook"):
            continue
        number = getattr(layer, "layer_id", None)
        number = int(number) if isinstance(number, int) else start + index

        def pre(_module: Any, _inputs: Any, number: int = number) -> None:
            _state["layer"] = number

        layer.register_forward_pre_hook(pre)


def before_forward(model: Any, *args: Any, **kwargs: Any) -> None:
    """Start noting this forward's reduce-scatters.  Never raises."""
    try:
        _hook_layers(model)
    except Exception:  # noqa: BLE001
        pass
    _state["layer"] = None
    _state["calls"] = {}
    return None


def _tokens(args: tuple, kwargs: dict) -> int:
    ids = kwargs.get("input_ids", args[0] if args else None)
    shape = getattr(ids, "shape", None)
    return int(shape[0]) if shape else 0


def _captured_rows(result: Any) -> int:
    """Rows of the aux hidden states the forward returned (0: none)."""
    if not (isinstance(result, tuple) and len(result) == 2):
        return 0
    aux = result[1]
    if isinstance(aux, (list, tuple)):
        aux = aux[0] if aux else None
    shape = getattr(aux, "shape", None)
    return int(shape[0]) if shape else 0


def format_routes(calls: dict) -> str:
    if not calls:
        return "none"
    parts = []
    for (name, where, _method), layers in calls.items():
        text = ",".join("?" if x is None else str(x) for x in layers)
        parts.append(ROUTE_TEXT.format(name=name, where=where, layers=text))
    return "; ".join(parts)


def _padding(batch: Any) -> tuple[str, str]:
    """(``MAX_LEN`` / ``SUM_LEN`` / ``-``, the DP ranks' token counts ``3,0`` / ``-``) of
    ``batch``: ``ForwardBatch.dp_padding_mode`` and ``global_num_tokens_cpu``
    (``srt/model_executor/forward_batch_info.py`` ``prepare_mlp_sync_batch``, 0.5.23)."""
    mode = getattr(batch, "dp_padding_mode", None)
    name = getattr(mode, "name", None) or "-"
    counts = getattr(batch, "global_num_tokens_cpu", None)
    text = ",".join(str(int(x)) for x in counts) if counts else "-"
    return name, text


def after_forward(result: Any, model: Any, *args: Any, **kwargs: Any) -> None:
    """Log :data:`PROOF_LINE` for the forward that just ran.  Never raises."""
    calls, _state["calls"] = _state["calls"], None
    if calls is None:
        return None
    try:
        batch = kwargs.get("forward_batch", args[2] if len(args) > 2 else None)
        mode = getattr(getattr(batch, "forward_mode", None), "name", "UNKNOWN")
        padding, global_tokens = _padding(batch)
        _state["seq"] += 1
        logger.warning(PROOF_LINE.format(rank=_rank(), seq=_state["seq"], mode=mode, tokens=_tokens(args, kwargs),
                                         padding=padding, global_tokens=global_tokens, rows=_captured_rows(result),
                                         routes=format_routes(calls), pid=os.getpid()))
    except Exception:  # noqa: BLE001
        pass
    return None


def _rank() -> int:
    """This worker's TP rank (``runtime_context.get_parallel().tp_rank``, 0.5.23;
    the TP group's rank before it); -1 outside a worker."""
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_rank)
    except Exception:  # noqa: BLE001
        pass
    try:
        import warnings

        from sglang.srt.distributed.parallel_state import get_tp_group

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return int(get_tp_group().rank_in_group)
    except Exception:  # noqa: BLE001
        return -1


def install(target: str) -> bool:
    """Observe the coordinator's reduce-scatters and bracket each forward of ``target``.

    Returns False where SGLang has no ``HookRegistry`` (releases before 0.5.11)."""
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        return False
    when_imported("sglang.srt.distributed.parallel_state", wrap_coordinator)
    HookRegistry.register(target, before_forward, HookType.BEFORE)
    HookRegistry.register(target, after_forward, HookType.AFTER)
    return True
