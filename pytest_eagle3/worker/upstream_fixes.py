"""Upstream fixes applied inside SGLang's processes, to check a verdict against them.

When the suite blames SGLang for a capture, the proof that the blame is right
(and not the reference's) is to apply the fix SGLang's own pull request
describes and watch the same tests pass.  This module holds such fixes; an
engine gets one when :data:`FIX_ENV` names it, through the same
``sglang.srt.plugins`` hooks and ``HookRegistry`` as the fault catalog
(:mod:`pytest_eagle3.worker.sglang_hooks`).  Never set, nothing here is
imported, and production servers never see it.

:data:`CATALOG` lists each fix with the pull request it follows.

* ``gemma3-capture-residual`` (SGLang PR #39286, "Gemma 3's captures omit the
  residual"): ``Gemma3DecoderLayer.forward`` of ``srt/models/gemma3_causal.py``
  (0.5.23, lines 408-410) returns ``(hidden_states, residual)`` with
  ``hidden_states`` the MLP branch after ``post_feedforward_layernorm``, and
  ``Gemma3TextModel.forward`` appends that first value as the capture
  (lines 639/657, 671).  The fix returns ``(hidden_states + residual, 0)``: the
  full residual stream in the value the model captures, and a zero residual,
  so every later norm (``Gemma3RMSNorm`` adds ``x + residual`` first) and the
  final norm compute what they computed before, exactly (``x + 0 == x``).  A
  layer that receives such a stream gets a copy of it, so a capture the model
  kept is never the tensor an in-place norm later rewrites (the PR's second
  half: captures "can be overwritten by subsequent fused normalization").
* ``pp-capture-gate-lifted`` (the open PRs that loosen SGLang's PP gates,
  #39378, #39602, #38698): the capture-only mode's ``pp_size == 1`` check and
  the EAGLE-only PP check lifted, nothing else (:mod:`pytest_eagle3.worker.pp_relay`).
* ``pp-capture-relay`` (SGLang issue #39634, earlier stages never capture):
  the lift, plus each pipeline stage capturing its own layers, the captures
  travelling to the last stage with the hidden states, and the per-request
  return travelling back to the stage that answers
  (:mod:`pytest_eagle3.worker.pp_relay`).
* ``tbo-capture-per-microbatch`` (SGLang PR #32680, closed unmerged: under
  two-batch overlap the layers from ``first_k_dense_replace`` on are never
  captured): each micro-batch captures its layers over its own token rows,
  merged in token order (:mod:`pytest_eagle3.worker.tbo_capture`).
* ``input-scattered-capture-gathered`` (no upstream PR gathers it; SGLang PR
  #10568 added the route and keeps it off under an EAGLE-3 draft, not on the
  capture-only engine; docs/compatibility.md): on an input-scattered extend batch
  (``--enable-attn-tp-input-scattered``) each TP rank keeps only its slice of
  the rows in the residual stream, and ``StageBoundary._prepare_attention``
  (0.5.23 ``srt/layers/layer_boundary/stage.py:461-488``) hands that slice to
  the capture (the entry's ``input_move`` is ``None`` there); the logits
  processor then indexes the short capture with the batch's row indices
  (``IndexError`` in ``logits_processor.py`` ``_get_pruned_states``, measured).
  The fix gathers the captured slice over the TP group with SGLang's own
  ``tp_gather`` (``srt/layers/layer_boundary/adapters/attention.py``), the
  gather the attention's own input takes, before the capture stores it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from pytest_eagle3.worker import pp_relay, tbo_capture
from pytest_eagle3.worker.env import FIX_ENV

#: fix -> (what it changes, the upstream pull request it follows).
CATALOG: dict[str, tuple[str, str]] = {
    "gemma3-capture-residual": (
        "Gemma3DecoderLayer.forward returns (MLP branch + residual, zeros): each capture holds the residual "
        "stream, a copy the next layer's norms never write",
        "SGLang PR #39286 (Gemma 3 captures omit the residual)",
    ),
    "pp-capture-gate-lifted": (
        "the capture-only mode's pp_size == 1 check (validation_hook.py handle_aux_hidden_state_capture) runs on "
        "a view whose pp_size reads 1, the EAGLE-only PP check (check_pipeline_parallel_compat) on one where "
        "EAGLE3 reads EAGLE; SGLang's capture path behind them is unchanged",
        "the open PRs that loosen SGLang's PP gates (#39378, #39602, #38698)",
    ),
    "pp-capture-relay": (
        "the lift, and each pipeline stage captures its own layers; the captures travel to the last stage in the "
        "proxy tensors, and the per-request hidden states travel back in the output tensors",
        "SGLang issue #39634 (at PP only the last stage captures)",
    ),
    "input-scattered-capture-gathered": (
        "StageBoundary._prepare_attention hands the aux capture the residual rows gathered over the TP group "
        "(adapters/attention.py tp_gather) when the batch is input-scattered, not this rank's slice",
        "SGLang PR #10568 added input-scattered attention and keeps it off under an EAGLE-3 draft; the "
        "capture-only engine (--enable-return-aux-hidden-states) is not kept off, and no PR gathers its capture",
    ),
    "tbo-capture-per-microbatch": (
        "under two-batch overlap, each micro-batch captures the asked-for layers from first_k_dense_replace on "
        "over its own token rows (op_comm_prepare_attn hands attn_boundary.prepare SGLang's collector), merged "
        "in token order into the forward's packer",
        "SGLang PR #32680 (closed unmerged: TBO layers are never captured)",
    ),
}
#: The fix that relays each PP stage's captures to the last stage.
PP_RELAY = "pp-capture-relay"
#: The fixes that lift SGLang's PP checks on EAGLE-3 (collection keeps the PP tests under them).
PP_LIFTS = frozenset({"pp-capture-gate-lifted", PP_RELAY})

GEMMA3_LAYER = "sglang.srt.models.gemma3_causal.Gemma3DecoderLayer.forward"
#: Logged once per process at the fix's first call (the e2e test reads it back).
APPLIED_LINE = "pytest-eagle3 upstream fix {fix} applied (pid {pid})"

logger = logging.getLogger("pytest_eagle3.upstream_fixes")
_logged: set[str] = set()


class UpstreamFixError(RuntimeError):
    """:data:`FIX_ENV` names no fix in :data:`CATALOG`."""


def read_fix(env: dict[str, str] | None = None) -> str | None:
    """The fix :data:`FIX_ENV` names, ``None`` when unset.

    Raises:
        UpstreamFixError: an unknown name.
    """
    name = (os.environ if env is None else env).get(FIX_ENV, "").strip()
    if not name:
        return None
    if name not in CATALOG:
        raise UpstreamFixError(f"{FIX_ENV}={name!r}: unknown fix; known: {', '.join(CATALOG)}")
    return name


def relay_named(env: dict[str, str] | None = None) -> bool:
    """Whether :data:`FIX_ENV` names :data:`PP_RELAY` (an unknown name: no)."""
    try:
        return read_fix(env) == PP_RELAY
    except UpstreamFixError:
        return False


def _around_gemma3_layer(original: Callable, layer: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``Gemma3DecoderLayer.forward``: the stream in the captured value."""
    hidden = kwargs.get("hidden_states")
    if hidden is not None:
        kwargs["hidden_states"] = hidden.clone()  # the caller may have kept it as a capture
    out, residual = original(layer, *args, **kwargs)
    if residual is None:
        return out, residual
    if "gemma3" not in _logged:
        _logged.add("gemma3")
        logger.warning(APPLIED_LINE.format(fix="gemma3-capture-residual", pid=os.getpid()))
    return out + residual, residual.new_zeros(residual.shape)


