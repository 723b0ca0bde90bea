"""The layer-id lists of the id variants (:mod:`pytest_eagle3.engine.variants`),
from ``(num_layers, first_k_dense_replace)``.  Nothing here imports torch or sglang."""

from __future__ import annotations


def ids_at_first_k_dense(num_layers: int, first_k_dense: int) -> tuple[int, ...]:
    """``(0, k, k+1)`` for ``k = first_k_dense_replace``, inside ``0 .. L-1``.

    The input of layer ``k`` is the last dense layer's output, the input of
    ``k+1`` the first MoE layer's output (the all-gather boundary of PR #14280).
    The list starts with 0 so SGLang 0.5.23's "+1 when the first id is 1" rule
    does not shift it.
    """
    ids = [0, first_k_dense, first_k_dense + 1]
    return tuple(sorted({i for i in ids if 0 <= i < num_layers}))


def ids_last_capturable(num_layers: int, first_k_dense: int) -> tuple[int, ...]:
    """``(0, L//2, L-1)``: the input of the last layer is the deepest id SGLang
    captures (``i >= L`` never is)."""
    return tuple(sorted({0, num_layers // 2, num_layers - 1}))
