"""The embedding slot row by row: every token's row equals the reference embedding.

:func:`check_embedding_complete` returns an :class:`EmbeddingReport` with
``.ok`` and ``.message(verbose=False)``; a missing embedding all-reduce at TP
``n`` leaves exact-zero rows for the tokens outside the capturing rank's vocab
shard, and the report names that case.  :func:`check_shards_covered` says
whether the prompts reach every shard at all, :func:`check_embedding_slot`
whether SGLang captured the embedding in any slot.

torch is imported inside the functions only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_eagle3.verdicts.order import follows_measured, measured_snapshots
from pytest_eagle3.verdicts.outcome import Verdict
from pytest_eagle3.verdicts.shards import vocab_shard, vocab_shard_ranges
from pytest_eagle3.verdicts.snapshots import ERR_DEFINITION, fmt_err, grid, nan_last
from pytest_eagle3.verdicts.distance import rel_err

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
#: The suite prompts must reach every vocab shard, else a missing all-reduce goes unseen.
SHARDS_UNCOVERED = (
    "the suite prompts miss vocab shard(s) {missing} at TP {tp}: an incomplete "
    "all-reduce on those ranks would go unseen (fix fixtures/prompts.json)"
)


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
            worst = max((nan_last(r.err) for r in self.rows), default=0.0)
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
            lines += ["", *grid(rows), ERR_DEFINITION.format(a=self.side_names[0], b=ref_side)]
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
    err = rel_err(a, b, dim=1).tolist()
    rows = tuple(
        EmbeddingRow(row=i, token=t, shard=vocab_shard(t, vocab_size, tp), zero=bool(z), err=float(e))
        for i, (t, z, e) in enumerate(zip(ids, zero, err))
    )
    return EmbeddingReport(**base, rows=rows)



def check_shards_covered(prompts: Iterable[Sequence[int]], *, vocab_size: int, tp: int) -> Verdict:
    """Passed when the prompts' tokens fall in every one of the ``tp`` vocab shards
    (:func:`pytest_eagle3.verdicts.shards.vocab_shard`); failed with
    :data:`SHARDS_UNCOVERED` naming the shards none reaches."""
    covered = {vocab_shard(t, vocab_size, tp) for p in prompts for t in p}
    missing = sorted(set(range(tp)) - covered)
    if missing:
        return Verdict.failed(SHARDS_UNCOVERED.format(missing=missing, tp=tp))
    return Verdict.passed()


#: Skip reason's tail when SGLang's measured captures hold no embedding.
NO_EMBEDDING_CAPTURED = "; no slot holds the embedding"


def check_embedding_slot(report: Any, *, ids: Sequence[int] | None, predicted: Sequence[int],
                         rule_source: str) -> Verdict:
    """Skipped when every slot of ``report`` (the slots against the rule's
    prediction) holds a clean snapshot and none is the embedding ``hs[0]``: the
    rule said one slot is the embedding, SGLang captured other layers
    (``test_capture_order`` fails for that) and no slot holds the embedding to
    check; passed otherwise."""
    measured = measured_snapshots(report)
    if measured is not None and 0 not in measured:
        return Verdict.skipped(follows_measured(measured, ids=ids, predicted=predicted, rule_source=rule_source)
                               + NO_EMBEDDING_CAPTURED, report)
    return Verdict.passed(report)
