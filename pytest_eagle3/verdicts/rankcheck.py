"""Per-rank verdicts on what every TP rank captured (records from the recorder).

Pure functions with named sides returning a report with ``.ok`` and
``.message()`` (a packaged test hands it to
:func:`pytest_eagle3.suite.outcome.fail_if_bad`).  Three checks:

* :func:`check_ranks_agree`: every rank holds the captures rank 0 holds
  (bitwise in fp32 on CPU, within a tolerance on GPU);
* :func:`check_rank_embeddings`: every rank's embedding slot is complete
  (no zero rows outside the rank's vocab shard), via
  :func:`pytest_eagle3.verdicts.embedding.check_embedding_complete`;
* :func:`check_rank_slots`: every rank's slots hold the expected snapshots; a
  slot equal to a fraction ``k/tp`` of the expected snapshot is diagnosed as a
  partial sum on that rank (an all-reduce missing, e.g. the MLP all-reduce
  deferred into the next layer's fused norm, SGLang PR #28343).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pytest_eagle3.verdicts.compare import compare_slots
from pytest_eagle3.verdicts.embedding import check_embedding_complete
from pytest_eagle3.verdicts.evidence import EvidenceLike, resolve
from pytest_eagle3.verdicts.snapshots import fmt_err, full_label
from pytest_eagle3.verdicts.distance import rel_err
from pytest_eagle3.verdicts.outcome import Verdict

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.engine.recordings import Record

AGREE_OK = "ranks agree: {tp} ranks hold identical captures in {n} forwards ({how})"
AGREE_BAD = "ranks disagree: {bad} of {total} (rank, forward) captures differ from rank 0 ({how})"
AGREE_LINE = "rank {rank}, forward {fwd} ({mode}), slot {slot}: max |diff| {diff} (rel.err {err})"
COUNT_BAD = "ranks recorded different forwards: {counts}"
FEWER_RECORDS = (
    "rank {rank} recorded {n} prefill forwards of the test's requests for {m} prompts: "
    "{missing} prompt(s) unchecked"
)
RANK_PREFIX = "rank {rank}: {message}"
PARTIAL_SUM = (
    "slot {slot} on rank {rank} holds {fraction:.3g} x {label} (fit rel.err {err}): a partial "
    "sum, the all-reduce is missing or incomplete on rank {rank}"
)
ALL_RANKS_OK = "all {tp} ranks: {message}"

#: Largest fit error for a "k/tp of the snapshot" partial-sum diagnosis.
PARTIAL_FIT_TOL = 1e-3


@dataclass
class RankReport:
    """Result of a per-rank check: ``ok``, ``lines`` (first line is the verdict).

    ``slot_reports``: each failing rank's :class:`~pytest_eagle3.verdicts.compare.SlotReport`
    when nothing but those comparisons failed (no partial sum, no count problem),
    so :func:`~pytest_eagle3.verdicts.summary.cause_signature` can tell that every
    rank shows one cause."""

    ok: bool
    lines: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    slot_reports: list[Any] = field(default_factory=list)
    #: ``(rank, request or forward index, ok, its report or None)`` of every
    #: comparison made (the run-level diagnosis reads which ranks and requests passed);
    #: one chunk of a chunked prefill adds its forward mode, its chunk number (from 1),
    #: the positions ``(start, stop)`` of its rows and its own report (or ``None``).
    outcomes: list[tuple] = field(default_factory=list)

    def message(self, verbose: bool = False) -> str:
        return "\n".join(self.lines + (self.details if verbose else []))


def _rel(a: "torch.Tensor", b: "torch.Tensor") -> float:
    return float(rel_err(a, b))


def check_ranks_agree(records: Mapping[int, Sequence["Record"]], *, hidden_size: int,
                      exact: bool = True, tol: float = 1e-3) -> RankReport:
    """Every rank's aux equals rank 0's, forward by forward (``exact``: bitwise)."""
    how = "bitwise" if exact else f"rel.err <= {tol}"
    counts = {r: len(v) for r, v in records.items()}
    if len(set(counts.values())) != 1:
        return RankReport(False, [COUNT_BAD.format(counts=counts)])
    base = records[0]
    lines: list[str] = []
    total = 0
    outcomes: list[tuple[int, int, bool, Any]] = []
    for rank in sorted(records):
        if rank == 0:
            continue
        for fwd, (mine, ref) in enumerate(zip(records[rank], base)):
            total += 1
            if mine.aux.shape != ref.aux.shape:
                lines.append(f"rank {rank}, forward {fwd}: shape {tuple(mine.aux.shape)} vs rank 0 {tuple(ref.aux.shape)}")
                outcomes.append((rank, fwd, False, None))
                continue
            same = bool((mine.aux == ref.aux).all()) if exact else _rel(mine.aux, ref.aux) <= tol
            outcomes.append((rank, fwd, same, None))
            if same:
                continue
            k = ref.aux.shape[1] // hidden_size
            for slot in range(k):
                cols = slice(slot * hidden_size, (slot + 1) * hidden_size)
                a, b = mine.aux[:, cols], ref.aux[:, cols]
                if exact and bool((a == b).all()) or not exact and _rel(a, b) <= tol:
                    continue
                lines.append(AGREE_LINE.format(rank=rank, fwd=fwd, mode=mine.mode, slot=slot,
                                               diff=fmt_err(float((a - b).abs().max())), err=fmt_err(_rel(a, b))))
    n = len(base)
    if not lines:
        return RankReport(True, [AGREE_OK.format(tp=len(records), n=n, how=how)], outcomes=outcomes)
    bad = len({line.split(",")[0] + line.split(",")[1] for line in lines})
    return RankReport(False, [AGREE_BAD.format(bad=bad, total=total, how=how), *lines], outcomes=outcomes)


def check_rank_embeddings(records: Mapping[int, Sequence["Record"]], references: Sequence["torch.Tensor"],
                          *, slot: int, hidden_size: int, vocab_size: int, tol: float = 1e-3,
                          served: Mapping[int, Sequence[int]] | None = None) -> RankReport:
    """Every rank's embedding slot equals the reference embedding ``hs[0]`` for every
    token, forward ``i`` against ``references[i]`` (``[L+2, tokens, H]``); ``served``
    (attention DP): rank -> the indices of ``references`` its records are, in order."""
    tp = len(records)
    cols = slice(slot * hidden_size, (slot + 1) * hidden_size)
    lines: list[str] = _count_lines(records, references, served)
    outcomes: list[tuple[int, int, bool, Any]] = []
    for rank in sorted(records):
        reported = False
        for i, rec, ref in _paired(rank, records, references, served):
            ids = rec.input_ids.tolist()

            def judge(rows: slice, name: str, rec: "Record" = rec, ref: Any = ref, ids: list = ids) -> Any:
                return check_embedding_complete(rec.aux[rows, cols], ref[0][rows], ids[rows], vocab_size=vocab_size,
                                                tp=tp, tol=tol, side_names=(name, "reference"))

            report = judge(slice(None), f"rank {rank}")
            outcomes.extend(_chunk_outcomes(rank, i, rec, report, judge))
            if not report.ok and not reported:
                reported = True
                lines.append(RANK_PREFIX.format(rank=rank, message=report.message()))
    if lines:
        return RankReport(False, lines, outcomes=outcomes)
    return RankReport(True, [ALL_RANKS_OK.format(tp=tp, message="embedding rows complete on every vocab shard")],
                      outcomes=outcomes)


def _count_lines(records: Mapping[int, Sequence["Record"]], references: Sequence["torch.Tensor"],
                 served: Mapping[int, Sequence[int]] | None = None) -> list[str]:
    """A line per rank whose records do not pair one to one with the references
    (with ``served``: the references of the requests it served): a zip would
    silently check fewer prompts."""
    want = {rank: len(served.get(rank, ())) if served is not None else len(references) for rank in records}
    return [FEWER_RECORDS.format(rank=rank, n=len(recs), m=want[rank], missing=abs(want[rank] - len(recs)))
            for rank, recs in sorted(records.items()) if len(recs) != want[rank]]


def _paired(rank: int, records: Mapping[int, Sequence["Record"]], references: Sequence[Any],
            served: Mapping[int, Sequence[int]] | None) -> list[tuple[int, "Record", Any]]:
    """``(request index, record, reference)`` of ``rank``: record ``k`` is request ``k``,
    or under attention DP request ``served[rank][k]``."""
    indices = list(served.get(rank, ())) if served is not None else list(range(len(references)))
    return [(i, rec, references[i]) for i, rec in zip(indices, records[rank])]


def partial_sum_fraction(captured: "torch.Tensor", snapshot: "torch.Tensor", tp: int) -> tuple[float, float] | None:
    """``(fraction, fit error)`` when ``captured ~= fraction * snapshot`` with
    ``fraction = k/tp`` for some ``1 <= k < tp``; None otherwise."""
    import torch

    b = snapshot.double()
    denom = float((b * b).sum())
    if denom == 0 or tp < 2:
        return None
    alpha = float((captured.double() * b).sum()) / denom
    k = round(alpha * tp)
    if not 1 <= k < tp or abs(alpha * tp - k) > 0.05:
        return None
    err = _rel(captured, torch.as_tensor(k / tp, dtype=torch.float64) * b)
    return (k / tp, err) if err <= PARTIAL_FIT_TOL else None


def check_rank_slots(records: Mapping[int, Sequence["Record"]], references: Sequence["torch.Tensor"],
                     *, expected: Sequence[int], num_layers: int, hidden_size: int, tol: float = 1e-3,
                     evidence: Sequence[Any] | None = None,
                     served: Mapping[int, Sequence[int]] | None = None) -> RankReport:
    """Every rank's slots hold the expected snapshots; partial sums are named.

    ``evidence``: per reference, the diagnosis candidates
    (:mod:`pytest_eagle3.verdicts.diagnose`), e.g. each rank's unreduced MLP share.
    ``served`` (attention DP): rank -> the indices of ``references`` its records are."""
    tp = len(records)
    lines: list[str] = _count_lines(records, references, served)
    plain = not lines
    failed: list[Any] = []
    outcomes: list[tuple] = []
    for rank in sorted(records):
        reported = False
        for i, rec, ref in _paired(rank, records, references, served):
            report = compare_slots(rec.aux, ref, expected=list(expected), num_layers=num_layers,
                                   hidden_size=hidden_size, tol=tol, side_names=(f"rank {rank}", "reference"),
                                   evidence=evidence[i] if evidence is not None and i < len(evidence) else None,
                                   segments=chunk_segments(rec), first_row=_first_position(rec))

            def judge(rows: slice, name: str, rec: "Record" = rec, ref: Any = ref) -> Any:
                return compare_slots(rec.aux[rows], ref[:, rows], diagnose=False, side_names=(name, "reference"),
                                     expected=expected, num_layers=num_layers, hidden_size=hidden_size, tol=tol,
                                     first_row=_first_position(rec) + rows.start)

            outcomes.extend(_chunk_outcomes(rank, i, rec, report, judge))
            if report.ok or reported:
                continue  # every request is judged; the first wrong one per rank is worded
            reported = True
            partial = []
            for slot, index in enumerate(expected):
                cols = slice(slot * hidden_size, (slot + 1) * hidden_size)
                fit = partial_sum_fraction(rec.aux[:, cols], ref[index], tp)
                if fit is not None:
                    partial.append(PARTIAL_SUM.format(slot=slot, rank=rank, fraction=fit[0],
                                                      label=full_label(index, num_layers), err=fmt_err(fit[1])))
            lines.append(RANK_PREFIX.format(rank=rank, message=report.message()))
            lines.extend(partial)
            plain = plain and not partial
            failed.append(report)
    if lines:
        return RankReport(False, lines, slot_reports=failed if plain else [], outcomes=outcomes)
    return RankReport(True, [ALL_RANKS_OK.format(tp=tp, message="every slot holds its expected snapshot")],
                      outcomes=outcomes)


def chunk_segments(rec: "Record") -> list[tuple[str, int, int]]:
    """``(chunk k, start, stop)`` rows of each forward of a prefill joined over several
    (:attr:`Record.chunks`, a chunked prefill); ``[]`` for one forward."""
    chunks = tuple(getattr(rec, "chunks", ()) or ())
    out, start = [], 0
    for k, rows in enumerate(chunks if len(chunks) > 1 else ()):
        out.append((f"chunk {k + 1}", start, start + rows))
        start += rows
    return out


def _first_position(rec: "Record") -> int:
    positions = getattr(rec, "positions", None)
    return int(positions[0]) if positions is not None and len(positions) else 0


def _chunk_outcomes(rank: int, i: int, rec: "Record", report: Any,
                    judge: Callable[[slice, str], Any]) -> list:
    """The outcome(s) of request ``i`` on ``rank``: one, or for prefill rows joined over
    several forwards (:attr:`Record.chunks`) one per chunk with its forward mode
    (``prefill`` for the first, ``later-chunk`` after), each judged by
    ``judge(rows, side name)``, so the run-level diagnosis sees which chunks were
    wrong.  A right request's chunks are right (not judged again); a wrong chunk
    carries the whole request's worded report, a right one its own; each adds its
    chunk number (from 1), the positions ``(start, stop)`` of its rows and its own
    report (its wrong slots and rows; ``None`` for a right request's)."""
    chunks = tuple(getattr(rec, "chunks", ()) or ())
    if len(chunks) < 2 or sum(chunks) != rec.aux.shape[0]:
        return [(rank, i, report.ok, report)]
    out, start, first = [], 0, _first_position(rec)
    for n, rows in enumerate(chunks):
        part = None if report.ok else judge(slice(start, start + rows),
                                            f"rank {rank}, chunk {n + 1} (rows {start}..{start + rows - 1})")
        ok = part is None or part.ok
        out.append((rank, i, ok, part if ok and part is not None else report, "prefill" if n == 0 else "later-chunk",
                    n + 1, (first + start, first + start + rows), part))
        start += rows
    if not report.ok and all(o[2] for o in out):  # wrong as a whole (rows missing), right per chunk
        return [(rank, i, False, report)]
    return out


REQUESTS_UNMATCHED = ("per-rank recorder: {seen} request ids in the recorded forwards for {sent} requests sent one "
                      "at a time (another client used the engine?)")
NO_VERIFY = ("per-rank recorder: no TARGET_VERIFY forward recorded while the {draft} draft decoded: speculative "
             "decoding did not run on the target (or this SGLang names the mode differently)")


def check_request_count(rids: Sequence[str], sent: int) -> Verdict:
    """Passed when the recorded forwards hold exactly ``sent`` requests."""
    if len(rids) != sent:
        return Verdict.failed(REQUESTS_UNMATCHED.format(seen=len(rids), sent=sent))
    return Verdict.passed()


def check_verify_recorded(count: int, *, draft: str) -> Verdict:
    """Passed when at least one verify forward was recorded: a check of verify
    rows over none would pass without checking anything."""
    if count == 0:
        return Verdict.failed(NO_VERIFY.format(draft=draft))
    return Verdict.passed()


NOT_SERVED = ("no TP rank recorded rows of request {i} (rid {rid}); ranks recorded requests {seen}: "
              "its captures on the ranks were not checked")
#: Forward modes whose rows :func:`rank_rows_by_position` compares, by the name the report uses.
ROW_MODES = {"EXTEND": "prefill", "MIXED": "prefill", "DECODE": "decode"}


def rank_rows_by_position(forwards: Mapping[int, Sequence["Record"]], rids: Sequence[str],
                          references: Sequence["torch.Tensor"], *, expected: Sequence[int], num_layers: int,
                          hidden_size: int, tol: float, every_rank: bool,
                          modes: Mapping[str, str] = ROW_MODES,
                          evidence: Sequence[EvidenceLike] | None = None) -> list[tuple[Any, int, int, str]]:
    """Each TP rank's captured rows of each request, prefill and decode apart,
    against the reference at the rows' own positions.

    ``forwards``: rank -> the forwards holding the requests' rows, restricted to
    them (:func:`pytest_eagle3.engine.recordings.request_forwards`; records carry
    ``rids`` and ``positions``).  ``references[i]``: ``[L+2, N, H]`` of request
    ``rids[i]``'s sequence (prompt, then the generated tokens the decode rows
    read), covering every recorded position.  Under attention DP a request's rows
    are on the rank that served it; otherwise (``every_rank``) on every rank.
    ``modes``: SGLang forward mode -> the mode a comparison is named by (records of
    other modes are skipped; default :data:`ROW_MODES`, prefill and decode).
    ``evidence[i]``: the bug candidates of request ``rids[i]``'s whole sequence
    (:func:`pytest_eagle3.verdicts.evidence.checkpoint_evidence`), taken at each
    comparison's positions, so a wrong rank's rows are named by their bug
    (``[partial-sum]``); ``None``: the slot lines only.

    Returns ``(report, rank, request index, mode)`` per comparison (``"prefill"`` /
    ``"decode"``): the :class:`~pytest_eagle3.verdicts.compare.SlotReport` where it
    agrees, else a failed :class:`~pytest_eagle3.verdicts.outcome.Verdict` whose
    text starts with the rank, request and positions and which holds the report;
    and a failed verdict (rank ``-1``) for a request no rank (``every_rank``: some
    rank) recorded.
    """
    import torch

    out: list[tuple[Any, int, int, str]] = []
    index = {str(rid): i for i, rid in enumerate(rids)}
    seen: dict[int, set[str]] = {}
    for rank, recs in sorted(forwards.items()):
        parts: dict[tuple[str, str], list[Any]] = {}
        for rec in recs:
            mode = modes.get(rec.mode)
            if mode is None or rec.positions is None:
                continue
            for rid in rec.rids:
                if rid in index:
                    parts.setdefault((rid, mode), []).append(rec.for_request(rid) or rec)
                    seen.setdefault(rank, set()).add(rid)
        for (rid, mode), got in sorted(parts.items(), key=lambda kv: (index[kv[0][0]], kv[0][1])):
            aux = torch.cat([p.aux for p in got])
            pos = torch.cat([p.positions for p in got]).long()
            ref = references[index[rid]]
            if int(pos.max()) >= ref.shape[1]:
                continue  # a row past the sequence the reference covers (the last sampled token)
            first, last = int(pos.min()), int(pos.max())
            side = f"TP rank {rank}, request {index[rid]} ({mode} rows at positions {first}..{last})"
            ev = None if evidence is None else (lambda e=evidence[index[rid]], p=pos.tolist(): resolve(e).at(p))
            report = compare_slots(aux, ref[:, pos], expected=list(expected), num_layers=num_layers,
                                   hidden_size=hidden_size, tol=tol, side_names=(side, "reference"), evidence=ev)
            out.append((report if report.ok else Verdict.failed(f"{side}: {report.message()}", report),
                        rank, index[rid], mode))
    ranks = sorted(forwards)
    for rid, i in index.items():
        holders = [r for r in ranks if rid in seen.get(r, set())]
        if not holders or (every_rank and len(holders) < len(ranks)):
            out.append((Verdict.failed(NOT_SERVED.format(i=i, rid=rid, seen={r: len(seen.get(r, ())) for r in ranks})),
                        -1, i, "prefill"))
    return out
