"""Names for the residual-stream snapshots every convention is translated into.

A *snapshot* is one tensor of the target's residual stream for every token of a
prompt, ``[tokens, hidden]``.  Snapshots are identified by their index in the
``output_hidden_states`` tuple ``hs`` of transformers' ``DeepseekV3ForCausalLM``
(measured on transformers 5.x; docs/design.md, "Ground truth"):

* ``hs[0]``: the embedding output (input of layer 0);
* ``hs[k]`` for ``1 <= k <= L-1``: the output of layer ``k-1`` = input of layer
  ``k`` (the full residual stream, ``hidden_states + residual``);
* ``hs[L]``: the output of the final RMSNorm;
* :data:`FINAL_PRENORM` (stored as index ``L+1``): the output of the last layer
  before the final norm, which ``hs`` does not contain.

Also how the reports write relative errors and tables of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Symbolic index of the pre-final-norm output of the last layer.
FINAL_PRENORM = "final_prenorm"


def prenorm_index(num_layers: int) -> int:
    """Storage index of :data:`FINAL_PRENORM` in a ``[L+2, tokens, hidden]`` stack."""
    return num_layers + 1


def label(index: int, num_layers: int) -> str:
    """Short label of a snapshot index, e.g. ``hs[3]`` or ``final_prenorm``."""
    if index == prenorm_index(num_layers):
        return FINAL_PRENORM
    return f"hs[{index}]"


def describe(index: int, num_layers: int) -> str:
    """Human meaning of a snapshot index, e.g. ``input of layer 3``.

    Raises:
        ValueError: ``index`` is outside ``0 .. L+1``.
    """
    L = num_layers
    if index == 0:
        return "embedding"
    if 1 <= index <= L - 1:
        return f"input of layer {index}"
    if index == L:
        return "final norm output"
    if index == L + 1:
        return f"output of layer {L - 1} before the final norm"
    raise ValueError(f"snapshot index {index} is outside 0..{L + 1} for {L} layers")


def full_label(index: int, num_layers: int) -> str:
    """``hs[3] (input of layer 3)``."""
    return f"{label(index, num_layers)} ({describe(index, num_layers)})"


def fmt_err(x: float) -> str:
    """``0.004``, ``0.61``, ``6e-06``: two significant digits."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.2g}"


#: How the reports define rel.err (under their tables).
ERR_DEFINITION = "rel.err = ||{a} - {b}|| / ||{b}||, float64"


def nan_last(x: float) -> float:
    """Sort key of an error: NaN ranks after every number (as ``inf``)."""
    return math.inf if math.isnan(x) else x


def grid(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as left-aligned columns two spaces apart (trailing blanks cut)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
