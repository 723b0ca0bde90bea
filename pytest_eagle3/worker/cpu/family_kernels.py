"""Plain-torch stand-ins for the triton kernels two model families call on CPU,
the CPU facts the gated delta-net layers of Qwen3-Next and Qwen3.5 need
(:func:`delta_net_norm`, :func:`delta_net_device`), and the early import of the
stand-in ``sgl_kernel`` (:func:`standin_torch_ops`).

SGLang 0.5.23 calls these triton kernels from model code on any device
without AMX; with no GPU, triton has no driver ("0 active drivers") or the
kernel asserts ``x.is_cuda``.  Each stand-in replaces the name the model file
imported, keeps the kernel's contract (shapes, dtypes, in-place writes; read
from the kernel source named), and touches neither the capture nor a
collective.  Installed by :mod:`pytest_eagle3.worker.cpu.fills` when the model
module finishes importing, and only where CUDA is absent.

* ``srt/models/qwen2_moe.py`` (Qwen2-MoE's sigmoid-gated shared expert):
  ``fused_gate_sigmoid_mul`` / ``fused_gate_sigmoid_mul_add`` from
  ``kernels/ops/elementwise/elementwise.py`` (``_fused_gate_sigmoid_mul_kernel``:
  per token ``g = sigmoid(sum(h * w))`` in fp32, then ``g * shared`` written
  to a new tensor, or added in place to the routed experts' output);
* ``srt/models/minimax_m2.py`` (MiniMax-M2's QK RMSNorm over all heads, whose
  sum of squares is all-reduced across attention TP ranks):
  ``rms_sumsq_serial`` (fp32 ``[pad4(2B)]``: the query rows' sums of squares at
  ``[0, B)``, the key rows' at ``[B, 2B)``) and ``rms_apply_serial``
  (``x * rsqrt(sum / D / tp_world + eps) * w`` in fp32, cast back; returns
  ``(q_out, k_out)``), the kernels of ``MiniMaxM2QKRMSNorm._forward_naive``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger("pytest_eagle3.cpu")

#: Logged once per process and kernel, so the engine log proves the stand-in ran.
LINE = "pytest-eagle3 CPU stand-in: {kernel} in plain torch ({module}, pid {pid})"


def _said(seen: set[str], kernel: str, module: str) -> None:
    if kernel not in seen:
        seen.add(kernel)
        logger.warning(LINE.format(kernel=kernel, module=module, pid=os.getpid()))


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def gate_sigmoid_mul(hidden_states: Any, gate_weight: Any, shared_output: Any, output: Any | None) -> Any:
    """``sigmoid(hidden_states @ gate_weight)[:, None] * shared_output``, in fp32, added in
    place to ``output`` when given (returned), else a new tensor of ``shared_output``'s dtype."""
    gate = (hidden_states.float() * gate_weight.float()).sum(dim=-1, keepdim=True).sigmoid()
    gated = gate * shared_output.float()
    if output is None:
        return gated.to(shared_output.dtype)
    output.copy_((gated + output.float()).to(output.dtype))
    return output


def qwen2_moe_shared_gate(module: Any) -> None:
    """Replace ``fused_gate_sigmoid_mul(_add)`` in ``sglang.srt.models.qwen2_moe`` (no CUDA only)."""
    if _cuda() or not hasattr(module, "fused_gate_sigmoid_mul_add"):
        return
    seen: set[str] = set()
    name = module.__name__

    def fused_gate_sigmoid_mul(hidden_states: Any, gate_weight: Any, shared_output: Any) -> Any:
        _said(seen, "fused_gate_sigmoid_mul", name)
        return gate_sigmoid_mul(hidden_states, gate_weight, shared_output, None)

    def fused_gate_sigmoid_mul_add(hidden_states: Any, gate_weight: Any, shared_output: Any,
                                   final_hidden_states: Any) -> None:
        _said(seen, "fused_gate_sigmoid_mul_add", name)
        gate_sigmoid_mul(hidden_states, gate_weight, shared_output, final_hidden_states)

    module.fused_gate_sigmoid_mul = fused_gate_sigmoid_mul
    module.fused_gate_sigmoid_mul_add = fused_gate_sigmoid_mul_add


