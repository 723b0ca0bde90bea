"""Which norm path the CPU tier runs, read from the installed ``srt/layers/layernorm.py``.

Every production SGLang runs its norms in place: on CUDA ``forward_cuda`` ->
``fused_add_rmsnorm``, on Xeon AMX servers ``forward_cpu`` ->
``torch.ops.sgl_kernel.fused_add_rmsnorm_cpu`` (sglang 0.5.23
``srt/layers/layernorm.py:879-899``): the residual add overwrites ``residual``
and the norm overwrites ``x``.  A plain CPU without AMX runs ``forward_native``,
out of place, so a capture that keeps a view of a tensor the next in-place norm
rewrites is right there and wrong in production.

The CPU tier can run SGLang's own AMX norm branch: the branch is gated on one
module global, ``_is_cpu_amx_available = cpu_has_amx_support()``
(``layernorm.py:55``), and calls sgl-kernel CPU ops that pytest-eagle3's
stand-in ``sgl_kernel`` provides with the real ops' in-place contract
(``worker/cpu/shim/sgl_kernel/_norm.py``).  The engine flips that global alone,
in layernorm's module only (:mod:`pytest_eagle3.worker.cpu.norms`).

This module decides, without importing SGLang, whether the installed file
has that branch and calls only ops the stand-in has, with the argument count
it takes.  A fork whose norm code differs gets :attr:`NormCode.refusal`, one
line, and the native path.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

#: The installed file this module reads.
LAYERNORM_FILE = "srt/layers/layernorm.py"
#: The module global SGLang gates its AMX kernels on.
GATE = "_is_cpu_amx_available"
#: Where 0.5.23 decides which forward a norm runs (``BaseFusedOp``).
DISPATCH_FILE = "kernels/fused_op.py"
#: The dispatch function that answers ``"cpu"`` only on an AMX CPU.
DISPATCH_FN = "_platform_key"
#: The op whose presence makes the path in place.
IN_PLACE_OP = "fused_add_rmsnorm_cpu"

#: sgl-kernel CPU op -> positional arguments the stand-in takes (sgl-kernel
#: ``csrc/cpu/norm.cpp`` signatures; ``tests/unit/test_norm_path.py`` checks the
#: stand-in's functions against this table).
STANDIN_ARITY: dict[str, int] = {
    "rmsnorm_cpu": 3,
    "fused_add_rmsnorm_cpu": 4,
    "gemma_rmsnorm_cpu": 3,
    "gemma_fused_add_rmsnorm_cpu": 4,
    "gemma3_rmsnorm_cpu": 3,
    "gemma4_rmsnorm_cpu": 5,
    "layernorm_cpu": 4,
}

#: Values of ``--eagle3-cpu-norm``.
INPLACE, NATIVE, AUTO = "inplace", "native", "auto"
NORM_PATHS = (AUTO, INPLACE, NATIVE)

NO_FILE = "the installed SGLang has no {file}"
NO_DISPATCH = ("{file}: no {fn}() choosing forward_cpu on an AMX CPU (cpu_has_amx_support); this SGLang "
               "dispatches its norms some other way")
NO_GATE = "{file} has no module global {gate}"
NO_BRANCH = "{file}: RMSNorm.forward_cpu has no branch on {gate} calling sgl_kernel.{op}"
UNKNOWN_OP = ("{file}:{line}: {cls}.forward_cpu calls sgl_kernel.{op}, which pytest-eagle3's CPU stand-in "
              "lacks")
ARITY = ("{file}:{line}: {cls}.forward_cpu passes {n} arguments to sgl_kernel.{op}; the stand-in takes "
         "{want} (sgl-kernel csrc/cpu/norm.cpp)")


@dataclass(frozen=True)
class KernelCall:
    """One ``torch.ops.sgl_kernel.<op>(...)`` call in a gated ``forward_cpu``.

    Attributes:
        cls: the norm class (``RMSNorm``).
        op: the sgl-kernel op (``fused_add_rmsnorm_cpu``).
        line: 1-based line in :data:`LAYERNORM_FILE`.
        nargs: positional arguments passed.
    """

    cls: str
    op: str
    line: int
    nargs: int


@dataclass(frozen=True)
class NormCode:
    """What the installed layernorm file does on CPU.

    Attributes:
        file: the file read (relative to the sglang package).
        gate_line: line of the ``_is_cpu_amx_available = ...`` assignment (0: none).
        calls: the gated kernel calls, in file order.
        refusal: why the in-place path cannot run here (one line), or ``None``.
    """

    file: str
    gate_line: int
    calls: tuple[KernelCall, ...]
    refusal: str | None

    @property
    def inplace_available(self) -> bool:
        return self.refusal is None

    def call(self, op: str) -> KernelCall | None:
        return next((c for c in self.calls if c.op == op), None)

    def describe_inplace(self) -> str:
        """``RMSNorm.forward_cpu -> sgl_kernel.fused_add_rmsnorm_cpu (srt/layers/layernorm.py:890)``."""
        call = self.call(IN_PLACE_OP)
        where = f"{self.file}:{call.line}" if call else self.file
        return (f"{call.cls if call else 'RMSNorm'}.forward_cpu -> sgl_kernel.{IN_PLACE_OP} ({where}); "
                f"the norms dispatch as on an AMX CPU ({DISPATCH_FILE} {DISPATCH_FN}) and "
                f"{GATE} ({self.file}:{self.gate_line}) is true in layernorm alone")


def _kernel_op(node: ast.Call) -> str | None:
    """``torch.ops.sgl_kernel.<op>(...)`` -> ``op``."""
    f = node.func
    if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "sgl_kernel"
            and isinstance(f.value.value, ast.Attribute) and f.value.value.attr == "ops"):
        return f.attr
    return None


def _gated_calls(cls: ast.ClassDef) -> list[KernelCall]:
    """Kernel calls inside ``if _is_cpu_amx_available...:`` in the class's ``forward_cpu``."""
    out: list[KernelCall] = []
    for fn in cls.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "forward_cpu"):
            continue
        for branch in ast.walk(fn):
            if not isinstance(branch, ast.If):
                continue
            if not any(isinstance(n, ast.Name) and n.id == GATE for n in ast.walk(branch.test)):
                continue
            for stmt in branch.body:
                for node in ast.walk(stmt):
                    if isinstance(node, ast.Call) and (op := _kernel_op(node)) is not None:
                        out.append(KernelCall(cls.name, op, node.lineno, len(node.args)))
    return out


