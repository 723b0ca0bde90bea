"""Pure comparisons of captured aux hidden states against the reference, slot by slot.

Both sides are named (default ``SGLang`` and ``reference``) and
:func:`compare_slots` returns a :class:`SlotReport` with ``.ok`` and
``.message(verbose=False)``; a packaged test hands it to
:func:`pytest_eagle3.suite.outcome.fail_if_bad`.  Messages come in layers: a
one-line verdict, one line per wrong slot, and full tables only when verbose.
The embedding slot row by row is :mod:`pytest_eagle3.verdicts.embedding`.

A wrong slot is then diagnosed (:mod:`pytest_eagle3.verdicts.diagnose`): lines
tagged ``[kind]`` name the bug it shows (an id offset, reversed slots, the
normalized layer input, a partial sum, ...), after the slot lines.

Distances are relative L2 errors ``||captured - reference|| / ||reference||``
computed in float64: cosine cannot tell a tensor from its RMS-normed copy or
deep adjacent layers apart, relative L2 can (docs/design.md, "Reduced-layer targets").

torch is imported inside the functions only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_eagle3.verdicts.snapshots import ERR_DEFINITION, describe, fmt_err, grid, label, nan_last
from pytest_eagle3.verdicts.diagnose import diagnose_slots
from pytest_eagle3.verdicts.distance import rel_err
from pytest_eagle3.verdicts.microbatches import row_ranges

#: A slot whose best match is farther than this (and than ``2 * tol``) "matches no snapshot".
NO_MATCH_TOL = 0.05

# Message templates (tests import these).
SLOTS_OK = "aux hidden states: all {k} slots hold the expected snapshots (worst rel.err {worst})"
SLOTS_BAD = "aux hidden states: {wrong} of {k} slots wrong"
SLOTS_SHAPE = "aux hidden states: {problem}"
WIDTH_SLOTS = "captured width {width} = {slots} slot{s} of hidden {hidden}; expected {expected} slots"
WIDTH_RAGGED = "captured width {width} is not a multiple of hidden {hidden}; expected {expected} slots = {want}"
NOT_2D = "captured {side} tensor has shape {shape}; expected [tokens, {want}]"
TOKENS_DIFFER = "{captured_side} captured {captured} tokens; the {reference_side} has {reference}"
HOLDS = "holds {label} ({meaning}, rel.err {err})"
NO_MATCH = "matches no snapshot (best {label} at {err})"
#: A slot whose best match is the expected snapshot, but not within tolerance.
SLOT_OFF = (
    "slot {slot}: right snapshot {label} ({meaning}), off by rel.err {err} against tolerance {tol}; "
    "next best {next_label} at {next_err}"
)
SLOT_WRONG = (
    "slot {slot}: {holding}; expected {expected_label} ({expected_meaning}, rel.err {expected_err}); "
    "next best {next_label} at {next_err}"
)
SLOT_PRESENT = "slot {slot}: {holding}"
SLOT_TOL = "tolerance: rel.err <= {tol} for the expected snapshot; 'matches no snapshot' above {no_match}"
#: Row localization of a comparison whose wrong slots are wrong on some rows only.
ROWS_SOME = "rows: {wrong} of {n} wrong ({wrong_rows}), {right} right ({right_rows}){boundary}"
ROWS_BOUNDARY = ": exactly {names}"
ROWS_NO_BOUNDARY = "; no boundary of {kinds} separates them"


# --- slots ---


@dataclass(frozen=True)
class SlotVerdict:
    """What one captured slot holds.

    ``errors[r]`` is the rel.err of the slot against reference snapshot ``r``.
    """

    slot: int
    expected: int
    errors: tuple[float, ...]
    tol: float
    no_match_tol: float

    @property
    def ranking(self) -> list[int]:
        return sorted(range(len(self.errors)), key=lambda r: (nan_last(self.errors[r]), r))

    @property
    def best(self) -> int:
        return self.ranking[0]

    @property
    def best_err(self) -> float:
        return self.errors[self.best]

    @property
    def next_best(self) -> int | None:
        ranking = self.ranking
        return ranking[1] if len(ranking) > 1 else None

    @property
    def expected_err(self) -> float:
        return self.errors[self.expected] if self.expected < len(self.errors) else math.nan

    @property
    def ok(self) -> bool:
        return self.expected_err <= self.tol

    @property
    def matched(self) -> bool:
        """The slot is close to some snapshot (its best match is within ``no_match_tol``)."""
        return self.best_err <= self.no_match_tol

    def holding(self, num_layers: int) -> str:
        if self.matched:
            return HOLDS.format(
                label=label(self.best, num_layers), meaning=describe(self.best, num_layers), err=fmt_err(self.best_err)
            )
        return NO_MATCH.format(label=label(self.best, num_layers), err=fmt_err(self.best_err))

    def line(self, num_layers: int) -> str:
        nb = self.next_best
        if self.best == self.expected and self.matched:
            return SLOT_OFF.format(slot=self.slot, label=label(self.expected, num_layers),
                                   meaning=describe(self.expected, num_layers), err=fmt_err(self.expected_err),
                                   tol=fmt_err(self.tol),
                                   next_label=label(nb, num_layers) if nb is not None else "-",
                                   next_err=fmt_err(self.errors[nb]) if nb is not None else "-")
        return SLOT_WRONG.format(
            slot=self.slot,
            holding=self.holding(num_layers),
            expected_label=label(self.expected, num_layers),
            expected_meaning=describe(self.expected, num_layers),
            expected_err=fmt_err(self.expected_err),
            next_label=label(nb, num_layers) if nb is not None else "-",
            next_err=fmt_err(self.errors[nb]) if nb is not None else "-",
        )


@dataclass(frozen=True)
class SlotReport:
    """Result of :func:`compare_slots`.

    ``problem`` is set when the shapes do not fit (wrong slot count, token count);
    ``slots`` then holds what the whole slots that are present match, when the
    token counts agree.
    """

    expected: tuple[int, ...]
    num_layers: int
    hidden_size: int
    tol: float
    no_match_tol: float
    side_names: tuple[str, str]
    slots: tuple[SlotVerdict, ...] = ()
    problem: str | None = None
    #: What the wrong slots show (:func:`pytest_eagle3.verdicts.diagnose.diagnose_slots`).
    diagnosis: Any = None
    #: Where the wrong slots are wrong on some rows only: the :data:`ROWS_SOME` line
    #: (:func:`localize_rows`); ``None`` when every row (or no row) is wrong.
    rows_line: str | None = None
    #: The rows (indices into ``captured``) where a wrong slot misses its expected snapshot.
    wrong_rows: tuple[int, ...] = ()
    #: How many rows were compared, and the position of row 0 where the caller knew it
    #: (``None``: not given; the run-level diagnosis then names no row range).
    row_count: int = 0
    first_row: int | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and all(v.ok for v in self.slots)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The bug kinds the diagnosis named (``offset-twice``, ``partial-sum``, ...)."""
        return tuple(self.diagnosis.kinds) if self.diagnosis is not None else ()

    @property
    def wrong(self) -> list[SlotVerdict]:
        return [v for v in self.slots if not v.ok]

    @property
    def worst_err(self) -> float:
        return max((nan_last(v.expected_err) for v in self.slots), default=math.nan)

    def verdict(self) -> str:
        if self.problem is not None:
            return SLOTS_SHAPE.format(problem=self.problem)
        if self.ok:
            return SLOTS_OK.format(k=len(self.slots), worst=fmt_err(self.worst_err))
        return SLOTS_BAD.format(wrong=len(self.wrong), k=len(self.slots))

    def message(self, verbose: bool = False) -> str:
        L = self.num_layers
        lines = [self.verdict()]
        if self.problem is not None:
            lines += [SLOT_PRESENT.format(slot=v.slot, holding=v.holding(L)) for v in self.slots]
        else:
            lines += [v.line(L) for v in self.wrong]
            if self.rows_line is not None:
                lines.append(self.rows_line)
        if self.diagnosis is not None:
            lines += self.diagnosis.lines
        if verbose and self.slots:
            lines += ["", *self.table()]
        return "\n".join(lines)

    def table(self) -> list[str]:
        """Slot x (expected, best, errors) table, then every slot's rel.err to every snapshot."""
        L = self.num_layers
        a, b = self.side_names
        rows = [("slot", "expected", "err", "best", "err", "next best", "err", "ok")]
        for v in self.slots:
            nb = v.next_best
            expected = label(v.expected, L) if v.slot < len(self.expected) else "-"
            rows.append((
                str(v.slot), expected, fmt_err(v.expected_err), label(v.best, L), fmt_err(v.best_err),
                label(nb, L) if nb is not None else "-", fmt_err(v.errors[nb]) if nb is not None else "-",
                "yes" if v.ok else "NO",
            ))
        lines = grid(rows)
        n_ref = len(self.slots[0].errors)
        full = [("slot", *(label(r, L) for r in range(n_ref)))]
        full += [(str(v.slot), *(fmt_err(e) for e in v.errors)) for v in self.slots]
        lines += ["", f"rel.err of each {a} slot against every {b} snapshot:", *grid(full)]
        lines += [ERR_DEFINITION.format(a=a, b=b), SLOT_TOL.format(tol=self.tol, no_match=fmt_err(self.no_match_tol))]
        return lines

    def properties(self) -> dict[str, Any]:
        """Flat figures for ``record_property`` / a JSON report."""
        L = self.num_layers
        return {
            "eagle3_slots_ok": self.ok,
            "eagle3_slots_expected": [label(i, L) for i in self.expected],
            "eagle3_slots_best": [label(v.best, L) for v in self.slots],
            "eagle3_slots_expected_err": [v.expected_err for v in self.slots],
            "eagle3_slots_problem": self.problem,
        }