def rms_sumsq(x1: Any, x2: Any) -> Any:
    """The sums of squares of each row of ``x1`` and ``x2`` ``[B, D]``: fp32 ``[pad4(2B)]``."""
    import torch

    b = x1.shape[0]
    out = torch.zeros((2 * b + 3) // 4 * 4, dtype=torch.float32, device=x1.device)
    out[:b] = x1.float().pow(2).sum(dim=-1)
    out[b:2 * b] = x2.float().pow(2).sum(dim=-1)
    return out


def rms_apply(x1: Any, x2: Any, w1: Any, w2: Any, sum_sq: Any, tp_world: int = 1, eps: float = 1e-5) -> Any:
    """``(x1 * rsqrt(sum_sq[:B] / D1 / tp_world + eps) * w1, ...)`` in fp32, cast back."""
    b, d1 = x1.shape
    d2 = x2.shape[1]
    inv1 = (sum_sq[:b] / d1 / tp_world + eps).rsqrt()[:, None]
    inv2 = (sum_sq[b:2 * b] / d2 / tp_world + eps).rsqrt()[:, None]
    return ((x1.float() * inv1 * w1.float()).to(x1.dtype), (x2.float() * inv2 * w2.float()).to(x2.dtype))


def minimax_m2_qk_norm(module: Any) -> None:
    """Replace ``rms_sumsq_serial`` / ``rms_apply_serial`` in ``sglang.srt.models.minimax_m2`` (no CUDA only)."""
    if _cuda() or not hasattr(module, "rms_sumsq_serial"):
        return
    seen: set[str] = set()
    name = module.__name__

    def rms_sumsq_serial(x1: Any, x2: Any) -> Any:
        _said(seen, "rms_sumsq_serial", name)
        return rms_sumsq(x1, x2)

    def rms_apply_serial(x1: Any, x2: Any, w1: Any, w2: Any, sum_sq: Any, tp_world: int = 1,
                         eps: float = 1e-5) -> Any:
        _said(seen, "rms_apply_serial", name)
        return rms_apply(x1, x2, w1, w2, sum_sq, tp_world, eps)

    module.rms_sumsq_serial = rms_sumsq_serial
    module.rms_apply_serial = rms_apply_serial


def delta_net_device(module: Any) -> None:
    """Build ``Qwen3GatedDeltaNet`` of ``sglang.srt.models.qwen3_next`` (no CUDA only)
    with ``torch.get_device_module()`` answering ``torch.cpu``, as a CPU-only
    torch build does: its constructor places the gated output norm on
    ``torch.get_device_module().current_device()`` (0.5.23
    ``srt/models/qwen3_next.py:235,252``), which the CPU tier's CUDA build of
    torch answers with ``torch.cuda``, raising "Found no NVIDIA driver".  Only
    while that constructor runs; every other caller keeps torch's answer."""
    import functools

    import torch

    cls = getattr(module, "Qwen3GatedDeltaNet", None)
    if _cuda() or cls is None or getattr(cls.__init__, "_pytest_eagle3_cpu_device", False):
        return
    original_init = cls.__init__
    seen: set[str] = set()

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _said(seen, "Qwen3GatedDeltaNet on torch.cpu's device module", module.__name__)
        real = torch.get_device_module

        def get_device_module(device: Any = None) -> Any:
            return torch.cpu if device is None else real(device)

        torch.get_device_module = get_device_module
        try:
            original_init(self, *args, **kwargs)
        finally:
            torch.get_device_module = real

    __init__._pytest_eagle3_cpu_device = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def delta_net_norm(module: Any) -> None:
    """Send the delta-net's gated output norm down its CPU branch (no CUDA only):
    ``FusedRMSNormGated`` of ``sglang.kernels.ops.attention.fla.fused_norm_gate``
    (Qwen3-Next) and ``RMSNorm`` of ``...fla.layernorm_gated`` (Qwen3.5).  Each
    module sets ``_use_cpu`` from ``is_cpu() and cpu_has_amx_support()`` (0.5.23
    ``fused_norm_gate.py:20``, ``layernorm_gated.py:35``), so on an AMX Xeon the
    norm calls ``torch.ops.sgl_kernel.fused_rmsnorm_gated_cpu`` (served by the
    stand-in ``sgl_kernel.mamba``) and elsewhere a triton kernel with no CPU driver."""
    if _cuda() or not hasattr(module, "_use_cpu"):
        return
    module._use_cpu = True
    _said(set(), "the delta-net's gated norm on its CPU branch (fused_rmsnorm_gated_cpu)", module.__name__)


def standin_torch_ops() -> None:
    """Import the CPU tier's stand-in ``sgl_kernel`` now, in every SGLang process,
    so the ``torch.ops.sgl_kernel`` names it serves exist before a model file
    binds them at import (``srt/models/qwen3_5.py``, imported by SGLang's Qwen-VL
    multimodal processors in the server's main process, which imports no
    ``sgl_kernel`` of its own before).  A no-op where the real package is the one
    found (it raises ImportError without a GPU: SGLang then falls back as usual)."""
    import importlib

    try:
        importlib.import_module("sgl_kernel")
    except ImportError:
        return
