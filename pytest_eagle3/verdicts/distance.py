"""The one distance every check uses: relative L2 error in float64.

``rel_err(a, b) = |a - b| / |b|`` over all elements (or along ``dim``), in
float64 whatever the inputs' dtype.  A zero reference gives ``0.0`` when ``a``
is zero too and ``inf`` otherwise, so a capture of zeros never matches a
non-zero snapshot and a zero row never divides by zero.  Shapes must match;
:func:`rel_err_or_inf` returns ``inf`` for a shape mismatch instead.

Used by the per-slot comparison (:mod:`.compare`), the diagnosis
(:mod:`.diagnose`), the per-rank checks (:mod:`.rankcheck`), the embedding
rows (:mod:`.embedding`) and the pair checks (:mod:`.paths`: draft path vs
capture-only, a radix-cache hit vs its fresh send).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def rel_err(a: "torch.Tensor", b: "torch.Tensor", dim: Any = None) -> Any:
    """Relative L2 error of ``a`` against the reference ``b`` (same shape).

    Returns a float (``dim=None``) or a float64 tensor over the remaining dims.
    """
    import torch

    a64, b64 = torch.as_tensor(a).to(torch.float64), torch.as_tensor(b).to(torch.float64)
    diff = torch.linalg.vector_norm(a64 - b64, dim=dim)
    norm = torch.linalg.vector_norm(b64, dim=dim)
    if dim is None:
        d, n = float(diff), float(norm)
        if n == 0:
            return 0.0 if d == 0 else math.inf
        return d / n
    return torch.where(norm > 0, diff / norm.clamp_min(1e-300),
                       torch.where(diff == 0, torch.zeros_like(diff), torch.full_like(diff, math.inf)))


def rel_err_or_inf(a: "torch.Tensor", b: "torch.Tensor") -> float:
    """:func:`rel_err` over all elements, ``inf`` when the shapes differ, ``0`` for two empty tensors."""
    if tuple(a.shape) != tuple(b.shape):
        return math.inf
    if a.numel() == 0:
        return 0.0
    return float(rel_err(a, b))


#: A capture off by less than this relative error, every slot the snapshot it
#: should hold, is that snapshot copied at a lower precision, not another value.
PRECISION_CEILING = 2e-2
#: Unit roundoff of the formats a copy may have gone through.
FP16_ROUNDOFF, BF16_ROUNDOFF = 2.0 ** -11, 2.0 ** -8


def roundoff_name(err: float) -> str:
    """What a relative error of ``err`` on the right snapshot is the size of: a
    float16 round trip (up to twice its unit roundoff, 4.9e-4), a bfloat16 one
    (3.9e-3), or larger than both."""
    if err <= 2 * FP16_ROUNDOFF:
        return "the size of a float16 round trip (unit roundoff 4.9e-04)"
    if err <= 2 * BF16_ROUNDOFF:
        return "the size of a bfloat16 round trip (unit roundoff 3.9e-03)"
    return "larger than a bfloat16 round trip"