def compare_slots(
    captured: Any,
    reference: Any,
    *,
    expected: Sequence[int],
    num_layers: int,
    hidden_size: int,
    tol: float = 1e-3,
    no_match_tol: float | None = None,
    side_names: tuple[str, str] = ("SGLang", "reference"),
    evidence: Any = None,
    diagnose: bool = True,
    segments: Sequence[tuple[str, int, int]] = (),
    first_row: int | None = None,
) -> SlotReport:
    """Say which reference snapshot every captured aux slot holds.

    Args:
        captured: ``[tokens, K*H]`` (tensor or nested list); slot ``s`` is columns
            ``s*H:(s+1)*H``.
        reference: ``[L+2, tokens, H]`` snapshots in :mod:`pytest_eagle3.verdicts.snapshots`
            indexing (``0..L`` = ``hs``, ``L+1`` = ``final_prenorm``).
        expected: the snapshot index each slot must hold (``K`` entries).
        tol: a slot passes when its rel.err to the expected snapshot is ``<= tol``.
        no_match_tol: above this best rel.err a slot "matches no snapshot"
            (a partial sum, a tensor before an all-reduce); default
            ``max(NO_MATCH_TOL, 2 * tol)``.
        evidence: candidates for the diagnosis beyond the snapshots, a
            :class:`pytest_eagle3.verdicts.diagnose.Evidence` or a callable
            returning one (called only when a slot matches no snapshot).
        diagnose: name the bug behind wrong slots (default); ``False`` keeps
            the report to the slot lines.
        segments: ``(name, start, stop)`` row ranges of ``captured`` that share a
            boundary (a prefill chunk, a request of a batch, a micro-batch); a
            comparison wrong on some rows only names the segments its wrong rows
            are exactly (:func:`localize_rows`).
        first_row: the position of row 0, for the row numbers of that line and the
            run-level diagnosis's row ranges (``None``: not known; the line counts from 0).

    Raises:
        ValueError: ``reference`` is not ``[num_layers + 2, tokens, hidden_size]``
            or an expected index is outside ``0..num_layers + 1`` (caller bugs,
            not verdicts).
    """
    import torch

    L, H, K = num_layers, hidden_size, len(expected)
    no_match = max(NO_MATCH_TOL, 2 * tol) if no_match_tol is None else no_match_tol
    a_name, b_name = side_names
    ref = torch.as_tensor(reference)
    if ref.dim() != 3 or ref.shape[0] != L + 2 or ref.shape[2] != H:
        raise ValueError(f"{b_name} has shape {tuple(ref.shape)}; expected [{L + 2}, tokens, {H}]")
    for e in expected:
        describe(int(e), L)  # raises ValueError outside 0..L+1
    cap = torch.as_tensor(captured).to(ref.device)
    report = dict(
        expected=tuple(int(e) for e in expected), num_layers=L, hidden_size=H, tol=tol,
        no_match_tol=no_match, side_names=(a_name, b_name),
    )
    if cap.dim() != 2:
        return SlotReport(**report, problem=NOT_2D.format(side=a_name, shape=list(cap.shape), want=K * H))
    tokens, width = cap.shape
    problem = None
    if width % H:
        problem = WIDTH_RAGGED.format(width=width, hidden=H, expected=K, want=K * H)
    elif width != K * H:
        n = width // H
        problem = WIDTH_SLOTS.format(width=width, slots=n, s="" if n == 1 else "s", hidden=H, expected=K)
    if tokens != ref.shape[1]:
        tok = TOKENS_DIFFER.format(
            captured_side=a_name, captured=tokens, reference_side=b_name, reference=ref.shape[1]
        )
        return SlotReport(**report, problem=tok if problem is None else f"{problem}; {tok}")
    n_slots = width // H
    errors = slot_errors(cap[:, : n_slots * H], ref, H)
    verdicts = tuple(
        SlotVerdict(
            slot=s, expected=int(expected[s]) if s < K else L + 2, errors=tuple(errors[s]), tol=tol,
            no_match_tol=no_match,
        )
        for s in range(n_slots)
    )
    diagnosis = None
    rows: tuple[int, ...] = ()
    rows_line = None
    if problem is None and not all(v.ok for v in verdicts):
        rows = wrong_rows(cap, ref, [v for v in verdicts if not v.ok and v.expected < ref.shape[0]], H, tol)
        if diagnose:
            diagnosis = diagnose_slots(cap, ref, verdicts, expected=[int(e) for e in expected], num_layers=L,
                                       hidden_size=H, tol=tol, evidence=evidence, rows=rows)
        rows_line = localize_rows(rows, tokens, segments, first_row or 0)
    return SlotReport(**report, slots=verdicts, problem=problem, diagnosis=diagnosis, rows_line=rows_line,
                      wrong_rows=rows, row_count=int(tokens), first_row=first_row)


