"""The CPU tier's in-place norm path, installed inside SGLang's processes.

When the engine host sets :data:`NORM_PATH_ENV` to ``inplace``
(:func:`pytest_eagle3.engine.cpu.recipe.cpu_env`, decided by
:mod:`pytest_eagle3.sglang_source.norm_code` from the installed files), this makes
the two conditions SGLang (0.5.23) puts between a norm and its AMX kernel true
for the norm classes of ``srt/layers/layernorm.py`` alone:

1. dispatch: ``BaseFusedOp`` resolves ``forward_cpu`` only when
   ``_platform_key()`` is ``"cpu"``, i.e. ``is_cpu() and cpu_has_amx_support()``
   (``sglang/kernels/fused_op.py:166-187``); else ``forward_native``.  Each norm
   class resolves its dispatch once (``_resolve_forward_method``) with that
   key answering ``"cpu"``; every other op keeps its own dispatch.
2. kernel: ``forward_cpu`` calls the sgl-kernel op only when the module global
   ``_is_cpu_amx_available`` (``layernorm.py:55``) is true; it is set true in
   that module.

``RMSNorm.forward_cpu`` and the Gemma norms then take the branch every Xeon
AMX server takes (``torch.ops.sgl_kernel.fused_add_rmsnorm_cpu`` and friends,
in place), served by the stand-in kernels of
``worker/cpu/shim/sgl_kernel/_norm.py``.  Linear, MoE, rope, activations and
attention keep their own dispatch and stay native.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from pytest_eagle3.worker.env import NORM_PATH_ENV

#: Engine env var: ``inplace`` runs SGLang's AMX norm branch; anything else, the native one.
#: Logged by every process that switched the gate (read back by the suite).
GATE_LINE = ("pytest-eagle3: in-place norm path: {classes} dispatch as on an AMX CPU, "
             "layernorm._is_cpu_amx_available set True (pid {pid})")

logger = logging.getLogger("pytest_eagle3.cpu")


def install() -> bool:
    """Switch the gate when :data:`NORM_PATH_ENV` asks for it; ``True`` when switched."""
    if os.environ.get(NORM_PATH_ENV, "") != "inplace":
        return False
    try:
        from sglang.srt.layers import layernorm
    except ImportError as exc:  # a fork without the module: the host's reader said so already
        logger.warning("pytest-eagle3: in-place norm path not installed: %s", exc)
        return False
    try:
        from sglang.kernels import fused_op
    except ImportError as exc:
        logger.warning("pytest-eagle3: in-place norm path not installed: %s", exc)
        return False
    if not (hasattr(layernorm, "_is_cpu_amx_available") and hasattr(fused_op, "_platform_key")
            and hasattr(fused_op.BaseFusedOp, "_resolve_forward_method")):
        logger.warning("pytest-eagle3: in-place norm path not installed: layernorm/fused_op lack the gates")
        return False
    classes = [obj for obj in vars(layernorm).values() if isinstance(obj, type)
               and issubclass(obj, fused_op.BaseFusedOp) and "forward_cpu" in vars(obj)]
    for cls in classes:
        cls._resolve_forward_method = _resolving_as_amx(fused_op, cls._resolve_forward_method)
    layernorm._is_cpu_amx_available = True
    logger.warning(GATE_LINE.format(pid=os.getpid(), classes=", ".join(c.__name__ for c in classes)))
    return True


def _resolving_as_amx(fused_op: Any, resolve: Any) -> Any:
    """``resolve`` run with ``fused_op._platform_key()`` answering ``"cpu"`` (an AMX CPU)."""

    def _resolve_forward_method(self: Any) -> Any:
        saved = fused_op._platform_key
        fused_op._platform_key = _amx_cpu_key
        try:
            return resolve(self)
        finally:
            fused_op._platform_key = saved

    return _resolve_forward_method


def _amx_cpu_key() -> str:
    return "cpu"
