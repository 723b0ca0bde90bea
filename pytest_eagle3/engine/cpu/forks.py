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
processor or the speculative worker.  :func:`env_fills` runs in the test
process and reads files only; :func:`install` runs inside SGLang's processes.
"""

from __future__ import annotations

import ast
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_eagle3.engine.post_import import when_imported

if TYPE_CHECKING:
    from pytest_eagle3.engine.install import SGLangInstall

logger = logging.getLogger("pytest_eagle3.cpu")

CONFIG_BACKUP_ENV = "SGLANG_APPLY_CONFIG_BACKUP"
GEMM_ALGO_ENV = "SGLANG_OPT_BF16_FP32_GEMM_ALGO"
#: A backend name the fork's ``_dispatch_bf16_fp32_backend`` does not know: its plain-torch branch.
TORCH_GEMM = "torch"


@dataclass(frozen=True)
class EnvFill:
    """One environment setting the CPU tier gives a fork's engines.

    Attributes:
        name: the variable.
        value: what the engine gets.
        why: the file and what the feature test found there (one line).
    """

    name: str
    value: str
    why: str


def _env_default(environ_text: str, name: str) -> str | None:
    found = re.search(rf"^\s*{name}\s*=\s*Env\w*\(\s*['\"]([^'\"]*)['\"]", environ_text, re.M)
    return found.group(1) if found else None


def env_fills(install: "SGLangInstall", model_file: str | None = "srt/models/deepseek_v2.py") -> list[EnvFill]:
    """The environment fills the installed SGLang needs on CPU (see the module docstring).

    ``model_file``: the target's model file (``ModelCode.file``), read for the
    MoE-gate GEMM test.  Empty on upstream 0.5.23.
    """
    environ = install.source("srt/environ.py") or ""
    fills = []
    backup = _env_default(environ, CONFIG_BACKUP_ENV)
    loader = install.source("srt/utils/hf_transformers_utils.py") or ""
    if backup is not None and backup != "none" and f'{CONFIG_BACKUP_ENV}.get() != "none"' in loader:
        fills.append(EnvFill(CONFIG_BACKUP_ENV, "none",
                             f"srt/environ.py defines {CONFIG_BACKUP_ENV}={backup!r}: "
                             "srt/utils/hf_transformers_utils.py would replace the checkpoint's config"))
    algo = _env_default(environ, GEMM_ALGO_ENV)
    model = install.source(model_file) if model_file else None
    if (algo == "cublas" and model is not None and _unguarded_call(model, "linear_bf16_fp32")
            and _torch_fallback(install, model, "linear_bf16_fp32")):
        fills.append(EnvFill(GEMM_ALGO_ENV, TORCH_GEMM,
                             f"{model_file} calls linear_bf16_fp32 without a CUDA guard and "
                             f"srt/environ.py defaults {GEMM_ALGO_ENV} to 'cublas' (a CUDA-only JIT build)"))
    return fills


def _torch_fallback(install: "SGLangInstall", model_source: str, name: str) -> bool:
    """Whether the module the model file imports ``name`` from sends a backend
    name it does not know to plain torch (``torch.nn.functional.linear``), so
    :data:`TORCH_GEMM` selects it (sglang-kt 0.7.2 ``jit_kernel/deepseek_v4.py``
    ``_dispatch_bf16_fp32_backend``; upstream 0.5.23's dispatcher sends unknown
    names to cuBLAS, where this fill would not help)."""
    try:
        tree = ast.parse(model_source)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            if not node.module.startswith("sglang."):
                continue
            text = install.source(node.module[len("sglang."):].replace(".", "/") + ".py") or ""
            if re.search(r"else:\s*\n\s*return\s+torch\.nn\.functional\.linear\(", text):
                return True
    return False


def _unguarded_call(source: str, name: str) -> bool:
    """Whether ``source`` calls ``name(...)`` in a branch that no earlier
    ``not _is_cuda`` / ``not is_cuda()`` test of its if-chain excludes from CPU."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        seen_cpu_test = False
        branch: Any = node
        while isinstance(branch, ast.If):
            if seen_cpu_test:
                guarded.update(id(n) for stmt in branch.body for n in ast.walk(stmt))
            seen_cpu_test = seen_cpu_test or _is_not_cuda(branch.test)
            rest = branch.orelse
            if len(rest) == 1 and isinstance(rest[0], ast.If):
                branch = rest[0]
                continue
            if seen_cpu_test:
                guarded.update(id(n) for stmt in rest for n in ast.walk(stmt))
            break
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) not in guarded:
            fn = node.func
            if (isinstance(fn, ast.Name) and fn.id == name) or (isinstance(fn, ast.Attribute) and fn.attr == name):
                return True
    return False


def _is_not_cuda(test: ast.AST) -> bool:
    for n in ast.walk(test):
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            target = n.operand
            if isinstance(target, ast.Call):
                target = target.func
            if isinstance(target, ast.Name) and target.id in ("_is_cuda", "is_cuda"):
                return True
    return False


# ------------------------------------------------------------------ worker side


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


#: Worker-side fills: module -> feature-tested fix.
FIXES = {"capability_query": ("sglang.srt.utils.common", capability_query)}


def install() -> list[str]:
    """Register the worker-side fills (each tests its own gap when its module loads)."""
    for module, fn in FIXES.values():
        when_imported(module, fn)
    return list(FIXES)