#: Rows are told apart only when every wrong row is this many times farther than the
#: tolerance: a precision loss spread over all rows must not read as some rows wrong.
ROW_SEPARATION = 10.0


def wrong_rows(captured: Any, reference: Any, wrong: Sequence[SlotVerdict], hidden_size: int,
               tol: float) -> tuple[int, ...]:
    """Rows of ``captured [T, K*H]`` where one of the ``wrong`` slots misses its expected
    snapshot ``reference[e][t]``: rel.err of that row above ``ROW_SEPARATION * tol``,
    every other row of those slots within ``tol``; ``()`` when the rows do not
    separate that clearly (every row is then as wrong as the slot)."""
    import torch

    H = hidden_size
    worst = torch.zeros(captured.shape[0], dtype=torch.float64)
    for v in wrong:
        a = captured[:, v.slot * H:(v.slot + 1) * H].to(torch.float64)
        b = reference[v.expected].to(a.device, torch.float64)
        worst = torch.maximum(worst, torch.nan_to_num(rel_err(a, b, dim=(1,)).cpu(), nan=math.inf))
    bad = worst > tol
    if not bool(bad.any()) or bool((worst[bad] <= ROW_SEPARATION * tol).any()):
        return ()
    return tuple(int(t) for t in bad.nonzero().flatten().tolist())


