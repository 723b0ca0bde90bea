"""Name a capture that two-batch overlap (TBO) got wrong by its rows.

Under TBO the layers from ``first_k_dense_replace`` on run split into two
micro-batches (0.5.23 ``srt/models/deepseek_v2.py:3166-3203``); a capture of them
is per micro-batch and merged in token order (the upstream fix
``tbo-capture-per-microbatch``, ``pytest_eagle3/worker/tbo_capture.py``).  When the
wrong slots of a comparison are exactly those layers' and the others are right,
their rows tell a lost micro-batch (exact zero rows beside right ones,
``[tbo-microbatch-dropped]``) from a misplaced one (right snapshots at the wrong
rows, ``[tbo-microbatches-swapped]``).  Used by :mod:`pytest_eagle3.verdicts.diagnose`
where :attr:`~pytest_eagle3.verdicts.evidence.Evidence.tbo_split` says the engine ran TBO.

Pure functions on tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_eagle3.verdicts.distance import rel_err_or_inf
from pytest_eagle3.verdicts.evidence import Evidence

if TYPE_CHECKING:
    import torch

TBO_TEXT = (
    "slot{s} {slots} (layer{s} {layers}: from first_k_dense_replace={split} on, which run split into two "
    "micro-batches under two-batch overlap) {hold}, while {before}: {why}"
)
TBO_WHY = {
    "tbo-microbatch-dropped": "one micro-batch's captures were lost when the two were merged",
    "tbo-microbatches-swapped": "the micro-batches' captures were merged out of token order",
}


def row_ranges(ts: Sequence[int]) -> str:
    """``"0..2, 5"`` for rows ``[0, 1, 2, 5]``."""
    out, start = [], None
    ts = sorted(ts)
    for i, t in enumerate(ts):
        if start is None:
            start = t
        if i + 1 == len(ts) or ts[i + 1] != t + 1:
            out.append(str(start) if start == t else f"{start}..{t}")
            start = None
    return ", ".join(out)


def tbo_microbatch(captured: Any, reference: Any, verdicts: Sequence[Any], expected: Sequence[int], ev: Evidence,
                   *, hidden_size: int, tol: float) -> tuple[str, str] | None:
    """``(kind, text)`` when the engine ran two-batch overlap (:attr:`Evidence.tbo_split`), the
    wrong slots are exactly those of the layers it splits, the others are right, and every wrong
    slot's rows say how: exact zero rows beside right ones (``tbo-microbatch-dropped``), or right
    snapshots at the wrong rows, of this request or another of the batch
    (``tbo-microbatches-swapped``); ``None`` otherwise."""
    split = ev.tbo_split
    slots = [v for v in verdicts if v.slot < len(expected)]
    inside = [v for v in slots if split is not None and int(expected[v.slot]) >= split]
    before = [v for v in slots if split is not None and int(expected[v.slot]) < split]
    if not inside or any(v.ok for v in inside) or not all(v.ok for v in before):
        return None
    H = hidden_size
    found: set[str] = set()
    zero_rows = set()
    for v in inside:
        slot, want = captured[:, v.slot * H:(v.slot + 1) * H], reference[int(expected[v.slot])]
        zero = (slot == 0).all(dim=-1)
        if bool(zero.any()) and (bool(zero.all()) or rel_err_or_inf(slot[~zero], want[~zero]) <= tol):
            found.add("tbo-microbatch-dropped")
            zero_rows |= {t for t, z in enumerate(zero.tolist()) if z}
        elif _rows_elsewhere(slot, want, int(expected[v.slot]), ev.others, tol):
            found.add("tbo-microbatches-swapped")
        else:
            return None
    if len(found) != 1:
        return None
    (kind,) = found
    rows = captured.shape[0]
    hold = (f"hold exact zeros in rows {row_ranges(sorted(zero_rows))} of {rows} and the right snapshots in the others"
            if kind == "tbo-microbatch-dropped" else "hold the right snapshots at the wrong rows")
    plural = len(inside) > 1
    right = (f"slot{'s' if len(before) > 1 else ''} {', '.join(str(v.slot) for v in before)} (before the split) "
             f"{'are' if len(before) > 1 else 'is'} right" if before else "no slot lies before the split")
    return kind, TBO_TEXT.format(s="s" if plural else "", slots=", ".join(str(v.slot) for v in inside),
                                 layers=", ".join(str(int(expected[v.slot])) for v in inside), split=split, hold=hold,
                                 before=right, why=TBO_WHY[kind])


def _rows_elsewhere(slot: "torch.Tensor", want: "torch.Tensor", index: int, others: Mapping[str, Any],
                    tol: float) -> bool:
    """Every wrong row of ``slot`` is a row of ``want`` at another position, or another
    request's snapshot ``index`` (and at least one row is wrong)."""
    pool = [want] + [o[index] for o in others.values() if index < o.shape[0]]
    wrong = [t for t in range(slot.shape[0]) if not rel_err_or_inf(slot[t], want[t]) <= tol]
    return bool(wrong) and all(
        any(rel_err_or_inf(slot[t], rows[u]) <= tol for rows in pool for u in range(rows.shape[0])) for t in wrong)
