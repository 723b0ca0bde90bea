"""The CPU tier's fills, one registry, installed inside SGLang's processes.

Every fill the ``cpu`` hook set applies (:mod:`pytest_eagle3.worker.sglang_hooks`)
is one :class:`Fill` of :data:`FILLS`, in the order :func:`install` walks them:

1. downstream forks' gaps (:mod:`pytest_eagle3.worker.cpu.forks`): first, since
   the fills below import SGLang modules, which a fork's gap (a CUDA query at
   import) would otherwise crash;
2. the in-place norm path (:mod:`pytest_eagle3.worker.cpu.norms`) and the
   all-reduce fusion stand-in (:mod:`pytest_eagle3.worker.cpu.allreduce_fusion`),
   each when the engine host set its environment variable;
3. SGLang's own CPU-mode gaps (:mod:`pytest_eagle3.worker.cpu.patches`): MLA
   routing, DP padding, two-batch overlap's SM counts, single-batch overlap's
   second stream, DeepEP's all-to-all and the experts on its layouts
   (:mod:`pytest_eagle3.worker.cpu.deepep`), the triton kernels of the
   Qwen2-MoE and MiniMax-M2 model files, the gated delta-net's norm branch
   and device (Qwen3-Next, Qwen3.5) and the stand-in ``sgl_kernel``'s
   ``torch.ops`` names imported early, before a model file binds them at import
   (:mod:`pytest_eagle3.worker.cpu.family_kernels`), the AMX platform
   fact for engines on the ``intel_amx`` attention backend, and SGLang's overlap
   schedule for speculative decoding (:mod:`pytest_eagle3.worker.cpu.spec_overlap`);
4. older releases' gaps (:mod:`pytest_eagle3.worker.cpu.older_releases`), each
   checking its own gap in the installed SGLang (a no-op on 0.5.23), and the
   server-args AMX fact for speculative engines.

A fill with a module runs when that module finishes importing
(:func:`pytest_eagle3.worker.post_import.when_imported`); one without runs at
once.  :data:`FILL_NAMES` is what the engine host reads
(:func:`pytest_eagle3.engine.variant_checks.cpu_tier_fixes`: a path that needs a fill
runs only where it exists).

Importable without torch or SGLang: the fills import them when they run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from pytest_eagle3.worker.cpu import (
    allreduce_fusion, deepep, family_kernels, forks, norms, older_releases, patches, spec_overlap,
)
from pytest_eagle3.worker.env import AMX_ATTENTION_ENV, INPUT_SCATTERED_ENV
from pytest_eagle3.worker.post_import import when_imported


def _always() -> bool:
    return True


def _inplace_norms() -> bool:
    return os.environ.get(norms.NORM_PATH_ENV, "") == "inplace"


def _fusion() -> bool:
    return os.environ.get(allreduce_fusion.FUSION_ENV, "") == "1"


def _input_scattered() -> bool:
    return os.environ.get(INPUT_SCATTERED_ENV, "") == "1"


def _speculative() -> bool:
    """The engine runs the ``intel_amx`` attention backend (EAGLE/EAGLE-3 speculative decoding)."""
    return os.environ.get(AMX_ATTENTION_ENV, "") not in ("", "0")


@dataclass(frozen=True)
class Fill:
    """One CPU-tier fill.

    Attributes:
        name: the fill's name (:data:`FILL_NAMES`).
        module: the SGLang module ``apply`` acts on, called as ``apply(module)``
            right after that module is imported; ``None``: ``apply()`` runs at
            install.
        apply: the fill; each checks its own gap and logs one line when it applies.
        condition: whether this engine's environment asks for the fill.
    """

    name: str
    module: str | None
    apply: Callable[..., Any]
    condition: Callable[[], bool] = _always


#: Every fill, in install order.
FILLS: tuple[Fill, ...] = (
    Fill("capability_query", "sglang.srt.utils.common", forks.capability_query),
    Fill("inplace_norms", None, norms.install, _inplace_norms),
    Fill("allreduce_fusion_standin", None, allreduce_fusion.install, _fusion),
    Fill("torch_native_mla_dispatch", None, patches.route_torch_native_mla),
    Fill("torch_native_dp_padding", None, patches.torch_native_dp_padding),
    Fill("tbo_sm_count", "sglang.srt.batch_overlap.operations_strategy", patches.tbo_sm_count),
    Fill("sbo_streams", "sglang.srt.models.deepseek_v2", patches.sbo_streams),
    Fill("input_scattered_platform", "sglang.srt.layers.layer_boundary.adapters.attention",
         patches.input_scattered_platform, _input_scattered),
    Fill("deepep_standin", "sglang.srt.layers.moe.token_dispatcher.deepep", deepep.install),
    Fill("deepep_experts", "sglang.srt.layers.moe.ep_moe.layer", deepep.expert_core),
    Fill("standin_torch_ops", None, family_kernels.standin_torch_ops),
    Fill("qwen2_moe_shared_gate", "sglang.srt.models.qwen2_moe", family_kernels.qwen2_moe_shared_gate),
    Fill("minimax_m2_qk_norm", "sglang.srt.models.minimax_m2", family_kernels.minimax_m2_qk_norm),
    Fill("delta_net_device", "sglang.srt.models.qwen3_next", family_kernels.delta_net_device),
    Fill("delta_net_norm", "sglang.kernels.ops.attention.fla.fused_norm_gate", family_kernels.delta_net_norm),
    Fill("delta_net_norm_gated", "sglang.kernels.ops.attention.fla.layernorm_gated", family_kernels.delta_net_norm),
    Fill("amx_attention_platform", None, patches.amx_attention_platform, _speculative),
    Fill("spec_overlap_schedule", "sglang.srt.arg_groups.speculative_hook", spec_overlap.keep_overlap_schedule,
         spec_overlap.wanted),
    Fill("spec_overlap_gather", "sglang.srt.managers.overlap_utils", spec_overlap.gather_spec_extras_standin,
         spec_overlap.wanted),
    Fill("intel_amx_speculative", "sglang.srt.layers.attention.intel_amx_backend",
         older_releases.intel_amx_speculative),
    Fill("draft_backend_factory", "sglang.srt.speculative.draft_utils", older_releases.draft_backend_factory),
    Fill("eagle_tree_kernels", "sglang.srt.speculative.eagle_utils", older_releases.eagle_tree_kernels),
    Fill("spec_utils_kernels", "sglang.srt.speculative.spec_utils", older_releases.spec_utils_kernels),
    Fill("kv_cache_copy", "sglang.srt.mem_cache.memory_pool", older_releases.kv_cache_copy),
    Fill("draft_set_embed", "sglang.srt.models.llama", older_releases.draft_set_embed),
    Fill("mla_draft_set_embed", "sglang.srt.models.kimi_k25_eagle3", older_releases.mla_draft_set_embed),
    Fill("amx_platform_fact", "sglang.srt.server_args", older_releases.amx_platform_fact, _speculative),
)

#: Names of every fill (``engine/variant_checks.py`` checks for the ones a path needs).
FILL_NAMES: frozenset[str] = frozenset(fill.name for fill in FILLS)


def apply(fill: Fill) -> None:
    """Run ``fill`` now (no module) or hook it to its module's import."""
    if fill.module is None:
        fill.apply()
    else:
        when_imported(fill.module, fill.apply)


_installed = False


def install() -> list[str]:
    """Apply every fill whose condition holds, in :data:`FILLS` order, once per
    process.  Returns the names applied or hooked (empty on a second call)."""
    global _installed
    if _installed:
        return []
    _installed = True
    names = []
    for fill in FILLS:
        if fill.condition():
            apply(fill)
            names.append(fill.name)
    return names