def localize_rows(rows: Sequence[int], n: int, segments: Sequence[tuple[str, int, int]] = (),
                  first_row: int = 0) -> str | None:
    """The :data:`ROWS_SOME` line for wrong ``rows`` of ``n``: which rows are wrong and
    right, and the ``segments`` (``(name, start, stop)``) whose union they are exactly
    (a boundary every wrong row shares); ``None`` when no row or every row is wrong."""
    wrong = sorted(set(rows))
    if not wrong or len(wrong) >= n:
        return None
    bad = set(wrong)
    right = [r for r in range(n) if r not in bad]
    boundary = ""
    if segments:
        inside = [(name, a, b) for name, a, b in segments if set(range(a, b)) <= bad]
        if inside and {r for _, a, b in inside for r in range(a, b)} == bad:
            boundary = ROWS_BOUNDARY.format(names=", ".join(
                f"{name} (rows {row_ranges(range(a + first_row, b + first_row))})" for name, a, b in inside))
        else:
            kinds = sorted({name.rsplit(" ", 1)[0] for name, _, _ in segments})
            boundary = ROWS_NO_BOUNDARY.format(kinds=", ".join(kinds))
    return ROWS_SOME.format(wrong=len(wrong), n=n, wrong_rows=row_ranges([r + first_row for r in wrong]),
                            right=len(right), right_rows=row_ranges([r + first_row for r in right]), boundary=boundary)


def slot_errors(captured: Any, reference: Any, hidden_size: int) -> list[list[float]]:
    """``errors[s][r]`` = rel.err of slot ``s`` of ``captured [T, K*H]`` against
    ``reference[r]`` (``[R, T, H]``), in float64.  A zero reference snapshot gives
    ``0`` against a zero slot and ``inf`` otherwise."""
    import torch

    ref = torch.as_tensor(reference)
    cap = torch.as_tensor(captured).to(ref.device)
    T = cap.shape[0]
    slots = cap.reshape(T, -1, hidden_size).transpose(0, 1).to(torch.float64)  # [K, T, H]
    out = torch.empty(slots.shape[0], ref.shape[0], dtype=torch.float64)
    for r in range(ref.shape[0]):
        b = ref[r].to(torch.float64).expand_as(slots)
        out[:, r] = rel_err(slots, b, dim=(1, 2)).cpu()  # [K]
    return out.tolist()
