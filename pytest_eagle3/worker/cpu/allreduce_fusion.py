"""All-reduce fusion on the CPU tier, installed inside SGLang's processes.

On Hopper/Blackwell at TP > 1 SGLang defers the MLP's (and attention's)
all-reduce into the next layer's fused all-reduce + residual add + RMSNorm
(FlashInfer ``allreduce_fusion``, pattern ``kARResidualRMSNorm``).  A capture
read before that deferred all-reduce holds per-rank partial sums (SGLang PR
#28343).  sglang 0.5.23 decides it per batch in one function,
``flashinfer_ar_fusion_applies`` (``srt/layers/layer_boundary/residual/add_norm.py:144``),
which the deferral (``layer_boundary/exit.py:479``), the fused consumers
(``layer_boundary/fusions/allreduce.py:95,160``) and the capture's
residual-ownership promise (``fusions/allreduce.py:146``) all call.

On a CPU three of its conditions are false, each a fact about the platform,
not about the batch:

* ``_is_sm90_supported or _is_sm100_supported`` (``add_norm.py:53-54``),
* ``_is_flashinfer_available`` (``add_norm.py:52``: flashinfer needs CUDA),
* ``get_exec().comm.flashinfer_allreduce_fusion_backend is not None``
  (``add_norm.py:149``; the server argument itself would also make
  ``distributed/bootstrap.py:258`` route every all-reduce to FlashInfer and
  ``model_executor/runner/base_runner.py:312`` allocate CUDA workspaces).

When the engine host sets :data:`FUSION_ENV`, this overrides those three,
in ``add_norm``'s module alone, and nothing else: SGLang's own function still
checks DP attention, the CuTe DSL backend, FlashInfer's unavailability flag
and the batch size; the deferral, the fused consumers, the norms'
``forward_with_allreduce_fusion`` and ``_forward_with_allreduce_fusion``
(``srt/layers/layernorm.py:208``) run unchanged.  The fused op SGLang calls
there, ``flashinfer_allreduce_residual_rmsnorm``
(``srt/layers/flashinfer_comm_fusion.py:833``), is served by
:func:`allreduce_residual_rmsnorm` with its argument list and contract:
inputs untouched, ``(norm_out, residual_out)`` fresh, ``(None, None)`` when it
declines (one rank, non-contiguous tensors).  The all-reduce goes over the
group SGLang's own fallback uses (``layernorm.py:261-264``), through gloo.

Proof that the path ran: the first call in each process logs
:data:`CALLED_LINE`; :data:`CALLS` counts calls.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from pytest_eagle3.worker.env import FUSION_ENV

#: Engine env var: ``1`` runs the fused path with the stand-in.
#: Logged by each process at its first fused call (the suite reads it back).
CALLED_LINE = ("pytest-eagle3 all-reduce fusion stand-in: flashinfer_allreduce_residual_rmsnorm called "
               "(pid {pid}, input {shape}, use_attn_tp_group={attn})")
#: Logged by each process that overrode the gate.
GATE_LINE = ("pytest-eagle3: add_norm platform conditions of flashinfer_ar_fusion_applies overridden "
             "(_is_sm90_supported, _is_flashinfer_available, flashinfer_allreduce_fusion_backend; pid {pid})")
#: The backend name the overridden condition sees.
STANDIN_BACKEND = "pytest-eagle3-cpu-standin"

CALLS = {"fused": 0, "declined": 0}

logger = logging.getLogger("pytest_eagle3.cpu")


class _ExecWithFusionBackend:
    """``get_exec()``'s value, but ``.comm.flashinfer_allreduce_fusion_backend`` is set."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        return _CommWithFusionBackend(value) if name == "comm" else value


class _CommWithFusionBackend:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "flashinfer_allreduce_fusion_backend":
            return STANDIN_BACKEND
        return getattr(self._inner, name)


def allreduce_residual_rmsnorm(
    input_tensor: Any,
    residual: Any,
    weight: Any,
    eps: float = 1e-6,
    max_token_num: int = 2048,
    use_oneshot: Any = None,
    trigger_completion_at_end: bool = False,
    fp32_acc: bool = True,
    use_attn_tp_group: bool = True,
) -> tuple[Any, Any]:
    """Stand-in for ``flashinfer_allreduce_residual_rmsnorm``: one all-reduce, add, norm.

    ``input_tensor [T, H]`` (this rank's partial sum), ``residual [T, H]``,
    ``weight [H]``.  Returns ``(norm_out, residual_out)``, both new ``[T, H]``
    tensors: ``residual_out = all_reduce(input) + residual``, ``norm_out =
    rmsnorm(residual_out) * weight`` accumulated in float32; the inputs are
    not modified.  ``(None, None)`` where FlashInfer's wrapper declines: a
    group of one, or a non-contiguous tensor.
    """
    import torch

    from sglang.srt.layers.flashinfer_comm_fusion import resolve_fusion_world_size

    if resolve_fusion_world_size(use_attn_tp_group=use_attn_tp_group) <= 1 or not (
        input_tensor.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()
    ):
        CALLS["declined"] += 1
        return None, None
    assert input_tensor.shape[0] <= max_token_num
    if use_attn_tp_group:
        from sglang.srt.distributed import attention_tensor_model_parallel_all_reduce as all_reduce
    else:
        from sglang.srt.layers.moe.utils import deferred_post_experts_all_reduce as all_reduce
    reduced = all_reduce(input_tensor.clone())
    total = reduced.float() + residual.float()
    normed = total * torch.rsqrt(total.pow(2).mean(dim=-1, keepdim=True) + float(eps)) * weight.float()
    CALLS["fused"] += 1
    if CALLS["fused"] == 1:
        logger.warning(CALLED_LINE.format(pid=os.getpid(), shape=list(input_tensor.shape), attn=use_attn_tp_group))
    return normed.to(input_tensor.dtype), total.to(residual.dtype)


def install() -> bool:
    """Override the gate and stand in for the fused op when :data:`FUSION_ENV` is ``1``."""
    if os.environ.get(FUSION_ENV, "") != "1":
        return False
    try:
        from sglang.srt.layers import flashinfer_comm_fusion
        from sglang.srt.layers.layer_boundary.residual import add_norm
    except ImportError as exc:
        logger.warning("pytest-eagle3: all-reduce fusion not installed: %s", exc)
        return False
    missing = [n for n in ("_is_sm90_supported", "_is_flashinfer_available", "get_exec",
                           "flashinfer_ar_fusion_applies") if not hasattr(add_norm, n)]
    if missing or not hasattr(flashinfer_comm_fusion, "flashinfer_allreduce_residual_rmsnorm"):
        logger.warning("pytest-eagle3: all-reduce fusion not installed: add_norm lacks %s", missing)
        return False
    add_norm._is_sm90_supported = True
    add_norm._is_flashinfer_available = True
    real_get_exec = add_norm.get_exec
    add_norm.get_exec = lambda: _ExecWithFusionBackend(real_get_exec())
    flashinfer_comm_fusion.flashinfer_allreduce_residual_rmsnorm = allreduce_residual_rmsnorm
    logger.warning(GATE_LINE.format(pid=os.getpid()))
    return True
