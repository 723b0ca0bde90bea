"""Fault injection into SGLang's own capture path (worker side).

Runs inside every SGLang process, never in the test process.  Installed by
:mod:`pytest_eagle3.worker.sglang_hooks` when
:data:`~pytest_eagle3.worker.env.FAULT_ENV` names a fault of the catalog
(:mod:`pytest_eagle3.worker.faults`:
``PYTEST_EAGLE3_FAULT='{"kind": "partial-sum"}'``) and the engine was started
by pytest-eagle3 (its hook sets are on).  Without that variable nothing here is
imported: a normal run, and a production server, never see a fault.

Each fault changes the tensor SGLang itself captures, the way a public bug did,
so the packed aux hidden states that ``DeepseekV2Model.forward`` returns (which
the HTTP API, the speculative worker and the per-rank recorder all read) carry
the bug.  The hooks go through SGLang's own ``HookRegistry``
(``srt/plugins/hook_registry.py``) and are registered before the recorder's, so
the recorder's after-hook on ``DeepseekV2Model.forward`` wraps them and sees the
faulted tensor.  :data:`pytest_eagle3.worker.faults.CATALOG` lists every kind with the public report it
reproduces; the functions below say which SGLang function each one changes.

Options besides ``kind`` (``rank``, ``slots``, ``when``) are those of
:mod:`pytest_eagle3.worker.faults`; the confined kinds
(:data:`pytest_eagle3.worker.faults.CONFINED`) are a layer fault with ``when``.

SGLang 0.5.23 layout facts used here (``srt/models/deepseek_v2.py``):
``DeepseekV2Model.forward`` hands an ``AuxHiddenStatePacker`` to layer ``i``
when ``i in layers_to_capture``; the layer's attention boundary
(``attn_boundary.prepare``, ``srt/layers/layer_boundary/stage.py``) completes
the previous layer's MLP sum, adds the residual and writes the result into the
packer's next slot (the input of layer ``i`` = ``hs[i]``).  At the entry of
layer ``i > 0`` the forward's ``ResidualStream`` (``forward_batch.residual_stream``)
holds ``residual`` = the post-attention residual of layer ``i - 1`` and
``pending`` = that layer's MLP contribution, still unreduced at TP > 1.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from pytest_eagle3.worker.fault_when import forward_selection
from pytest_eagle3.worker.faults import CONFINED, FaultError, describe, read_fault
from pytest_eagle3.worker import dp_route, fault_reads, pp_relay, spec_faults, tbo_capture


logger = logging.getLogger("pytest_eagle3.faults")

_MODEL_CLS = "sglang.srt.models.deepseek_v2"
SET_LAYERS = f"{_MODEL_CLS}.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"
MODEL_FORWARD = f"{_MODEL_CLS}.DeepseekV2Model.forward"
LAYER_FORWARD = f"{_MODEL_CLS}.DeepseekV2DecoderLayer.forward"
PACKER_SLOT = "sglang.srt.layers.aux_hidden_states.AuxHiddenStatePacker.slot"
PACKER_APPEND = "sglang.srt.layers.aux_hidden_states.AuxHiddenStatePacker.append"
PACKER_FINALIZE = "sglang.srt.layers.aux_hidden_states.AuxHiddenStatePacker.finalize"
LIST_CAPTURE = "sglang.srt.layers.aux_hidden_states.AuxHiddenStateList.capture"


# --- worker-side state -------------------------------------------------------

_FAULT: dict[str, Any] | None = None
_CTX = threading.local()  # .model, .input_ids of the DeepseekV2Model.forward in progress
_logged: set[str] = set()


def _log_once(key: str, msg: str, *args: Any) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.warning("pytest-eagle3 FAULT " + msg, *args)


def _tp() -> tuple[int, int]:
    """(rank, size) in the TP group; (0, 1) when no group exists."""
    try:
        from sglang.srt.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        return int(group.rank_in_group), int(group.world_size)
    except Exception:  # noqa: BLE001 - no distributed state: a single process
        return 0, 1


def _writes_here(fault: dict[str, Any]) -> bool:
    """Whether this process writes the faulted capture: its TP size is among the
    fault's ``tp`` and its TP rank among its ``rank`` (each a value or a list;
    ``"last"``: TP size - 1; absent: any)."""
    here, size = _tp()
    sizes, ranks = fault.get("tp"), fault.get("rank")
    if sizes is not None and size not in [int(s) for s in (sizes if isinstance(sizes, list) else [sizes])]:
        return False
    if ranks is None:
        return True
    return here in [size - 1 if r == "last" else int(r) for r in (ranks if isinstance(ranks, list) else [ranks])]


# --- ids: DeepseekV2ForCausalLM.set_eagle3_layers_to_capture ----------------


def _after_set_layers(result: Any, model: Any, layer_ids: Any = None, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook: rewrite ``model.model.layers_to_capture`` as the id bug did."""
    fault = _FAULT
    inner = getattr(model, "model", None)
    if fault is None or inner is None or not getattr(model, "capture_aux_hidden_states", False):
        return None
    if layer_ids is None:
        layer_ids = kwargs.get("layer_ids")
    before = list(inner.layers_to_capture)
    kind = fault["kind"]
    if kind == "offset-twice":
        after = [v + 1 for v in before]
    elif kind == "offset-missing":
        after = [v - 1 for v in before]
    elif kind == "ids-ignored":
        L = int(model.config.num_hidden_layers)
        after = [2, L // 2, L - 3]
    else:
        return None
    inner.layers_to_capture = after
    _log_once(kind, "%s: layers_to_capture %s -> %s (ids %s)", kind, before, after, layer_ids)
    return None


# --- slot order: AuxHiddenStatePacker.slot ------------------------------------


def _around_packer_slot(original: Callable, packer: Any, like: Any, *args: Any, **kwargs: Any) -> Any:
    """reversed-order: capture ``k`` of ``K`` goes to slot ``K-1-k`` of the packed buffer."""
    view = original(packer, like, *args, **kwargs)
    if _FAULT is None or _FAULT["kind"] != "reversed-order" or not _writes_here(_FAULT):
        return view
    k, n, width = packer._idx - 1, packer._num_captures, packer._feature_size
    mirror = n - 1 - k
    _log_once("reversed-order", "reversed-order: capture %d written to slot %d of %d", k, mirror, n)
    return packer._buffer[..., mirror * width:(mirror + 1) * width]


# --- aliasing: AuxHiddenStatePacker.append / finalize, AuxHiddenStateList.capture


def _around_packer_append(original: Callable, packer: Any, hidden: Any, *args: Any, **kwargs: Any) -> Any:
    """aliased-capture: remember the tensor handed to the packer (its storage, not a copy)."""
    index = len(packer)
    result = original(packer, hidden, *args, **kwargs)
    if _writes_here(_FAULT):
        borrowed = packer.__dict__.setdefault("_eagle3_borrowed", [])
        borrowed.append((index, hidden))
    return result


def _around_packer_finalize(original: Callable, packer: Any, *args: Any, **kwargs: Any) -> Any:
    """aliased-capture: each slot <- what its borrowed storage holds now, at the end of the forward."""
    out = original(packer, *args, **kwargs)
    width = packer._feature_size
    for index, hidden in packer.__dict__.pop("_eagle3_borrowed", []):
        out[..., index * width:(index + 1) * width].copy_(hidden)
    _log_once("aliased-capture", "aliased-capture: packed slots read from the storage each capture was handed")
    return out


def _around_packer_finalize_half(original: Callable, packer: Any, *args: Any, **kwargs: Any) -> Any:
    """half-precision-copy: the packed captures rounded through float16 and back."""
    out = original(packer, *args, **kwargs)
    if _writes_here(_FAULT) and hasattr(out, "copy_"):
        import torch

        out.copy_(out.to(torch.float16).to(out.dtype))
        _log_once("half-precision-copy", "half-precision-copy: packed captures %s rounded through float16",
                  tuple(out.shape))
    return out


def _around_list_capture(original: Callable, captures: Any, hidden: Any, *args: Any, **kwargs: Any) -> Any:
    """aliased-capture on models that collect a list: adopt the storage (``owned=True``)."""
    if _writes_here(_FAULT):
        kwargs["owned"] = True
        _log_once("aliased-capture-list", "aliased-capture: AuxHiddenStateList.capture adopts borrowed storage")
    return original(captures, hidden, *args, **kwargs)


# --- per-forward context: DeepseekV2Model.forward ---------------------------


def _around_model_forward(original: Callable, model: Any, *args: Any, **kwargs: Any) -> Any:
    """``forward(self, input_ids, positions, forward_batch, ...)``: keeps the model
    and the input ids at hand for the layer hooks; rotates decode rows after."""
    _CTX.model = model
    _CTX.input_ids = args[0] if args else kwargs.get("input_ids")
    if _FAULT is not None:
        _CTX.active, _CTX.rows = forward_selection(_FAULT, args[2] if len(args) > 2 else kwargs.get("forward_batch"))
    try:
        result = original(model, *args, **kwargs)
    finally:
        _CTX.model = _CTX.input_ids = None
    if _FAULT is not None and _FAULT["kind"] == "wrong-request-rows":
        forward_batch = args[2] if len(args) > 2 else kwargs.get("forward_batch")
        _wrong_request_rows(result, forward_batch)
    return result


def _wrong_request_rows(result: Any, forward_batch: Any) -> None:
    """In a decode forward of ``n >= 2`` requests (one row each), row ``j`` <- row ``(j+1) % n``."""
    if not (isinstance(result, tuple) and len(result) == 2) or not _writes_here(_FAULT):
        return
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None or not mode.is_decode():
        return
    aux = result[1]
    n = int(aux.shape[0])
    if n < 2:
        return
    import torch

    order = torch.roll(torch.arange(n, device=aux.device), -1)
    aux.copy_(aux[order].clone())
    _log_once("wrong-request-rows", "wrong-request-rows: decode rows of %d requests rotated", n)


# --- layer-level faults: DeepseekV2DecoderLayer.forward ---------------------


def _packer_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    packer = kwargs.get("captured_last_layer_outputs")
    if packer is None and len(args) > 7:
        packer = args[7]
    return packer


def _forward_batch_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[2] if len(args) > 2 else kwargs.get("forward_batch")


def _completed_copy(pending: Any) -> Any:
    """The full (all-reduced) value of a pending contribution, computed on a copy:
    ``ResidualStream.snapshot`` without the residual.  A collective at TP > 1."""
    import msgspec

    from sglang.srt.layers.layer_boundary.output import UnreducedOutput
    from sglang.srt.layers.layer_boundary.residual.stream import DeclaredSum

    owed = pending.owed
    if owed is None:
        return pending.value.clone()
    if isinstance(owed, DeclaredSum):
        return owed.complete(pending.value.clone())
    if isinstance(owed, UnreducedOutput):
        return msgspec.structs.replace(owed, partial=pending.value.clone()).complete()
    raise FaultError(f"cannot read a {type(owed).__name__} contribution (a finalize handoff)")


def _stream_state(forward_batch: Any) -> tuple[Any, Any]:
    stream = getattr(forward_batch, "residual_stream", None)
    if stream is None:
        return None, None
    return stream.residual, stream.pending


def _around_layer(original: Callable, layer: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``DeepseekV2DecoderLayer.forward`` of a layer that captures (it got a packer).

    Before the layer runs, its boundary has not consumed the stream yet:

    * ``partial-sum``: value = the stream's ``residual`` (layer ``i-1``'s
      post-attention residual) + ``pending.value`` (its MLP output, still this
      rank's unreduced partial at TP > 1) -- the bug's read before the fused
      all-reduce;
    * ``before-fused-allreduce``: the same read, but only where SGLang's own
      gate ``flashinfer_ar_fusion_applies`` says the next norm completes that
      all-reduce in its fused kernel (elsewhere it changes nothing);
    * ``no-residual``: value = the pending MLP output completed on a copy (the
      all-reduce runs on every rank), without the residual;
    * ``partial-before-dp-reduce-scatter``: where the pending MoE output is owed to attention
      DP's ``dp_reduce_scatter``, value = ``residual`` + this rank's rows of it (:mod:`~pytest_eagle3.worker.dp_route`);
      ``other-rank-slice-after-dp-reduce-scatter``: after the layer, the next rank's slice there.

    After the layer wrote its capture into slot ``index`` of the packer:

    * ``normalized-input``: value = ``layer.input_layernorm`` (SGLang's own
      RMSNorm, ``forward_native``) of the captured residual stream;
    * ``unreduced-embedding`` (layer 0): value = ``embed_tokens._embed_local_shard(input_ids)``,
      the vocab-parallel embedding before its all-reduce;
    * ``dp-gather-scaled``: value = the captured slot all-reduced over the
      attention-TP group, whose ranks all hold the same rows.

    The slot is then overwritten with the value (on the ``rank``s and ``slots`` the fault names).
    """
    fault = _FAULT
    packer = _packer_of(args, kwargs)
    if fault is None or packer is None or fault["kind"] not in _LAYER_FAULTS or not getattr(_CTX, "active", True):
        return original(layer, *args, **kwargs)
    kind = fault["kind"]
    forward_batch = _forward_batch_of(args, kwargs)
    layer_id = int(getattr(layer, "layer_id", -1))
    index = len(packer)  # the slot this layer's capture goes to
    value = None
    if kind == "before-fused-allreduce" and layer_id > 0:
        residual, pending = _stream_state(forward_batch)
        if pending is not None and residual is not None and pending.value is not None:
            if pending.owed is not None and fault_reads.fusion_applies(pending.value.shape[0]):
                value = residual + pending.value  # read before the fused all-reduce completes it
                _log_once(kind, "%s at layer %d: the MLP all-reduce of layer %d is fused into this layer's "
                          "norm; slot read before it", kind, layer_id, layer_id - 1)
            else:
                _log_once(f"{kind}-off", "%s: SGLang does not fuse the all-reduce before layer %d here "
                          "(flashinfer_ar_fusion_applies is false): the fault changes nothing", kind, layer_id)
    residual, pending = _stream_state(forward_batch) if kind in DP_ROUTE and layer_id > 0 else (None, None)
    dp_owed = residual is not None and pending is not None and dp_route.owed_to_dp_reduce_scatter(pending.owed)
    if kind == "partial-before-dp-reduce-scatter" and dp_owed:
        # Read before dp_reduce_scatter completes layer i-1's MoE output: this rank's share, its own rows.
        value = residual + dp_route.own_rows(pending.value, residual.shape[0], *_tp())
        _log_once(kind, "%s at layer %d: read before layer %d's dp_reduce_scatter", kind, layer_id, layer_id - 1)
    if kind in ("partial-sum", "no-residual") and layer_id > 0:
        # Read the stream before this layer's boundary consumes it.
        residual, pending = _stream_state(forward_batch)
        if pending is not None and residual is not None and pending.value is not None:
            if kind == "partial-sum":
                if pending.owed is None:
                    _log_once("partial-sum-complete", "partial-sum: layer %d's MLP output is already "
                              "complete (TP 1?): the fault changes nothing", layer_id - 1)
                value = residual + pending.value  # this rank's unreduced MLP output
            else:
                value = _completed_copy(pending)  # every rank runs this collective
            _log_once(kind, "%s at layer %d: owed=%s", kind, layer_id, type(pending.owed).__name__)
    result = original(layer, *args, **kwargs)
    slot = _slot_view(packer, index)
    if slot is None:
        return result
    if kind == "normalized-input":
        norm = layer.input_layernorm
        value = norm.forward_native(slot.clone())
    elif kind == "unreduced-embedding" and layer_id == 0:
        value = fault_reads.local_embedding(_CTX, slot)
    elif kind == "other-rank-slice-after-dp-reduce-scatter" and dp_owed:
        # After dp_reduce_scatter completed layer i-1: the slice the next rank got (every rank gathers).
        value = dp_route.other_rank_rows(slot.clone(), forward_batch)
    elif kind == "dp-gather-scaled":
        if _slot_wanted(fault, index):
            from sglang.srt.distributed.parallel_state import get_attn_tp_group
            # The "gather" sums over attention-TP ranks that all hold these rows.
            value = get_attn_tp_group().all_reduce(slot.clone())
    if value is not None and _writes_here(fault) and _slot_wanted(fault, index):
        _write_rows(slot, value.to(slot.dtype), getattr(_CTX, "rows", None))
        _log_once(f"{kind}-write", "%s: slot %d (layer %d) replaced", kind, index, layer_id)
    return result


def _slot_wanted(fault: dict[str, Any], index: int) -> bool:
    """The fault's ``slots`` (one packed slot position or a list; default every slot) hold ``index``."""
    wanted = fault.get("slots")
    return wanted is None or index in [int(s) for s in ([wanted] if isinstance(wanted, int) else wanted)]


def _write_rows(slot: Any, value: Any, rows: Any) -> None:
    """``slot <- value`` on the wanted requests' rows of a mixed extend batch
    (``rows``: :class:`~pytest_eagle3.worker.fault_when.Rows`), or on every row where
    ``rows`` is ``None`` or the slot does not hold the forward's tokens one row each
    (rows padded or gathered across ranks: the whole forward, as for one mode)."""
    if rows is None or rows.total != slot.shape[0]:
        slot.copy_(value)
        return
    for start, stop in rows.ranges:
        slot[start:stop].copy_(value[start:stop])
    _log_once("rows", "confined to the rows of the requests in wanted modes: %s of %d", list(rows.ranges), rows.total)


def _slot_view(packer: Any, index: int) -> Any:
    """The packed columns of capture ``index`` (after the layer wrote it)."""
    if len(packer) <= index:
        return None
    if isinstance(packer, list):
        return packer[index]
    width = packer._feature_size
    return packer._buffer[..., index * width:(index + 1) * width]


DP_ROUTE = ("partial-before-dp-reduce-scatter", "other-rank-slice-after-dp-reduce-scatter")
_LAYER_FAULTS = ("normalized-input", "no-residual", "partial-sum", "unreduced-embedding", "dp-gather-scaled",
                 "before-fused-allreduce", *DP_ROUTE)


def install(fault: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Register the hooks of the fault :data:`~pytest_eagle3.worker.env.FAULT_ENV` names (or ``fault``).

    Returns the fault, or ``None`` (nothing registered) when none is asked for.
    Must run before the recorder installs its hook (see module docstring).
    """
    global _FAULT
    fault = read_fault() if fault is None else fault
    if fault is None:
        return None
    named = fault["kind"]
    if named in CONFINED:
        base, options = CONFINED[named]
        fault = {**options, **fault, "kind": base, "confined": named}
    _FAULT = fault
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        raise RuntimeError(
            "pytest-eagle3 fault injection needs SGLang's HookRegistry "
            "(sglang.srt.plugins.hook_registry); this SGLang has none, so faults "
            "cannot be injected into it (self-test runs on releases that have it)"
        ) from None

    kind = fault["kind"]
    if kind in ("offset-twice", "offset-missing", "ids-ignored"):
        HookRegistry.register(SET_LAYERS, _after_set_layers, HookType.AFTER)
    elif kind == "reversed-order":
        HookRegistry.register(PACKER_SLOT, _around_packer_slot, HookType.AROUND)
    elif kind == "half-precision-copy":
        HookRegistry.register(PACKER_FINALIZE, _around_packer_finalize_half, HookType.AROUND)
    elif kind in spec_faults.HOOKS:
        target, hook = spec_faults.HOOKS[kind]
        HookRegistry.register(target, hook, HookType.AROUND)
    elif kind == "pp-earlier-stage-zeroed":
        HookRegistry.register(pp_relay.SEND_PROXY, pp_relay.around_send_proxy_zeroed, HookType.AROUND)
    elif kind in tbo_capture.MERGE_FAULTS:
        tbo_capture.MERGE_FAULT[0] = kind  # the fix's merge misplaces the rows
    elif kind == "aliased-capture":
        HookRegistry.register(PACKER_APPEND, _around_packer_append, HookType.AROUND)
        HookRegistry.register(PACKER_FINALIZE, _around_packer_finalize, HookType.AROUND)
        HookRegistry.register(LIST_CAPTURE, _around_list_capture, HookType.AROUND)
    else:
        HookRegistry.register(MODEL_FORWARD, _around_model_forward, HookType.AROUND)
        if kind in _LAYER_FAULTS:
            HookRegistry.register(LAYER_FORWARD, _around_layer, HookType.AROUND)
    logger.warning("pytest-eagle3 FAULT INJECTION ON (pid %d): %s", os.getpid(),
                   describe({**fault, "kind": named}) if named != fault["kind"] else describe(fault))
    return fault
