"""Plain-torch stand-ins for sgl-kernel's CPU norm ops, with their in-place contract.

SGLang's ``RMSNorm.forward_cpu`` / ``GemmaRMSNorm.forward_cpu`` /
``Gemma3RMSNorm.forward_cpu`` / ``Gemma4RMSNorm.forward_cpu``
(``srt/layers/layernorm.py``, 0.5.23 lines 879-899, 1221-1239, 1335-1340,
1427-1436) call these as ``torch.ops.sgl_kernel.<name>`` when the module
global ``_is_cpu_amx_available`` is true, as on every Xeon AMX server.  What
each op overwrites and returns is read from sgl-kernel ``csrc/cpu/norm.cpp``:

* ``rmsnorm_cpu(input [T, H], weight [H], eps) -> out [T, H]``: a new tensor,
  ``input * rsqrt(mean(input**2) + eps) * weight``; input untouched.  Rows may
  be strided (last dimension contiguous): DeepSeek's ``kv_a_layernorm`` reads a
  slice of the latent cache, which a Xeon server reaches through its fused AMX
  MLA kernel instead.
* ``fused_add_rmsnorm_cpu(input [T, H], residual [T, H], weight [H], eps) -> None``:
  **in place**, ``residual <- input + residual`` (rounded to the tensor's
  dtype), then ``input <- rmsnorm(input + residual) * weight`` computed from the
  unrounded float32 sum.  Both tensors must be contiguous and 2-D
  (``CHECK_INPUT``, ``CHECK_DIM(2, ...)``); a view into a bigger buffer is
  overwritten where it lies.
* ``gemma_rmsnorm_cpu`` / ``gemma_fused_add_rmsnorm_cpu``: the same with
  ``(1 + weight)``.
* ``gemma3_rmsnorm_cpu(input [..., H], weight [H], eps) -> out``: ``(1 + weight)``,
  2-D to 4-D input with a contiguous last dimension.
* ``layernorm_cpu(input, weight, bias or None, eps) -> out``: layer norm over
  the last dimension.
* ``gemma4_rmsnorm_cpu(input [T, H] or [B, T, H], weight [H], eps, scale_shift,
  with_scale) -> out``: ``norm(x) * (weight + scale_shift)`` when ``with_scale``,
  else ``norm(x)``.

One deviation, documented in docs/cpu-tier.md: the real kernels dispatch on
bf16/fp16 only (``AT_DISPATCH_REDUCED_FLOATING_TYPES``); these also take the
CPU tier's float32.

Proof that the path ran: the first call of each op in a process logs
``pytest-eagle3 norm stand-in: sgl_kernel.<name> called`` (:data:`CALLED_LINE`)
and :data:`CALLS` counts every call.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

#: Logged once per op and process at its first call (the suite reads it back from the server log).
CALLED_LINE = "pytest-eagle3 norm stand-in: sgl_kernel.{name} called (pid {pid}, input {shape} {dtype})"
#: op name -> calls in this process.
CALLS: dict[str, int] = {}

_logger = logging.getLogger("pytest_eagle3.cpu.norm")


def _called(name: str, x: torch.Tensor) -> None:
    n = CALLS.get(name, 0)
    CALLS[name] = n + 1
    if n == 0:
        _logger.warning(CALLED_LINE.format(name=name, pid=os.getpid(), shape=list(x.shape), dtype=x.dtype))


def _check(name: str, cond: bool, what: str) -> None:
    # The real kernels fail a TORCH_CHECK with the same condition: so does the stand-in.
    if not cond:
        raise RuntimeError(f"sgl_kernel.{name} (pytest-eagle3 CPU stand-in): {what}")


def _check_2d(name: str, x: torch.Tensor, weight: torch.Tensor, *, contiguous: bool = True) -> None:
    _check(name, x.dim() == 2, f"expected a 2-D input, got {x.dim()}-D {tuple(x.shape)}")
    ok = x.is_contiguous() if contiguous else x.stride(-1) == 1
    _check(name, ok, f"input {tuple(x.shape)} stride {x.stride()} is not contiguous")
    _check(name, weight.dim() == 1 and weight.shape[0] == x.shape[1],
           f"weight {tuple(weight.shape)} does not match input {tuple(x.shape)}")


def _normed(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + float(eps))


def rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """New ``[T, H]`` tensor: ``rmsnorm(input) * weight``; ``input`` untouched."""
    _called("rmsnorm_cpu", input)
    # Rows may be strided (DeepSeek's kv_a_layernorm reads a slice of the latent
    # cache); the in-place ops below stay strict.
    _check_2d("rmsnorm_cpu", input, weight, contiguous=False)
    return (_normed(input.float(), eps) * weight.float()).to(input.dtype)


def fused_add_rmsnorm_cpu(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: ``residual <- input + residual``; ``input <- rmsnorm(input + residual) * weight``."""
    _fused_add("fused_add_rmsnorm_cpu", input, residual, weight.float(), eps)


