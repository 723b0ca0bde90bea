"""Server arguments of an engine on CUDA: production paths on, sized for a small model.

The CPU tier (:mod:`pytest_eagle3.engine.cpu.recipe`) swaps kernels for plain
torch; on CUDA the engine runs as users run it:

* ``dtype`` bfloat16 (float16 when the target's config says so);
* the attention backend the installed SGLang picks for the GPU, unless that
  backend rejects the target's MLA widths; then :data:`FALLBACK_ATTENTION`
  (triton takes any width), named in the report header.  What the kernels
  accept (read from sglang 0.5.23 ``server_args.py`` and flashinfer sources,
  docs/design.md, "SGLang on CUDA"): trtllm-gen MLA (SGLang's DeepSeek-V3 default on
  SM100) needs ``(kv_lora_rank, qk_rope_head_dim)`` in
  :data:`TRTLLM_MLA_WIDTHS`; fa3 (the SM90 default) and FlashInfer MLA need
  bf16/fp16, the latent width a multiple of 128 and the rope width a multiple
  of 64, FlashMLA head dim 576;
* CUDA graphs on (the production path; the ``cuda-graph-off`` variant is the
  comparison), captured for small batches only (``cuda_graph_max_bs``);
* a small KV pool: ``mem_fraction_static`` :data:`MEM_FRACTION`.

Every choice is a default: ``--sglang-arg`` wins, and flags the installed SGLang
lacks are dropped (forks differ).  Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall

FALLBACK_ATTENTION = "triton"
#: (kv_lora_rank, qk_rope_head_dim) pairs trtllm-gen MLA accepts.
TRTLLM_MLA_WIDTHS = frozenset({(512, 64), (256, 64), (512, 0)})
MEM_FRACTION = 0.5
CUDA_GRAPH_MAX_BS = 8
MAX_RUNNING_REQUESTS = 16


@dataclass(frozen=True)
class CudaRecipe:
    """The CUDA defaults for one target on one GPU architecture.

    Attributes:
        args: server arguments (before the test's and the user's).
        attention: the attention backend that will run (``"sglang default"`` when
            SGLang chooses it itself).
        why: one clause saying why, for the report header.
    """

    args: dict[str, Any]
    attention: str
    why: str

    def describe(self) -> str:
        return f"dtype {self.args.get('dtype')}, attention {self.attention} ({self.why}), cuda graphs on"


def default_attention(arch: str | None) -> str:
    """The MLA backend SGLang 0.5.23 picks for DeepSeek-V3 on ``arch`` (``sm90``, ``sm100``)."""
    if arch and arch.startswith("sm10"):
        return "trtllm_mla"
    if arch == "sm90":
        return "fa3"
    return "flashinfer"


def rejects(backend: str, kv_lora_rank: int | None, rope: int | None, dtype: str) -> str | None:
    """Why ``backend`` rejects this MLA target (``None``: it accepts it)."""
    if kv_lora_rank is None or rope is None:
        return None  # not MLA: the backend's own checks apply
    if backend == "trtllm_mla" and (kv_lora_rank, rope) not in TRTLLM_MLA_WIDTHS:
        return f"trtllm_mla needs (kv_lora_rank, qk_rope_head_dim) in {sorted(TRTLLM_MLA_WIDTHS)}"
    if backend in ("fa3", "flashinfer"):
        if dtype not in ("bfloat16", "float16"):
            return f"{backend} MLA needs bf16/fp16"
        if kv_lora_rank % 128 or rope % 64:
            return f"{backend} MLA needs kv_lora_rank % 128 == 0 and qk_rope_head_dim % 64 == 0"
    return None


def cuda_recipe(install: "SGLangInstall", *, arch: str | None, kv_lora_rank: int | None = None,
                qk_rope_head_dim: int | None = None, torch_dtype: str = "bfloat16") -> CudaRecipe:
    """The CUDA defaults for a target with these MLA widths on ``arch``."""
    dtype = "float16" if torch_dtype == "float16" else "bfloat16"
    args: dict[str, Any] = {"dtype": dtype, "mem_fraction_static": MEM_FRACTION,
                            "cuda_graph_max_bs": CUDA_GRAPH_MAX_BS,
                            "max_running_requests": MAX_RUNNING_REQUESTS}
    backend = default_attention(arch)
    problem = rejects(backend, kv_lora_rank, qk_rope_head_dim, dtype)
    if problem:
        args["attention_backend"] = FALLBACK_ATTENTION
        attention, why = FALLBACK_ATTENTION, f"fallback: {problem}"
    else:
        attention, why = "sglang default", f"{backend} on {arch or 'this GPU'}"
    return CudaRecipe({k: v for k, v in args.items() if install.has_arg(k)}, attention, why)
