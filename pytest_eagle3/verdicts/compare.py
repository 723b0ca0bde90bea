"""Pure comparisons of captured aux hidden states against the reference.

Both sides are named (default ``SGLang`` and ``reference``) and every function
returns a result object with ``.ok`` and ``.message(verbose=False)``; a test
calls :func:`fail_if_bad`.  Messages come in layers: a one-line verdict, one line
per wrong slot (or row), and full tables only when verbose.

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
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_eagle3.verdicts.shards import VOCAB_PADDING, vocab_shard, vocab_shard_ranges  # noqa: F401
from pytest_eagle3.verdicts.snapshots import describe, fmt_err, label
from pytest_eagle3.verdicts.diagnose import diagnose_slots

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
ERR_DEFINITION = "rel.err = ||{a} - {b}|| / ||{b}||, float64"

EMB_OK = "embedding: all {tokens} rows match the {reference_side} embedding (worst rel.err {worst})"
EMB_BAD = "embedding: {zero} of {tokens} rows are exact zeros, {off} off the {reference_side} (rel.err > {tol})"
EMB_SHAPE = "embedding: {problem}"
EMB_ALLREDUCE = (
    "only tokens of vocab shard {shard} of {tp} are right and every other row is zero: "
    "this is TP rank {shard}'s partial embedding, before the all-reduce across TP ranks "
    "[unreduced-embedding]"
)
EMB_ZERO_ROW = "row {row}: token id {token} (vocab shard {shard} of {tp}, ids {start}..{end}): exact zero row"
EMB_OFF_ROW = (
    "row {row}: token id {token} (vocab shard {shard} of {tp}, ids {start}..{end}): "
    "rel.err {err} against the {reference_side}"
)
EMB_MORE = "... and {n} more rows (-v lists them all)"
EMB_MAX_LINES = 8



def _key(x: float) -> float:
    return math.inf if math.isnan(x) else x


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
        return sorted(range(len(self.errors)), key=lambda r: (_key(self.errors[r]), r))

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
        return max((_key(v.expected_err) for v in self.slots), default=math.nan)

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
        lines = _grid(rows)
        n_ref = len(self.slots[0].errors)
        full = [("slot", *(label(r, L) for r in range(n_ref)))]
        full += [(str(v.slot), *(fmt_err(e) for e in v.errors)) for v in self.slots]
        lines += ["", f"rel.err of each {a} slot against every {b} snapshot:", *_grid(full)]
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
    if diagnose and problem is None and not all(v.ok for v in verdicts):
        diagnosis = diagnose_slots(cap, ref, verdicts, expected=[int(e) for e in expected], num_layers=L,
                                   hidden_size=H, tol=tol, evidence=evidence)
    return SlotReport(**report, slots=verdicts, problem=problem, diagnosis=diagnosis)


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
        b = ref[r].to(torch.float64)
        diff = torch.linalg.vector_norm(slots - b, dim=(1, 2))  # [K]
        norm = torch.linalg.vector_norm(b)
        if norm > 0:
            out[:, r] = (diff / norm).cpu()
        else:
            out[:, r] = torch.where(diff.cpu() == 0, 0.0, math.inf)
    return out.tolist()


# --- embedding completeness ---


@dataclass(frozen=True)
class EmbeddingRow:
    row: int
    token: int
    shard: int | None
    zero: bool
    err: float


@dataclass(frozen=True)
class EmbeddingReport:
    """Result of :func:`check_embedding_complete`."""

    vocab_size: int
    tp: int
    tol: float
    side_names: tuple[str, str]
    rows: tuple[EmbeddingRow, ...] = ()
    problem: str | None = None
    shards: tuple[tuple[int, int], ...] = field(default=())

    @property
    def zero_rows(self) -> list[EmbeddingRow]:
        return [r for r in self.rows if r.zero]

    @property
    def off_rows(self) -> list[EmbeddingRow]:
        return [r for r in self.rows if not r.zero and not r.err <= self.tol]

    @property
    def bad_rows(self) -> list[EmbeddingRow]:
        return [r for r in self.rows if r.zero or not r.err <= self.tol]

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.bad_rows

    def partial_rank(self) -> int | None:
        """The rank whose pre-all-reduce embedding this looks like, if any: every
        row of that shard right and every other row an exact zero."""
        if self.tp < 2 or not self.rows:
            return None
        good = {r.shard for r in self.rows if not r.zero and r.err <= self.tol}
        if len(good) != 1 or None in good:
            return None
        (rank,) = good
        fits = all((r.shard == rank) != r.zero for r in self.rows)
        return rank if fits and self.zero_rows else None

    def _row_line(self, r: EmbeddingRow) -> str:
        if r.shard is None:
            shard, start, end = "none", "-", "-"
        else:
            shard, (start, end) = r.shard, self.shards[r.shard]
            end = end - 1
        fields = dict(row=r.row, token=r.token, shard=shard, tp=self.tp, start=start, end=end)
        if r.zero:
            return EMB_ZERO_ROW.format(**fields)
        return EMB_OFF_ROW.format(**fields, err=fmt_err(r.err), reference_side=self.side_names[1])

    def message(self, verbose: bool = False) -> str:
        if self.problem is not None:
            return EMB_SHAPE.format(problem=self.problem)
        ref_side = self.side_names[1]
        if self.ok:
            worst = max((_key(r.err) for r in self.rows), default=0.0)
            return EMB_OK.format(tokens=len(self.rows), reference_side=ref_side, worst=fmt_err(worst))
        lines = [
            EMB_BAD.format(
                zero=len(self.zero_rows), tokens=len(self.rows), off=len(self.off_rows),
                reference_side=ref_side, tol=self.tol,
            )
        ]
        rank = self.partial_rank()
        if rank is not None:
            lines.append(EMB_ALLREDUCE.format(shard=rank, tp=self.tp))
        bad = self.bad_rows
        shown = bad if verbose else bad[:EMB_MAX_LINES]
        lines += [self._row_line(r) for r in shown]
        if len(bad) > len(shown):
            lines.append(EMB_MORE.format(n=len(bad) - len(shown)))
        if verbose:
            rows = [("row", "token", "shard", "zero", "rel.err")]
            rows += [
                (str(r.row), str(r.token), "-" if r.shard is None else str(r.shard), "yes" if r.zero else "",
                 fmt_err(r.err))
                for r in self.rows
            ]
            lines += ["", *_grid(rows), ERR_DEFINITION.format(a=self.side_names[0], b=ref_side)]
        return "\n".join(lines)


def check_embedding_complete(
    captured_slot: Any,
    reference_embedding: Any,
    token_ids: Sequence[int] | Any,
    *,
    vocab_size: int,
    tp: int,
    tol: float = 1e-3,
    side_names: tuple[str, str] = ("SGLang", "reference"),
) -> EmbeddingReport:
    """Check every token row of a captured embedding slot against the reference.

    Args:
        captured_slot: ``[tokens, H]``, the slot that should hold ``hs[0]``.
        reference_embedding: ``[tokens, H]`` reference ``hs[0]``.
        token_ids: the ``tokens`` prompt ids (to name each row's vocab shard).
        vocab_size: the target's ``vocab_size`` (unpadded).
        tp: the engine's TP size (shards as in :func:`vocab_shard_ranges`).
        tol: per-row rel.err allowed.

    A missing embedding all-reduce at TP ``n`` leaves exact-zero rows for the
    tokens outside the capturing rank's shard; the report names that case.
    """
    import torch

    a_name, b_name = side_names
    shards = tuple(vocab_shard_ranges(vocab_size, tp))
    base = dict(vocab_size=vocab_size, tp=tp, tol=tol, side_names=(a_name, b_name), shards=shards)
    ref = torch.as_tensor(reference_embedding)
    cap = torch.as_tensor(captured_slot).to(ref.device)
    ids = [int(t) for t in torch.as_tensor(token_ids).reshape(-1).tolist()]
    if cap.shape != ref.shape or cap.dim() != 2:
        return EmbeddingReport(
            **base, problem=f"{a_name} slot has shape {list(cap.shape)}; the {b_name} has {list(ref.shape)}"
        )
    if len(ids) != cap.shape[0]:
        return EmbeddingReport(**base, problem=f"{len(ids)} token ids for {cap.shape[0]} rows")
    a, b = cap.to(torch.float64), ref.to(torch.float64)
    zero = (a == 0).all(dim=1).tolist()
    diff = torch.linalg.vector_norm(a - b, dim=1)
    norm = torch.linalg.vector_norm(b, dim=1)
    err = torch.where(norm > 0, diff / norm.clamp_min(1e-300), torch.where(diff == 0, 0.0, math.inf)).tolist()
    rows = tuple(
        EmbeddingRow(row=i, token=t, shard=vocab_shard(t, vocab_size, tp), zero=bool(z), err=float(e))
        for i, (t, z, e) in enumerate(zip(ids, zero, err))
    )
    return EmbeddingReport(**base, rows=rows)


# --- glue ---


def report_record(report: Any) -> dict[str, Any]:
    """A JSON-ready summary of a verdict report: ``ok``, ``verdict`` (its first
    line), ``slots`` (per slot: expected and best-matching snapshot with their
    relative L2 errors) for a :class:`SlotReport`, ``lines`` for a per-rank report."""
    message = report.message()
    out: dict[str, Any] = {"ok": bool(report.ok), "verdict": message.splitlines()[0] if message else ""}
    slots = getattr(report, "slots", None)
    num_layers = getattr(report, "num_layers", None)
    if slots and num_layers is not None:
        out["slots"] = [
            {"slot": v.slot, "expected": label(v.expected, num_layers), "expected_rel_err": _json_float(v.expected_err),
             "best": label(v.best, num_layers), "best_rel_err": _json_float(v.best_err), "ok": v.ok}
            for v in slots
        ]
    if getattr(report, "kinds", None):
        out["diagnoses"] = list(report.kinds)
    if getattr(report, "problem", None):
        out["problem"] = report.problem
    if getattr(report, "lines", None) and not slots:
        out["lines"] = list(report.lines)
    return out


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


#: A later test's failure when an earlier one already named the same cause.
SAME_CAUSE = ("same cause as {first}, which reports it in full: {line}")
_CAUSES = pytest.StashKey[dict]()
_NUMBERS = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def cause_signature(report: Any) -> tuple[str, ...] | None:
    """What a failed report's diagnosis says the wrong slots hold, with layer
    numbers and errors left out (``"slot # holds the MLP output of layer # after
    its post_feedforward_layernorm ..."``), when it names every wrong slot and
    no id-list pattern; else ``None``.  Two reports with one signature fail for
    one reason, whatever ids, contract or path each test used (each pointer
    keeps its own first slot line, layer numbers included; ``-v`` reports every
    test in full).  A per-rank report has the signature its ranks share
    (``slot_reports``), if they share one."""
    subs = getattr(report, "slot_reports", None)
    if subs:
        signatures = {cause_signature(r) for r in subs}
        return signatures.pop() if len(signatures) == 1 and None not in signatures else None
    diag = getattr(report, "diagnosis", None)
    if diag is None or diag.pattern_lines or not diag.slot_lines:
        return None
    if {v.slot for v in report.wrong} - set(diag.slot_lines):
        return None
    return tuple(sorted({_NUMBERS.sub("#", line) for line in diag.slot_lines.values()}))


def recorded_causes(config: pytest.Config) -> list[str]:
    """Tests of this pytest process that reported a capture defect in full
    (:func:`fail_if_bad`), in the order they did."""
    return list(dict.fromkeys(config.stash.get(_CAUSES, {}).values()))


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]


def fail_if_bad(report: Any, *, verbose: bool = False, config: pytest.Config | None = None,
                cause: str | None = None) -> Any:
    """``pytest.fail(report.message())`` without a traceback when ``not report.ok``;
    returns the report otherwise.  ``config`` (or ``verbose``) turns on the tables
    (``-v``); with ``config`` the run's ``pytest_eagle3_verdict`` hook
    (:mod:`pytest_eagle3.plugin.hookspec`) sees the report first.  ``cause``: a
    line known before the engine ran that explains the failure (it leads the message).

    One root cause, one failure: with ``config``, the first test whose diagnosis
    has a given :func:`cause_signature` reports it in full; a later one with the
    same signature fails with :data:`SAME_CAUSE`, naming the first and its own
    first slot line (per pytest process; with ``-v`` every test reports in full)."""
    __tracebackhide__ = True
    if config is not None and hasattr(config.hook, "pytest_eagle3_verdict"):
        config.hook.pytest_eagle3_verdict(config=config, report=report)
    if not report.ok:
        if config is not None:
            verbose = verbose or config.get_verbosity() > 0
            signature = cause_signature(report)
            if signature is not None and cause is None and not verbose:
                here = _current_test()
                first = config.stash.setdefault(_CAUSES, {}).setdefault(signature, here)
                if first != here:
                    diag = (getattr(report, "slot_reports", None) or [report])[0].diagnosis
                    line = diag.slot_lines[min(diag.slot_lines)]
                    pytest.fail(SAME_CAUSE.format(first=first, line=line), pytrace=False)
        message = report.message(verbose=verbose)
        pytest.fail(f"{cause}\n{message}" if cause else message, pytrace=False)
    return report


def _grid(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
