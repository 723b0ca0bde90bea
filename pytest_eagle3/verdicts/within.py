"""Inside the named comparisons: the slots and rows a run-level cause holds.

A run-level cause names comparisons (:mod:`pytest_eagle3.verdicts.separation`);
each comparison also says which of its aux slots were wrong and, where the rows
separate clearly, which rows (:class:`pytest_eagle3.verdicts.observation.Observation`
``wrong_slots``, ``wrong_rows``).  :func:`within` narrows the cause to the
slots and the row range every wrong comparison shares, so the named cause holds
no right slot or row either: a slot only where every wrong comparison got the
same slots wrong and the others right, a row range only where every wrong
comparison is wrong on one range with the same boundary (the same start, the
same end, or both) and right on the rest.  Pure Python.
"""

from __future__ import annotations

from typing import Sequence

from pytest_eagle3.verdicts.observation import Observation

#: The attribute names :func:`within` adds to a named cause (after the table's).
SLOT, ROWS = "slot", "rows"
#: How :func:`within` words a shared row boundary (positions in the prompt).
ROWS_FROM, ROWS_BEFORE, ROWS_SPAN = "positions {start} on", "positions before {stop}", "positions {start}..{last}"
WITHIN_LINE = "  inside those comparisons: {what}"


def within(bad: Sequence[Observation]) -> list[tuple[str, frozenset[str]]]:
    """``[(SLOT, {"1", ...}), (ROWS, {"positions 16 on"})]``: the slots and the row
    range every comparison of ``bad`` (the wrong ones a cause names) shares, each
    left out where they do not share one or where it would add nothing (every slot,
    every row)."""
    out = []
    slot_sets = {o.wrong_slots for o in bad}
    if bad and all(o.slot_count for o in bad) and len(slot_sets) == 1:
        (slots,) = slot_sets
        if slots and all(set(slots) < set(range(o.slot_count)) for o in bad):
            out.append((SLOT, frozenset(str(s) for s in slots)))
    rows = row_boundary(bad)
    if rows is not None:
        out.append((ROWS, frozenset([rows])))
    return out


def row_boundary(bad: Sequence[Observation]) -> str | None:
    """The row range every comparison of ``bad`` is wrong on (:data:`ROWS_FROM`,
    :data:`ROWS_BEFORE`, :data:`ROWS_SPAN`), each wrong on one range of its rows and
    right on the rest; ``None`` where one does not say its rows, is wrong on more than
    one range, or where every comparison is wrong on all its rows."""
    if not bad or any(o.rows is None or len(o.wrong_rows) != 1 for o in bad):
        return None
    spans = [(o.wrong_rows[0], o.rows) for o in bad]
    if all(span == rows for span, rows in spans):
        return None  # every row of every comparison: nothing inside to name
    starts = {span[0] for span, _ in spans}
    stops = {span[1] for span, _ in spans}
    if len(starts) == 1 and all(span[1] == rows[1] for span, rows in spans):
        return ROWS_FROM.format(start=next(iter(starts)))
    if len(stops) == 1 and all(span[0] == rows[0] for span, rows in spans):
        return ROWS_BEFORE.format(stop=next(iter(stops)))
    if len(starts) == 1 and len(stops) == 1:
        return ROWS_SPAN.format(start=next(iter(starts)), last=next(iter(stops)) - 1)
    return None


def within_text(named: Sequence[tuple[str, frozenset[str]]]) -> str:
    """``slot 1 or 2, positions 16 on``: :func:`within`'s part of a named cause."""
    parts = {name: " or ".join(sorted(values)) for name, values in named if name in (SLOT, ROWS)}
    return ", ".join(([f"slot {parts[SLOT]}"] if SLOT in parts else []) + ([parts[ROWS]] if ROWS in parts else []))


def position_ranges(rows: Sequence[int], first: int = 0) -> tuple[tuple[int, int], ...]:
    """Row indices (``first``: the position of row 0) as sorted ``(start, stop)`` position ranges."""
    out: list[list[int]] = []
    for r in sorted(set(rows)):
        if out and out[-1][1] == r + first:
            out[-1][1] += 1
        else:
            out.append([r + first, r + first + 1])
    return tuple((a, b) for a, b in out)