def _dispatch_refusal(dispatch_text: str | None) -> str | None:
    """Why ``fused_op.py`` does not dispatch norms as :mod:`pytest_eagle3.worker.cpu.norms` expects."""
    if dispatch_text is None:
        return NO_FILE.format(file=DISPATCH_FILE)
    m = re.search(rf"^def {DISPATCH_FN}\(.*?(?=^\S)", dispatch_text + "\nEND", re.M | re.S)
    if m is None or "cpu_has_amx_support" not in m.group(0) or '"cpu"' not in m.group(0) \
            or "def _resolve_forward_method" not in dispatch_text:
        return NO_DISPATCH.format(file=DISPATCH_FILE, fn=DISPATCH_FN)
    return None


@functools.lru_cache(maxsize=16)
def read_norm_code(text: str | None, file: str = LAYERNORM_FILE, dispatch_text: str | None = "") -> NormCode:
    """Parse ``layernorm.py`` source ``text`` (``None``: the file is missing) and
    ``kernels/fused_op.py`` source ``dispatch_text`` (``None``: missing; ``""``:
    not checked).  Cached by the texts (every engine's configuration reads the
    same files; the result is frozen)."""
    if text is None:
        return NormCode(file, 0, (), NO_FILE.format(file=file))
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        return NormCode(file, 0, (), f"{file} does not parse: {exc}")
    gate_line = next((n.lineno for n in tree.body if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == GATE for t in n.targets)), 0)
    calls: list[KernelCall] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            calls.extend(_gated_calls(node))
    calls.sort(key=lambda c: c.line)
    refusal = None
    if not gate_line:
        refusal = NO_GATE.format(file=file, gate=GATE)
    elif not any(c.cls == "RMSNorm" and c.op == IN_PLACE_OP for c in calls):
        refusal = NO_BRANCH.format(file=file, gate=GATE, op=IN_PLACE_OP)
    elif dispatch_text != "" and (why := _dispatch_refusal(dispatch_text)) is not None:
        refusal = why
    else:
        for c in calls:
            want = STANDIN_ARITY.get(c.op)
            if want is None:
                refusal = UNKNOWN_OP.format(file=file, line=c.line, cls=c.cls, op=c.op)
            elif want != c.nargs:
                refusal = ARITY.format(file=file, line=c.line, cls=c.cls, n=c.nargs, op=c.op, want=want)
            if refusal:
                break
    return NormCode(file, gate_line, tuple(calls), refusal)


def read_installed(location: str | Path, rel: str) -> str | None:
    """Text of ``rel`` inside the SGLang package at ``location``; ``None`` when unreadable."""
    try:
        return (Path(location) / rel).read_text(encoding="utf-8")
    except OSError:
        return None


def norm_code_at(location: str | Path) -> NormCode:
    """:func:`read_norm_code` of the installed SGLang at ``location`` (the ``sglang`` package dir)."""
    return read_norm_code(read_installed(location, LAYERNORM_FILE),
                          dispatch_text=read_installed(location, DISPATCH_FILE))


def resolve_norm_path(requested: str, code: NormCode) -> tuple[str, str]:
    """``(path, why)``: the norm path an engine runs, and one line saying why.

    ``requested`` is ``auto`` (in place where the installed file allows),
    ``inplace`` or ``native``.  ``inplace`` on a file that refuses gives the
    native path with the refusal, never an error.
    """
    if requested == NATIVE:
        return NATIVE, "forward_native, out of place (--eagle3-cpu-norm native)"
    if code.refusal is not None:
        return NATIVE, f"forward_native, out of place: {code.refusal}"
    return INPLACE, f"in place, as on Xeon AMX: {code.describe_inplace()}"

