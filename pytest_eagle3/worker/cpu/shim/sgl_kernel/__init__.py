"""pytest-eagle3's CPU stand-in for ``sgl_kernel`` (test infrastructure, not SGLang).

PyPI's ``sgl_kernel``/``sglang-kernel`` is CUDA-only and fails to import on a
machine without a GPU.  The CPU tier puts this package's parent directory first
on the SGLang worker's ``PYTHONPATH`` so that SGLang's CPU code paths find the
few bookkeeping ops they call, written here in plain torch from the documented
semantics (SGLang ``srt/mem_cache/allocation.py`` Triton reference kernels,
sgl-kernel ``csrc/cpu``).  None of them touches what pytest-eagle3 tests
(captures, collectives, embedding, logits processor, speculative worker).

Every other name resolves to a stub that raises ``NotImplementedError`` when
called, so a new op SGLang starts calling fails loudly with its name instead of
computing something wrong.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable

import torch

__version__ = "0.0.0+pytest-eagle3-cpu-standin"
PYTEST_EAGLE3_STANDIN = True

_NOT_IMPLEMENTED = (
    "pytest-eagle3's CPU stand-in sgl_kernel does not implement {name!r}; "
    "this SGLang calls it on the CPU tier (add it to "
    "pytest_eagle3/worker/cpu/shim/sgl_kernel or run the GPU tier)"
)


def _missing(name: str) -> Callable[..., Any]:
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(_NOT_IMPLEMENTED.format(name=name))

    op.__name__ = name
    op.__qualname__ = name
    return op


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)


from ._attention import decode_attention_cpu, extend_attention_cpu  # noqa: E402
from ._norm import NORM_OPS  # noqa: E402
from .mamba import TORCH_OPS as GDN_OPS  # noqa: E402
from ._qwen3_5 import TORCH_OPS as QWEN3_5_OPS  # noqa: E402
from ._speculative import (  # noqa: E402,F401
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

def _with_kv_scales(op: Callable[..., Any], scale_at: int) -> Callable[..., Any]:
    """Accept both argument lists SGLang releases pass to ``op``.

    sgl-kernel 0.3.21 (pinned by sglang 0.5.9-0.5.12) has no ``k_scale``/``v_scale``
    arguments; later ones take them at position ``scale_at`` (SGLang
    ``srt/layers/attention/intel_amx_backend.py`` of each release).  The old
    list has a tensor where the new one has ``k_scale``; unit scales are then
    inserted (no fp8 KV cache on the CPU tier).
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > scale_at and isinstance(args[scale_at], torch.Tensor):
            args = (*args[:scale_at], 1.0, 1.0, *args[scale_at:])
        return op(*args, **kwargs)

    call.__name__ = op.__name__
    call.__doc__ = op.__doc__
    call.__wrapped__ = op  # type: ignore[attr-defined]
    return call


def fused_sigmoid_mul_cpu(x: torch.Tensor, gate: torch.Tensor) -> None:
    """``x *= sigmoid(gate)`` in place, in fp32 (the attention output gate of
    ``fused_sigmoid_mul`` in SGLang ``srt/models/qwen3_5.py``); ``x`` and ``gate``
    have the same shape ``[tokens, heads * head_dim]``, any float dtype."""
    x.copy_((x.float() * gate.float().sigmoid()).to(x.dtype))


#: Ops SGLang reaches through ``torch.ops.sgl_kernel`` rather than by import.
TORCH_OPS = {
    "fused_sigmoid_mul_cpu": fused_sigmoid_mul_cpu,
    # Bound at import by srt/models/qwen3_5.py under is_cpu() (0.5.23, module level), which
    # SGLang's Qwen-VL multimodal processors also import; Qwen3.5's own layers call them.
    **QWEN3_5_OPS,
    "decode_attention_cpu": _with_kv_scales(decode_attention_cpu, 3),
    "extend_attention_cpu": _with_kv_scales(extend_attention_cpu, 6),
    # Reached only where the CPU tier runs SGLang's in-place norm branch
    # (pytest_eagle3/worker/cpu/norms.py): never on the native path.
    **NORM_OPS,
    # Qwen3-Next's and Qwen3.5's gated delta-net layers (sgl_kernel.mamba).
    **GDN_OPS,
}


def _install_torch_ops() -> None:
    """Expose :data:`TORCH_OPS` as ``torch.ops.sgl_kernel.<name>``.

    Plain attributes of the op namespace, not registered operators: the callers
    only call them eagerly (TORCHDYNAMO_DISABLE=1 on the CPU tier), and any
    other ``torch.ops.sgl_kernel`` name still raises AttributeError.
    """
    namespace = torch.ops.sgl_kernel
    for name, fn in TORCH_OPS.items():
        setattr(namespace, name, fn)


_install_torch_ops()


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of ``req_to_token``.

    For request ``i``: ``req_to_token[req_pool_indices[i], start[i]:end[i]] =
    out_cache_loc[o_i : o_i + end[i] - start[i]]`` where ``o_i`` is the sum of
    the lengths of the requests before it (SGLang ``assign_req_to_token_pool``
    Triton kernel, ``srt/mem_cache/allocation.py``).
    """
    offset = 0
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[offset : offset + n].to(
            req_to_token.dtype
        )
        offset += n


class _CpuImportedSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``sgl_kernel.<sub>`` submodules some releases import unconditionally on CPU.

    sglang 0.5.9-0.5.12 import ``sgl_kernel.kvcacheio`` at module level
    (``srt/mem_cache/memory_pool_host.py``) though the CPU tier never calls it.
    Their names resolve to the loud stubs above.  Any other submodule keeps
    raising ImportError (SGLang falls back on that elsewhere).
    """

    SUBMODULES = ("kvcacheio",)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        prefix = __name__ + "."
        if not name.startswith(prefix) or name[len(prefix):] not in self.SUBMODULES:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: Any) -> Any:
        module = types.ModuleType(spec.name)
        sub = spec.name.rsplit(".", 1)[1]

        def __getattr__(attr: str, _sub: str = sub) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _missing(f"{_sub}.{attr}")

        module.__getattr__ = __getattr__  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: Any) -> None:
        return None


if not any(isinstance(f, _CpuImportedSubmodules) for f in sys.meta_path):
    sys.meta_path.append(_CpuImportedSubmodules())
