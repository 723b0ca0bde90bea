"""CPU-tier fixes for gaps of SGLang's own CPU mode, applied inside SGLang's
processes (never in the test process) by :mod:`pytest_eagle3.worker.cpu.fills`.

Each fix routes around a missing CPU kernel or dispatcher entry; none touches
the code pytest-eagle3 tests (aux hidden state capture, collectives, the
embedding, the logits processor, the speculative worker).  Sources are in
docs/design.md, "SGLang on a plain x86 CPU", measured on sglang 0.5.23.
"""

from __future__ import annotations

import contextlib
import logging
import os
from types import SimpleNamespace
from typing import Any

logger = logging.getLogger("pytest_eagle3.cpu")

SBO_STREAM_LINE = ("pytest-eagle3: single-batch overlap's second stream stood in on CPU: {cls} runs its shared "
                   "experts in the dispatcher's combine hooks, in order (pid {pid})")


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


#: SM counts the CPU tier reports to two-batch overlap's operation strategies: an
#: H100's 132 SMs and 20 for communication kernels.  They only size DeepGEMM's SM
#: split, which does nothing without DeepGEMM (none on CPU).
STANDIN_SMS = 132
STANDIN_COMM_SMS = 20
TBO_SM_LINE = "pytest-eagle3: two-batch overlap's SM counts stood in on CPU ({sms} SMs, {comm} for communication)"


class Namespace:
    """An object answering its own attributes first and ``base``'s for every other name."""

    def __init__(self, base: Any, **own: Any) -> None:
        self.__dict__.update(own)
        self._base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def torch_with_cuda(real: Any, **cuda: Any) -> Any:
    """``real`` (torch) whose ``cuda`` answers the functions in ``cuda`` itself; every other
    attribute, of torch and of ``torch.cuda``, is torch's own."""
    return Namespace(real, cuda=Namespace(real.cuda, **cuda))


def tbo_sm_count(module: Any) -> None:
    """Give two-batch overlap's operation strategies the SM counts they ask the GPU for.

    0.5.23's ``srt/batch_overlap/operations_strategy.py`` builds each TBO layer's
    operation list with ``torch.cuda.get_device_properties("cuda").multi_processor_count``
    (lines 106, 252, 329) minus ``DeepEPConfig.get_instance().num_sms`` (110, 256,
    331), to split SMs between DeepGEMM and communication
    (``deep_gemm_wrapper.configure_deep_gemm_num_sms``).  On CPU the first raises
    "Found no NVIDIA driver" and the second needs ``deep_ep``.  This gives the
    module a ``torch`` whose ``cuda.get_device_properties`` reports
    :data:`STANDIN_SMS` (every other attribute is torch's own) and a
    ``DeepEPConfig`` reporting :data:`STANDIN_COMM_SMS`; the operations
    themselves are SGLang's.  A no-op where CUDA is available.
    """
    import torch

    if torch.cuda.is_available() or not hasattr(module, "torch"):
        return

    def get_device_properties(device: Any = None) -> SimpleNamespace:  # noqa: ARG001
        return SimpleNamespace(multi_processor_count=STANDIN_SMS, name="pytest-eagle3 CPU stand-in")

    class _DeepEPConfig:
        @classmethod
        def get_instance(cls) -> SimpleNamespace:
            return SimpleNamespace(num_sms=STANDIN_COMM_SMS)

    module.torch = torch_with_cuda(module.torch, get_device_properties=get_device_properties)
    module.DeepEPConfig = _DeepEPConfig
    logger.warning(TBO_SM_LINE.format(sms=STANDIN_SMS, comm=STANDIN_COMM_SMS))


#: Logged once per process at the first ``wait_stream`` of a named :class:`CpuStream`
#: (the proof that SBO's hooks ran: :mod:`pytest_eagle3.engine.standin_proof`).
SBO_CALLED_LINE = "pytest-eagle3 SBO stand-in: {name}.wait_stream called (pid {pid})"
_sbo_called: set[str] = set()


