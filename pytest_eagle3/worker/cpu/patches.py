"""CPU-tier fixes for gaps of SGLang's own CPU mode, applied inside SGLang's
processes (never in the test process) by :mod:`pytest_eagle3.worker.cpu.fills`.

Each fix routes around a missing CPU kernel or dispatcher entry; none touches
the code pytest-eagle3 tests (aux hidden state capture, collectives, the
embedding, the logits processor, the speculative worker).  Sources are in
docs/design.md, "SGLang on a plain x86 CPU", measured on sglang 0.5.23.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("pytest_eagle3.cpu")


def amx_attention_platform() -> None:
    """Let ``--attention-backend intel_amx`` stand on a CPU without AMX.

    EAGLE/EAGLE-3 refuse ``torch_native`` (``srt/speculative/draft_utils.py``:
    no multi-step draft backend for it), and SGLang's server-argument
    resolution replaces ``intel_amx`` by ``torch_native`` when the platform
    fact ``has_amx`` is False (``srt/arg_groups/overrides.py``,
    ``_attention_backend_platform_fallbacks``).  This sets that one fact
    through SGLang's own override (``runtime_context.override_platform``),
    process-wide.  Its only other reader is the gpt-oss model override.

    The per-layer AMX switches read ``utils.common.cpu_has_amx_support()``
    directly (linear, MoE, top-k, rope, embedding, KV store; the norms' own gate is
    switched only on the in-place norm path, :mod:`pytest_eagle3.worker.cpu.norms`), not the
    platform fact, and stay False: the stand-in ``sgl_kernel`` registers no
    ``convert_weight_packed`` and this CPU has no AMX tiles.  So only the
    attention backend changes; its kernels are the stand-in's plain-torch
    ``decode_attention_cpu``/``extend_attention_cpu``.
    """
    try:
        from sglang.srt.runtime_context import override_platform
    except ImportError:  # no platform facts (before 0.5.14): older_releases.amx_platform_fact
        return
    override_platform(has_amx=True).install()
    logger.info("pytest-eagle3: platform fact has_amx forced on for the intel_amx attention backend")


def route_torch_native_mla() -> None:
    """Send DeepSeek attention on ``torch_native`` to the absorbed MLA path.

    SGLang's DeepSeek attention dispatcher (``AttentionBackendRegistry`` in
    ``srt/models/deepseek_common/attention_backend_handler.py``) has no
    ``torch_native`` entry and falls back to the ``triton`` handler, which picks
    the MHA prefill path whose shapes ``torch_native`` does not support (shape
    mismatch at the first prefill).  The absorbed MLA path computes the same
    attention with the backend's own extend/decode kernels.
    """
    try:
        from sglang.srt.models.deepseek_common.attention_backend_handler import (
            AttentionBackendRegistry,
        )
        from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import (
            AttnForwardMethod,
        )
    except ImportError:  # older layout: nothing to route
        logger.info("pytest-eagle3: no DeepSeek attention registry; MLA routing skipped")
        return

    def handle_attention_torch_native(attn, forward_batch):  # noqa: ARG001
        return AttnForwardMethod.MLA

    AttentionBackendRegistry.register("torch_native", handle_attention_torch_native)


def torch_native_dp_padding() -> None:
    """Give ``TorchNativeAttnBackend`` the padding fill value DP attention asks for.

    Under DP attention SGLang pads each DP rank's batch on CPU and asks the
    attention backend for the sequence-length fill value
    (``forward_batch_info.py`` ``_pad_inputs_to_size`` calls
    ``get_cpu_graph_seq_len_fill_value``); only the ``intel_amx`` backend has
    it, so ``torch_native`` fails at the first forward with an AttributeError.
    ``intel_amx`` returns 1; so does this.
    """
    try:
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    except ImportError:
        return
    if not hasattr(TorchNativeAttnBackend, "get_cpu_graph_seq_len_fill_value"):
        TorchNativeAttnBackend.get_cpu_graph_seq_len_fill_value = lambda self: 1
