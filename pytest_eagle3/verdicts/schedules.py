"""The same speculative decoding under SGLang's two schedules: nothing may change.

SGLang runs a speculative engine's batches either one after the other
(``Scheduler.event_loop_normal``) or with the next batch's scheduling overlapped
with the current forward (``event_loop_overlap``, the GPU default; on CPU through
the ``spec_overlap_schedule`` fill, :mod:`pytest_eagle3.worker.cpu.spec_overlap`),
where the next draft's inputs travel through ``FutureMap``
(``srt/managers/overlap_utils.py``).  With greedy decoding both must return the
same tokens, accept the same drafts and verify the same inputs, so the verify
forwards' aux hidden states must match row for row.  SGLang's own
``test/registered/spec/eagle/test_spec_eagle.py`` runs its checks both ways.

Pure Python over recorded tensors; no pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_eagle3.engine.standin_proof import PATHS, not_taken
from pytest_eagle3.verdicts.distance import rel_err_or_inf
from pytest_eagle3.verdicts.outcome import PASSED, Verdict
from pytest_eagle3.verdicts.snapshots import fmt_err
from pytest_eagle3.worker.cpu.spec_overlap import OVERLAP_ENV

if TYPE_CHECKING:
    from pytest_eagle3.engine.recordings import Record

OVERLAP, NO_OVERLAP, UNKNOWN = "overlap schedule", "no overlap schedule", "schedule not reported"
SAME = ("both engines ran with {schedule} ({a}: {sa}; {b}: {sb}, read from /server_info "
        "disable_overlap_schedule): the pair compares nothing")
NOT_RUN = "the {b} engine was configured for SGLang's overlap schedule on cpu but {why} (log: {log})"


def schedule_of(server_info: Mapping[str, Any] | None) -> str:
    """Which schedule an engine resolved, from its ``/server_info`` (``disable_overlap_schedule``)."""
    value = (server_info or {}).get("disable_overlap_schedule")
    if value is None:
        return UNKNOWN
    return NO_OVERLAP if value else OVERLAP


def keyed(records: Sequence["Record"], rids: Sequence[str]) -> dict[tuple[int, int, tuple[int, ...]], "Record"]:
    """``records`` (one rank's verify row groups) by ``(request index in rids, root position,
    the group's positions)``: the same group on two engines, whose request ids differ."""
    index = {rid: i for i, rid in enumerate(rids)}
    out = {}
    for rec in records:
        pos = tuple(int(p) for p in rec.positions.tolist()) if rec.positions is not None else ()
        out[(index.get(rec.rids[0], -1), pos[0] if pos else -1, pos)] = rec
    return out


def _verify_rows(a: Mapping[Any, "Record"], b: Mapping[Any, "Record"], tol: float,
                 names: tuple[str, str], ends: Sequence[int]) -> tuple[list[str], list[str]]:
    """(differences, notes): every group both engines verified must match; a group one engine
    verified past a request's final sequence (``ends``: each request's length) is a note, any
    other group only one engine verified a difference."""
    lines, notes = [], []
    for label, x, y in ((names[0], a, b), (names[1], b, a)):
        only = [k for k in x if k not in y]
        past = [k for k in only if 0 <= k[0] < len(ends) and max(k[2], default=-1) >= ends[k[0]] - 1]
        if past:
            notes.append(f"{label} verified {len(past)} more group(s) at the requests' ends (positions "
                         f"{', '.join(str(k[1]) for k in past[:4])}), whose results SGLang discards")
        rest = [k for k in only if k not in past]
        if rest:
            lines.append(f"{label} verified {len(rest)} group(s) the other did not, e.g. request {rest[0][0]} "
                         f"positions {list(rest[0][2])}")
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x.input_ids.tolist() != y.input_ids.tolist():
            lines.append(f"request {key[0]}, verify at position {key[1]}: other draft tokens on the two engines")
            break
        err = rel_err_or_inf(x.aux, y.aux)
        if err > tol:
            lines.append(f"request {key[0]}, verify at position {key[1]}: aux rel.err {fmt_err(err)} between the "
                         f"engines (tolerance {tol:g})")
            break
    return lines, notes


def check_schedules(*, names: tuple[str, str], schedules: tuple[str, str], outputs: tuple[list, list],
                    accept_lengths: tuple[float, float], verify: tuple[Mapping[Any, "Record"], Mapping[Any, "Record"]],
                    ends: Sequence[int], tol: float, overlap_log: str | None, tp: int, log: str) -> Verdict:
    """The pair agrees: different schedules really ran, the same tokens, the same accept
    length, the same verify rows (``verify``: each engine's :func:`keyed` groups; ``ends``:
    each request's final length).  ``overlap_log``: on cpu the second engine's log, whose
    overlap stand-in must have run on ``tp`` ranks.  A passed verdict's text is the proof
    line: which schedule each engine ran and what was compared."""
    a, b = names
    if schedules[0] == schedules[1] or UNKNOWN in schedules:
        return Verdict.failed(SAME.format(schedule=schedules[0], a=a, b=b, sa=schedules[0], sb=schedules[1]))
    if overlap_log is not None:
        path = next(p for p in PATHS if p.env[0] == OVERLAP_ENV)
        why = not_taken(overlap_log, path, tp)
        if why is not None:
            return Verdict.failed(NOT_RUN.format(b=b, why=why, log=log))
    lines = [f"request {i}: {a} returned {len(x)} tokens, {b} {len(y)}; first difference at token "
             f"{next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))}"
             for i, (x, y) in enumerate(zip(*outputs)) if list(x) != list(y)]
    if abs(accept_lengths[0] - accept_lengths[1]) > 1e-9:
        lines.append(f"accept length {a} {accept_lengths[0]:.4f}, {b} {accept_lengths[1]:.4f}")
    rows, notes = _verify_rows(verify[0], verify[1], tol, names, ends)
    lines += rows
    if lines:
        return Verdict.failed(f"{a} ({schedules[0]}) and {b} ({schedules[1]}) differ:\n" + "\n".join(lines + notes))
    same = len(set(verify[0]) & set(verify[1]))
    return Verdict(PASSED, f"{a}: {schedules[0]}; {b}: {schedules[1]} (from /server_info); same tokens, accept "
                           f"length {accept_lengths[0]:.3f} on both, {same} verify row groups equal"
                           + "".join(f"; {n}" for n in notes))