class CpuStream:
    """A CUDA stream's contract on CPU, as far as SBO's hooks use it: work issued on it has
    run when the call returns, so ``wait_stream`` has nothing to wait for.  A stream with a
    ``name`` logs :data:`SBO_CALLED_LINE` at its first ``wait_stream`` in the process."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def wait_stream(self, stream: Any) -> None:  # noqa: ARG002 - CPU work is already done
        if self.name and self.name not in _sbo_called:
            _sbo_called.add(self.name)
            logger.warning(SBO_CALLED_LINE.format(name=self.name, pid=os.getpid()))


def sbo_streams(module: Any) -> None:
    """Give single-batch overlap's shared experts the second stream they run on.

    With ``--enable-single-batch-overlap`` 0.5.23's ``DeepseekV2MoE`` runs its
    shared experts inside the MoE dispatcher's combine hooks
    (``_fuse_shared_experts_inside_sbo``, from ``SboFlags.fuse_shared_experts_inside_sbo``
    of ``srt/batch_overlap/single_batch_overlap.py``): in ``forward_normal`` the
    pre-combine hook issues them on ``self.alt_stream`` after
    ``alt_stream.wait_stream(current_stream())``, the post-combine hook makes the
    current stream wait for it (``srt/models/deepseek_v2.py:1375-1402``).
    ``DeepseekV2Model`` creates that stream only on CUDA, MUSA or with a
    multi-stream switch (``:2951``), so on CPU the first hook fails,
    ``AttributeError: 'NoneType' object has no attribute 'wait_stream'`` (``:1382``).

    This gives such an MoE a :class:`CpuStream` for the duration of each
    ``forward_normal`` call only (``alt_stream`` stays ``None`` for every branch
    choice made outside it, e.g. the dual-stream path of ``forward``), and the
    module a ``torch`` whose ``cuda.current_stream`` is a :class:`CpuStream` too and
    whose ``cuda.stream`` enters nothing; every other attribute is torch's own, and
    those two calls fail on CPU without it.  The hooks, the shared experts and the
    sum are SGLang's, run in order.  A no-op where CUDA is available or the module
    has no ``DeepseekV2MoE.forward_normal``.
    """
    import torch

    cls = getattr(module, "DeepseekV2MoE", None)
    original = getattr(cls, "forward_normal", None)
    if torch.cuda.is_available() or original is None or not hasattr(module, "torch"):
        return
    current, alt = CpuStream(), CpuStream("alt_stream")
    proxy = torch_with_cuda(module.torch, current_stream=lambda device=None: current,
                            stream=lambda stream: contextlib.nullcontext())

    def forward_normal(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_fuse_shared_experts_inside_sbo", False) or getattr(self, "alt_stream", 0) is not None:
            return original(self, *args, **kwargs)
        if module.torch is not proxy:
            module.torch = proxy
            logger.warning(SBO_STREAM_LINE.format(cls=cls.__name__, pid=os.getpid()))
        self.alt_stream = alt
        try:
            return original(self, *args, **kwargs)
        finally:
            self.alt_stream = None

    cls.forward_normal = forward_normal


INPUT_SCATTERED_LINE = ("pytest-eagle3: input-scattered attention's device condition stood in on CPU: "
                        "AttnTpContext.init_context reads _is_cuda True; its other conditions are SGLang's (pid {pid})")


def input_scattered_platform(module: Any) -> None:
    """Let SGLang's own context turn input-scattered attention on at TP > 1 on CPU.

    ``AttnTpContext.init_context`` (0.5.23 ``srt/layers/layer_boundary/adapters/attention.py:78-95``)
    allows it only where ``input_scattered_configured()`` holds (the flag, TP > 1,
    no attention DP, no a2a MoE backend, no fully data-parallel dense FFN) and the
    process is on CUDA or NPU, the model has ``q_lora_rank``, no DSA indexer, no
    piecewise prefill graph and no EAGLE-3 speculative algorithm.  On CPU only the
    device condition fails; this answers it (the module's ``_is_cuda``, read by
    ``init_context`` alone) for engines started with ``--enable-attn-tp-input-scattered``,
    and leaves every other condition, and the collectives the route runs (the TP
    group's ``reduce_scatter_tensor`` and ``all_gather_into_tensor``, gloo on CPU), to SGLang.
    A no-op where CUDA is available or the module has no ``_is_cuda``.
    """
    import torch

    if torch.cuda.is_available() or not hasattr(module, "_is_cuda") or not hasattr(module, "AttnTpContext"):
        return
    module._is_cuda = True
    logger.warning(INPUT_SCATTERED_LINE.format(pid=os.getpid()))
