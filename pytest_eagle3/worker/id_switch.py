"""Aux layer ids switched between requests: runs inside every SGLang TP worker.

One capture-only engine serves every id list of a run on the CPU tier instead
of one engine per list.  The test process writes the ids the next request must
capture to ``$PYTEST_EAGLE3_RECORD_DIR/IDS`` (JSON: a list, or ``null`` for
SGLang's default) while the engine is idle; before each forward of the
capturing model, every rank that sees a new value calls SGLang's own
``set_eagle3_layers_to_capture(ids)`` on its model, the method SGLang calls
once at startup with the ids of the server args or the draft's ``config.json``
(``srt/model_executor/model_runner_components/attention_backend_setup.py``,
sglang 0.5.23).  The id rule under test (which layers an id list selects) is
SGLang's own code either way; what a switch skips is only the hand-over of the
list from the server arguments to that call.  Faults on that method
(:mod:`pytest_eagle3.worker.fault_injection`) apply to a switched list too.

Proof that a switch ran: each rank (at PP, of the last stage) writes ``IDS.applied.rank<r>`` (JSON
``{"ids": ..., "layers_to_capture": [...]}``) after applying, and the test
process refuses captures whose every rank did not apply the ids it asked for
(:meth:`pytest_eagle3.capture.runner.CaptureRunner`).

Only where no CUDA graph is captured (the CPU tier): a graph replays the
layers it was captured with (SGLang PR #22836).  Installed by
:mod:`pytest_eagle3.worker.sglang_hooks` when ``PYTEST_EAGLE3_ID_SWITCH``
(:data:`pytest_eagle3.worker.env.ID_SWITCH_ENV`) is ``1``.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from pathlib import Path
from typing import Any

from pytest_eagle3.worker.env import RECORD_DIR_ENV, RECORD_TARGET_ENV
from pytest_eagle3.worker import recorder_hook
from pytest_eagle3.worker.recorder_hook import TARGET as MODEL_FORWARD

IDS_FILE = "IDS"
APPLIED_FILE = "IDS.applied.rank{rank}"
#: SGLang's method that turns a draft's ids into ``layers_to_capture`` (DeepSeek-V3 layout).
SET_LAYERS = "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture"

logger = logging.getLogger("pytest_eagle3.id_switch")
_model: "weakref.ReferenceType[Any] | None" = None
_seen: bytes | None = None


def _after_set_layers(result: Any, model: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook: remember the model SGLang set the capture layers on."""
    global _model
    _model = weakref.ref(model)
    return None


def _before_forward(*args: Any, **kwargs: Any) -> None:
    """BEFORE hook on the capturing forward: apply a new ``IDS`` file, once per change."""
    global _seen
    directory = os.environ.get(RECORD_DIR_ENV)
    model = _model() if _model is not None else None
    if not directory or model is None:
        return None
    try:
        raw = (Path(directory) / IDS_FILE).read_bytes()
    except OSError:
        return None
    if raw == _seen:
        return None
    _seen = raw
    ids = json.loads(raw.decode())
    model.set_eagle3_layers_to_capture(list(ids) if ids is not None else None)
    layers = list(getattr(getattr(model, "model", None), "layers_to_capture", []) or [])
    if not recorder_hook.is_last_pp_stage():
        return None  # at PP, the last stage's list is the one its captures follow
    rank, _ = recorder_hook.tp_rank_and_size()
    out = Path(directory) / APPLIED_FILE.format(rank=rank)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # one per rank: ranks write at once
    try:
        tmp.write_text(json.dumps({"ids": ids, "layers_to_capture": layers}))
        os.replace(tmp, out)
    except OSError as exc:  # the host then refuses the captures, naming this rank
        logger.error("pytest-eagle3 id switch (rank %d): could not write %s: %s", rank, out, exc)
    logger.warning("pytest-eagle3 id switch (rank %d): ids %s -> layers_to_capture %s", rank, ids, layers)
    return None


def install() -> None:
    """Register both hooks with SGLang's ``HookRegistry`` (applied by ``load_plugins``).

    Raises:
        RuntimeError: this SGLang has no ``HookRegistry`` (the host never asks then).
    """
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        raise RuntimeError("pytest-eagle3 id switch needs SGLang's HookRegistry "
                           "(sglang.srt.plugins.hook_registry)") from None
    HookRegistry.register(SET_LAYERS, _after_set_layers, HookType.AFTER)
    HookRegistry.register(os.environ.get(RECORD_TARGET_ENV) or MODEL_FORWARD, _before_forward, HookType.BEFORE)
