"""Faults in SGLang's speculative worker: what the draft is fed (worker side).

The target's captures are right; what the EAGLE draft reads from them is not.
Installed by :func:`pytest_eagle3.worker.fault_injection.install` for the kinds
of :data:`HOOKS` (catalog: :mod:`pytest_eagle3.worker.faults`), each an AROUND
hook through SGLang's ``HookRegistry`` on the SGLang function it changes:

* ``draft-fc-reversed``: the draft's ``LlamaModel.forward``
  (``srt/models/llama_eagle3.py``) reads its aux slots in reverse;
* ``tree-order-aux``: ``_finalize_accept_tree_path``
  (``srt/speculative/eagle_worker_common.py``, called by ``run_eagle_verify`` at
  top-k > 1) moves the accepted path's KV slots and tokens, the aux hidden states
  are put back in tree order;
* ``chunk-seam-prediction``: ``_eagle_prefill_tail_tokens`` as the name
  ``srt/speculative/eagle_worker_v2.py`` calls returns the target's prediction
  for every request, also at the end of a non-final prefill chunk (before PR #26800).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger("pytest_eagle3.faults")

DRAFT_FORWARD = "sglang.srt.models.llama_eagle3.LlamaModel.forward"
FINALIZE_TREE = "sglang.srt.speculative.eagle_worker_common._finalize_accept_tree_path"
PREFILL_TAIL = "sglang.srt.speculative.eagle_worker_v2._eagle_prefill_tail_tokens"
_logged: set[str] = set()


def log_once(key: str, msg: str, *args: Any) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.warning("pytest-eagle3 FAULT " + msg, *args)


def _around_draft_forward(original: Callable, model: Any, *args: Any, **kwargs: Any) -> Any:
    """draft-fc-reversed: the draft's ``LlamaModel.forward`` sees its ``K`` aux
    hidden states (``forward_batch.spec_info.hidden_states``, ``[n, K*H]``) in
    reverse slot order; restored after the forward."""
    forward_batch = args[2] if len(args) > 2 else kwargs.get("forward_batch")
    spec = getattr(forward_batch, "spec_info", None)
    hidden = getattr(spec, "hidden_states", None)
    k = int(getattr(model, "num_aux_hidden_states", 0) or 0)
    width = int(getattr(model, "hidden_size_in", 0) or 0)
    if hidden is None or k < 2 or width == 0 or hidden.shape[-1] != k * width:
        return original(model, *args, **kwargs)
    import torch

    spec.hidden_states = torch.cat(list(reversed(hidden.split(width, dim=-1))), dim=-1)
    log_once("draft-fc-reversed", "draft-fc-reversed: the draft's %d aux hidden states reversed before fc", k)
    try:
        return original(model, *args, **kwargs)
    finally:
        spec.hidden_states = hidden


def _around_finalize_tree(original: Callable, batch: Any, accept_index: Any, accept_lens: Any, predict: Any,
                          logits_output: Any, *args: Any, **kwargs: Any) -> Any:
    """tree-order-aux: SGLang's ``_finalize_accept_tree_path`` moves the KV slots and the
    predicted tokens; the aux hidden states are put back in tree order afterwards."""
    hidden = getattr(logits_output, "hidden_states", None)
    out = original(batch, accept_index, accept_lens, predict, logits_output, *args, **kwargs)
    if hidden is not None:
        logits_output.hidden_states = hidden
        log_once("tree-order-aux", "tree-order-aux: the verify's aux hidden states left in tree order")
    return out


def _around_prefill_tail(original: Callable, batch: Any, next_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
    """chunk-seam-prediction: every request's tail token is the target's prediction, also at the
    end of a non-final chunk (``_eagle_prefill_tail_tokens`` before PR #26800)."""
    log_once("chunk-seam-prediction", "chunk-seam-prediction: the draft's tail token is the target's prediction")
    return next_token_ids.to(batch.input_ids.dtype)


#: kind -> (the SGLang function the AROUND hook wraps, the hook).
HOOKS: dict[str, tuple[str, Callable[..., Any]]] = {
    "draft-fc-reversed": (DRAFT_FORWARD, _around_draft_forward),
    "tree-order-aux": (FINALIZE_TREE, _around_finalize_tree),
    "chunk-seam-prediction": (PREFILL_TAIL, _around_prefill_tail),
}
