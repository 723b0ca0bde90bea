"""Proof, from inside a worker, that a forward took two-batch overlap (TBO).

SGLang splits a TBO batch before the model runs: ``ForwardBatch.can_run_tbo``
is ``tbo_split_seq_index is not None`` and ``tbo_children`` holds the two
micro-batches (0.5.23 ``srt/model_executor/forward_batch_info.py:2267``,
``srt/batch_overlap/two_batch_overlap.py`` ``TboForwardBatchPreparer.prepare_raw``).
``DeepseekV2Model.forward`` then runs the layers from ``first_k_dense_replace``
on through ``model_forward_stages(..., enable_tbo=True)`` (``srt/models/deepseek_v2.py:3203``).

A *before* hook on the capturing forward (the recorder's target, through SGLang's
``HookRegistry``) logs :data:`PROOF_LINE` once per process and forward mode: the
split index, each micro-batch's token count and the layers that run split.  It
runs before the forward, so the line is in the log even when the forward dies.
It only reads.  :data:`PROOF` parses it (:mod:`pytest_eagle3.engine.tbo_start`).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

logger = logging.getLogger("pytest_eagle3.tbo_proof")

PROOF_LINE = ("pytest-eagle3 TBO: {mode} batch of {tokens} token(s) split at sequence {seq} into micro-batches "
              "of {a} and {b} tokens; layers {first}-{last} run in model_forward_stages(enable_tbo=True) "
              "(pid {pid})")
PROOF = re.compile(r"pytest-eagle3 TBO: (?P<mode>\w+) batch of (?P<tokens>\d+) token\(s\) split at sequence "
                   r"(?P<seq>\d+) into micro-batches of (?P<a>\d+) and (?P<b>\d+) tokens; layers "
                   r"(?P<first>\d+)-(?P<last>\d+) run in model_forward_stages\(enable_tbo=True\) \(pid (?P<pid>\d+)\)")

_seen: set[str] = set()


def _tokens(batch: Any) -> int:
    ids = getattr(batch, "input_ids", None)
    return int(ids.shape[0]) if ids is not None else 0


def _split_layers(model: Any) -> tuple[int, int] | None:
    """The layers ``DeepseekV2Model.forward`` hands to ``model_forward_stages`` (end inclusive):
    from ``first_k_dense_replace`` when it lies inside this stage's layers, all of them
    when it lies before; none otherwise (0.5.23 ``deepseek_v2.py:3166-3173``)."""
    start, end = getattr(model, "start_layer", 0), getattr(model, "end_layer", None)
    first_k = getattr(model, "first_k_dense_replace", None)
    if end is None or first_k is None:
        return None
    if start < first_k < end:
        return first_k, end - 1
    if first_k < start:
        return start, end - 1
    return None


def before_forward(model: Any, *args: Any, **kwargs: Any) -> None:
    """Log :data:`PROOF_LINE` for the first TBO forward of each mode in this process.
    Never raises: it runs inside SGLang's forward."""
    try:
        _log_split(model, *args, **kwargs)
    except Exception:  # noqa: BLE001 - a proof that cannot be read is no proof; the forward goes on
        return None
    return None


def _log_split(model: Any, *args: Any, **kwargs: Any) -> None:
    batch = kwargs.get("forward_batch", args[2] if len(args) > 2 else None)
    if batch is None or getattr(batch, "tbo_split_seq_index", None) is None:
        return None
    mode = getattr(getattr(batch, "forward_mode", None), "name", "UNKNOWN")
    layers = _split_layers(model)
    children = list(getattr(batch, "tbo_children", None) or ())
    if mode in _seen or layers is None or len(children) != 2:
        return None
    _seen.add(mode)
    logger.warning(PROOF_LINE.format(mode=mode, tokens=_tokens(batch), seq=batch.tbo_split_seq_index,
                                     a=_tokens(children[0]), b=_tokens(children[1]),
                                     first=layers[0], last=layers[1], pid=os.getpid()))
    return None


def install(target: str) -> bool:
    """Register :func:`before_forward` on ``target`` (a dotted ``Class.forward``).

    Returns False where SGLang has no ``HookRegistry`` (releases before 0.5.11):
    no proof line there."""
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        return False
    HookRegistry.register(target, before_forward, HookType.BEFORE)
    return True
