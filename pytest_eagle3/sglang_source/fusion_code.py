"""Whether the installed SGLang has the all-reduce fusion gate the CPU tier can open.

Read from the installed files, without importing SGLang
(:mod:`pytest_eagle3.worker.cpu.allreduce_fusion` says what the engine then
overrides).  sglang 0.5.23: ``flashinfer_ar_fusion_applies`` in
``srt/layers/layer_boundary/residual/add_norm.py`` reads the module globals
``_is_sm90_supported``, ``_is_sm100_supported``, ``_is_flashinfer_available``
and ``get_exec().comm.flashinfer_allreduce_fusion_backend``; the fused op is
``flashinfer_allreduce_residual_rmsnorm`` in ``srt/layers/flashinfer_comm_fusion.py``.
A fork without them (older releases fused in ``layer_communicator``) gets one
line and no fusion on CPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pytest_eagle3.sglang_source.norm_code import read_installed

GATE_FILE = "srt/layers/layer_boundary/residual/add_norm.py"
OP_FILE = "srt/layers/flashinfer_comm_fusion.py"
GATE_FN = "flashinfer_ar_fusion_applies"
OP_FN = "flashinfer_allreduce_residual_rmsnorm"
#: What the gate function must read for the override to reach it.
GATE_READS = ("_is_sm90_supported", "_is_flashinfer_available", "flashinfer_allreduce_fusion_backend")


@dataclass(frozen=True)
class FusionCode:
    """Attributes:
        gate: ``file:line`` of the gate function, or ``""``.
        op: ``file:line`` of the fused op, or ``""``.
        refusal: why the CPU tier cannot run the fused path here (one line), or ``None``.
    """

    gate: str
    op: str
    refusal: str | None

    def describe(self) -> str:
        if self.refusal is not None:
            return f"not available on this SGLang: {self.refusal}"
        return (f"SGLang's fused path: the platform conditions of {GATE_FN} ({self.gate}: sm90/sm100, "
                f"flashinfer available, fusion backend) overridden in that module alone, {OP_FN} "
                f"({self.op}) served by a gloo stand-in")


def _def_line(text: str | None, name: str) -> int:
    if text is None:
        return 0
    m = re.search(rf"^def {name}\(", text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else 0


def read_fusion_code(gate_text: str | None, op_text: str | None) -> FusionCode:
    """From the texts of :data:`GATE_FILE` and :data:`OP_FILE` (``None``: missing)."""
    gate_line, op_line = _def_line(gate_text, GATE_FN), _def_line(op_text, OP_FN)
    refusal = None
    if not gate_line:
        refusal = f"{GATE_FILE} has no {GATE_FN} (fusion decided elsewhere in this SGLang)"
    elif not op_line:
        refusal = f"{OP_FILE} has no {OP_FN}"
    else:
        body = gate_text[gate_text.index(f"def {GATE_FN}("):]
        first = body.find("\n") + 1
        end = re.search(r"^\S", body[first:], re.M)
        body = body[: first + end.start()] if end else body
        lacking = [name for name in GATE_READS if name not in body]
        if lacking:
            refusal = f"{GATE_FILE}:{gate_line} {GATE_FN} does not read {', '.join(lacking)}"
    return FusionCode(f"{GATE_FILE}:{gate_line}" if gate_line else "", f"{OP_FILE}:{op_line}" if op_line else "",
                      refusal)


def fusion_code_at(location: str | Path) -> FusionCode:
    """:func:`read_fusion_code` of the SGLang package at ``location``."""
    return read_fusion_code(read_installed(location, GATE_FILE), read_installed(location, OP_FILE))
