"""Environment settings the CPU tier gives a downstream fork's engines, read from its installed files.

The test process reads the installed SGLang (never a version or distribution
name) and returns :class:`EnvFill` values; the engine's environment carries
them.  The gaps they fill, found on sglang-kt 0.7.2, are described in
:mod:`pytest_eagle3.worker.cpu.forks`, whose worker-side fill this module's
settings complement.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall


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


@functools.lru_cache(maxsize=32)
def _unguarded_call(source: str, name: str) -> bool:
    """Whether ``source`` calls ``name(...)`` in a branch that no earlier
    ``not _is_cuda`` / ``not is_cuda()`` test of its if-chain excludes from CPU.

    Cached by the text: every engine's configuration asks it of the same model
    file, and parsing 0.5.23's ``deepseek_v2.py`` takes about 0.1 s."""
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
