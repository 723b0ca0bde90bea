"""What the EAGLE draft receives: its extend forwards' inputs, recorded per TP rank.

Runs inside SGLang's TP workers (never in the test process), installed with the
per-rank recorder (:mod:`pytest_eagle3.worker.recorder_hook`) and switched by the
same ``ENABLED`` file.  A before-hook on ``ModelRunner.forward``
(``srt/model_executor/model_runner.py``, through SGLang's own ``HookRegistry``)
reads, for the draft worker's model runner only (``is_draft_worker``) and only
its extend forwards (``EXTEND`` after a target prefill, ``DRAFT_EXTEND`` /
``DRAFT_EXTEND_V2`` after a verify; not the draft's own decode steps), the
tensors the draft model is about to consume (a draft extend SGLang replays as a
CUDA graph, ``EAGLEDraftExtendCudaGraphRunner.execute`` of
``srt/speculative/eagle_draft_extend_cuda_graph_runner.py``, gets the same
before-hook: the GPU tier's default):

* ``aux`` ``[tokens, K*H]``: ``forward_batch.spec_info.hidden_states``, the
  target's aux hidden states the draft's ``fc`` reads;
* ``input_ids`` ``[tokens]`` int64: the tokens the draft embeds beside them
  (SGLang 0.5.23 rotates a prefill's ids by one and appends the tail token,
  ``eagle_worker_v2.py`` ``_draft_extend_for_prefill``; after a verify they are the
  target's predictions at the accepted nodes, ``_draft_extend_for_decode``);
* ``positions`` ``[tokens]`` int64;
* ``accept`` ``[requests]`` int64 after a verify: each request's accepted tokens
  (``EagleDraftExtendInput.num_accept_tokens``; a request's block holds
  ``speculative_num_draft_tokens`` rows, of which its first ``accept`` are read).

Files ``draft<r>/<seq:06d>-<mode>.safetensors`` with metadata ``mode``, ``rids``
and ``lens`` (rows per request), beside the target's ``rank<r>/``; at pipeline
parallelism the last stage's only.  It observes
only: nothing SGLang uses is modified.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pytest_eagle3.worker.env import RECORD_DIR_ENV
from pytest_eagle3.worker.recorder_hook import ENABLED_FILE, is_last_pp_stage, tp_rank_and_size

TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
GRAPH_MODULE = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"
GRAPH_TARGET = f"{GRAPH_MODULE}.EAGLEDraftExtendCudaGraphRunner.execute"
#: Sub-directory prefix of the draft's records (``draft0``, ``draft1``, ...).
PREFIX = "draft"

logger = logging.getLogger("pytest_eagle3.draft_recorder")
_seq = 0


def _rows_per_request(forward_batch: Any, requests: int, tokens: int) -> list[int]:
    lens = getattr(forward_batch, "extend_seq_lens_cpu", None)
    if lens is not None and len(lens) == requests and sum(int(n) for n in lens) == tokens:
        return [int(n) for n in lens]
    return [tokens // requests] * requests if requests and tokens % requests == 0 else []


def before_forward(runner: Any, forward_batch: Any = None, *args: Any, **kwargs: Any) -> None:
    """The before-hook on ``ModelRunner.forward``: the draft worker's runner only."""
    if getattr(runner, "is_draft_worker", False):
        _record(forward_batch if forward_batch is not None else kwargs.get("forward_batch"))
    return None


def before_graph(runner: Any, forward_batch: Any = None, *args: Any, **kwargs: Any) -> None:
    """The before-hook on the draft extend's CUDA graph replay (a draft-only runner)."""
    _record(forward_batch if forward_batch is not None else kwargs.get("forward_batch"))
    return None


def _record(forward_batch: Any) -> None:
    """Record the draft's extend inputs when recording is on."""
    global _seq
    root = os.environ.get(RECORD_DIR_ENV)
    if not root or forward_batch is None or not os.path.exists(os.path.join(root, ENABLED_FILE)):
        return None
    if not is_last_pp_stage():
        return None  # at PP the last stage's draft is the one fed the captures (as the target's recorder)
    mode = getattr(getattr(forward_batch, "forward_mode", None), "name", "UNKNOWN")
    spec = getattr(forward_batch, "spec_info", None)
    hidden = getattr(spec, "hidden_states", None)
    ids = getattr(forward_batch, "input_ids", None)
    if "EXTEND" not in mode or hidden is None or ids is None or hidden.shape[0] != ids.shape[0]:
        return None
    import torch
    from safetensors.torch import save_file

    tensors = {"aux": hidden.detach().to("cpu").contiguous(),
               "input_ids": ids.detach().to("cpu").to(torch.int64).contiguous()}
    positions = getattr(forward_batch, "positions", None)
    if positions is not None:
        positions = positions[0] if positions.dim() > 1 else positions
        tensors["positions"] = positions.detach().to("cpu").to(torch.int64).contiguous()
    accept = getattr(spec, "num_accept_tokens", None)
    if accept is not None:
        tensors["accept"] = accept.detach().to("cpu").to(torch.int64).reshape(-1).contiguous()
    rids = [str(r) for r in (getattr(forward_batch, "rids", None) or [])]
    meta = {"mode": mode, "rids": json.dumps(rids),
            "lens": json.dumps(_rows_per_request(forward_batch, len(rids), int(ids.shape[0])))}
    out = Path(root) / f"{PREFIX}{tp_rank_and_size()[0]}"
    out.mkdir(parents=True, exist_ok=True)
    _seq += 1
    tmp = out / f".{_seq:06d}.{os.getpid()}.tmp"
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, out / f"{_seq:06d}-{mode}.safetensors")
    return None


def install() -> None:
    """Register :func:`before_forward` (and :func:`before_graph` where SGLang has the draft
    extend's graph runner) with SGLang's ``HookRegistry``; where the registry is missing
    (releases before 0.5.11) wrap ``ModelRunner.forward`` directly, as the per-rank
    recorder does."""
    import importlib
    import importlib.util

    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        import functools

        module_name, class_name, _ = TARGET.rsplit(".", 2)
        cls = getattr(importlib.import_module(module_name), class_name)
        original = cls.forward

        @functools.wraps(original)
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            before_forward(self, *args, **kwargs)
            return original(self, *args, **kwargs)

        cls.forward = forward
        return
    HookRegistry.register(TARGET, before_forward, HookType.BEFORE)
    if importlib.util.find_spec(GRAPH_MODULE) is not None:
        HookRegistry.register(GRAPH_TARGET, before_graph, HookType.BEFORE)