#: The method that hands the attention stage's input rows to the aux capture.
PREPARE_ATTENTION = "sglang.srt.layers.layer_boundary.stage.StageBoundary._prepare_attention"


class _GatheredCapture:
    """A capture collector that gathers an input-scattered slice to all rows first."""

    def __init__(self, inner: Any, forward_batch: Any, gather: Callable) -> None:
        self._inner, self._batch, self._gather = inner, forward_batch, gather

    def capture(self, value: Any, *, owned: bool = False) -> None:
        self._inner.capture(self._gather(value, self._batch), owned=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)


def _around_prepare_attention(original: Callable, boundary: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``StageBoundary._prepare_attention``: gather an input-scattered capture."""
    collector = kwargs.get("capture_gathered")
    if collector is not None:
        from sglang.srt.layers.layer_boundary.adapters import attention

        forward_batch = args[2] if len(args) > 2 else kwargs.get("forward_batch")
        if attention.get_attn_tp_context().input_scattered:
            kwargs["capture_gathered"] = _GatheredCapture(collector, forward_batch, attention.tp_gather)
            if "input-scattered" not in _logged:
                _logged.add("input-scattered")
                logger.warning(APPLIED_LINE.format(fix="input-scattered-capture-gathered", pid=os.getpid()))
    return original(boundary, *args, **kwargs)


def install(fix: str | None = None) -> str | None:
    """Register the fix :data:`FIX_ENV` names (or ``fix``) with SGLang's
    ``HookRegistry``; returns its name, ``None`` when none is asked for."""
    fix = fix or read_fix()
    if fix is None:
        return None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if fix == "gemma3-capture-residual":
        HookRegistry.register(GEMMA3_LAYER, _around_gemma3_layer, HookType.AROUND)
    elif fix in PP_LIFTS:
        pp_relay.install(relay=fix == PP_RELAY)
    elif fix == "tbo-capture-per-microbatch":
        tbo_capture.install()
    elif fix == "input-scattered-capture-gathered":
        HookRegistry.register(PREPARE_ATTENTION, _around_prepare_attention, HookType.AROUND)
    return fix
