"""CPU-tier fills for gaps that downstream forks add to SGLang's CPU mode.

Found on sglang-kt 0.7.2 (the KTransformers fork: distribution ``sglang-kt``,
package ``sglang``), each by reading the installed code, never from a version
or distribution name; none fires on upstream sglang 0.5.23:

* **A CUDA capability query at import.**  ``srt/utils/common.py``
  ``mxfp8_block_convert_required()`` calls ``torch.cuda.get_device_capability()``
  whenever ``torch.version.hip`` is unset, and ``srt/layers/quantization/fp8.py``
  calls it at import (sglang-kt 0.7.2 ``fp8.py:100``), so every SGLang process
  dies with ``RuntimeError: Found no NVIDIA driver`` on a machine without CUDA.
  Feature test (worker side, :func:`capability_query`): with no CUDA, calling
  the function raises.  Fill: it answers ``False`` (convert no MXFP8 weights:
  the CPU tier loads none).
* **A config switch that replaces the checkpoint's config.**  ``srt/environ.py``
  defines ``SGLANG_APPLY_CONFIG_BACKUP`` (default ``auto``), and
  ``srt/utils/hf_transformers_utils.py`` then loads a packaged DeepSeek-V4
  config instead of the checkpoint's for any DeepSeek checkpoint (43 layers,
  page size 64, a Triton kernel at the first request).  Fill: the engine's
  environment sets it to ``none``, the value the fork documents as "use
  checkpoint's config.json".
* **A CUDA-only GEMM backend for the MoE gate.**  The target's model file calls
  ``linear_bf16_fp32`` on a branch no ``not _is_cuda`` test guards, and its
  backend comes from ``SGLANG_OPT_BF16_FP32_GEMM_ALGO`` (default ``cublas``:
  a JIT-compiled cuBLAS extension, which fails in ``_get_cuda_arch_flags``).
  Fill: the engine's environment names a backend the dispatcher does not know,
  which takes its plain-torch branch (``torch.nn.functional.linear`` in fp32).

Nothing here touches capture, collectives, the embedding, the logits
processor or the speculative worker.  The environment settings are read in the test process
(:mod:`pytest_eagle3.sglang_source.env_fills`); :func:`capability_query` runs inside SGLang's processes,
when :mod:`pytest_eagle3.worker.cpu.fills` hooks it to ``srt/utils/common.py``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger("pytest_eagle3.cpu")


def capability_query(common: Any) -> None:
    """Answer ``mxfp8_block_convert_required()`` on a machine without CUDA (see the module docstring)."""
    fn = getattr(common, "mxfp8_block_convert_required", None)
    if not callable(fn):
        return
    try:
        import torch

        if torch.cuda.is_available():
            return
    except Exception:  # noqa: BLE001 - no torch: nothing to decide here
        return
    try:
        fn()
        return
    except (RuntimeError, AssertionError) as exc:  # no driver / torch built without CUDA
        error = exc
    def answer() -> bool:
        return False

    common.mxfp8_block_convert_required = answer
    import sys

    package = sys.modules.get("sglang.srt.utils")  # re-exports common's names (``from .common import *``)
    if package is not None and getattr(package, "mxfp8_block_convert_required", None) is fn:
        package.mxfp8_block_convert_required = answer
    logger.warning("pytest-eagle3 CPU tier (pid %d): %s.mxfp8_block_convert_required() queried CUDA without "
                   "CUDA (%s); it answers False (no MXFP8 weights on the CPU tier)",
                   os.getpid(), common.__name__, str(error).splitlines()[0][:120])