def gemma_rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """New ``[T, H]`` tensor: ``rmsnorm(input) * (1 + weight)``."""
    _called("gemma_rmsnorm_cpu", input)
    _check_2d("gemma_rmsnorm_cpu", input, weight, contiguous=False)
    return (_normed(input.float(), eps) * (1.0 + weight.float())).to(input.dtype)


def gemma_fused_add_rmsnorm_cpu(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                eps: float) -> None:
    """In place, as :func:`fused_add_rmsnorm_cpu` with ``(1 + weight)``."""
    _fused_add("gemma_fused_add_rmsnorm_cpu", input, residual, 1.0 + weight.float(), eps)


def _fused_add(name: str, input: torch.Tensor, residual: torch.Tensor, scale: torch.Tensor, eps: float) -> None:
    _called(name, input)
    _check_2d(name, input, scale)
    _check(name, residual.shape == input.shape and residual.is_contiguous(),
           f"residual {tuple(residual.shape)} stride {residual.stride()} must be contiguous and "
           f"shaped like input {tuple(input.shape)}")
    total = input.float() + residual.float()
    residual.copy_(total)
    input.copy_(_normed(total, eps) * scale)


def gemma3_rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """New tensor shaped like ``input`` (2-D to 4-D): ``rmsnorm(input) * (1 + weight)``."""
    _called("gemma3_rmsnorm_cpu", input)
    _check("gemma3_rmsnorm_cpu", 2 <= input.dim() <= 4 and input.stride(-1) == 1,
           f"expected a 2-D to 4-D input with a contiguous last dim, got {tuple(input.shape)} "
           f"stride {input.stride()}")
    return (_normed(input.float(), eps) * (1.0 + weight.float())).to(input.dtype)


def gemma4_rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float, scale_shift: float,
                       with_scale: bool) -> torch.Tensor:
    """New tensor shaped like ``input`` (2-D or 3-D): ``norm(x) * (weight + scale_shift)``
    when ``with_scale``, else ``norm(x)``."""
    _called("gemma4_rmsnorm_cpu", input)
    _check("gemma4_rmsnorm_cpu", input.dim() in (2, 3) and input.stride(-1) == 1,
           f"expected a 2-D or 3-D input with a contiguous last dim, got {tuple(input.shape)}")
    out = _normed(input.float(), eps)
    if with_scale:
        out = out * (weight.float() + float(scale_shift))
    return out.to(input.dtype)


def layernorm_cpu(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """New tensor: ``layer_norm(input) * weight + bias`` over the last dimension."""
    _called("layernorm_cpu", input)
    _check("layernorm_cpu", input.stride(-1) == 1, f"input {tuple(input.shape)} last dim is not contiguous")
    out = torch.nn.functional.layer_norm(input.float(), (input.shape[-1],), weight.float(),
                                         None if bias is None else bias.float(), float(eps))
    return out.to(input.dtype)


#: name -> stand-in, registered as ``torch.ops.sgl_kernel.<name>`` by the package.
NORM_OPS: dict[str, Any] = {
    "rmsnorm_cpu": rmsnorm_cpu,
    "fused_add_rmsnorm_cpu": fused_add_rmsnorm_cpu,
    "gemma_rmsnorm_cpu": gemma_rmsnorm_cpu,
    "gemma_fused_add_rmsnorm_cpu": gemma_fused_add_rmsnorm_cpu,
    "gemma3_rmsnorm_cpu": gemma3_rmsnorm_cpu,
    "gemma4_rmsnorm_cpu": gemma4_rmsnorm_cpu,
    "layernorm_cpu": layernorm_cpu,
}

