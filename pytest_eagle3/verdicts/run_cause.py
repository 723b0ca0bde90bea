"""The run-level diagnosis: the narrowest cause the whole run's evidence supports.

Each test judges its own captures (:mod:`pytest_eagle3.verdicts.compare`); the
evidence that names a cause lies across tests: which paths, forward modes,
TP ranks, requests and levels passed.  Every verdict of the run leaves an
:class:`Observation` (its context and outcome); :func:`diagnose_run` reads
them all after the last test and returns a :class:`RunDiagnosis` with a tag,
one headline and the evidence lines behind it.  The rules, in order:

* ``[clean]``: nothing failed.
* ``[draft-side]``: every capture comparison passed, served acceptance failed
  (and the offline accept length on SGLang's own captures passed, when it ran):
  the draft consumes right captures wrong.
* ``[precision]``: every wrong slot holds the snapshot it should, off by more
  than the tolerance and less than :data:`PRECISION_CEILING`: a lower-precision
  copy (the size names half precision or bfloat16).
* ``[rank]``: every failure is on a strict subset of TP ranks, and no
  comparison on those ranks passed.
* ``[rank-mode]``: every failure is on a strict subset of TP ranks and of
  forward modes, while other ranks and modes passed, and no comparison on
  those ranks in those modes passed.
* ``[stale-state]``: on each engine with failures, the first requests passed
  and every comparison from the first failure on failed.
* ``[path-only]``: every failure is in forward modes (later prefill chunk,
  radix-cache hit, decode, verify) or paths (batch, a variant) where nothing
  passed, while the same ids passed elsewhere in the run: never the id rule.
* ``[confined]``: the smallest conjunction of TP size, TP rank, forward mode,
  prefill chunk, path, batch size and send order that holds every wrong
  comparison and no right one (:func:`separation`; several: the others in the
  lacking line).
* ``[global]``: failures on every mode and path the run took: the tests' own
  diagnosis is the run's.

A cause that names comparisons is narrowed to the slots and the row range every
wrong one shares (:func:`pytest_eagle3.verdicts.within.within`: ``; inside them
only slot 1, positions 16 on wrong, the rest right``).

A named cause never holds a right comparison (:mod:`pytest_eagle3.verdicts.separation`);
where none separates, ``[mixed]`` prints the separating table and names nothing.

What the selection lacked is said (``plain prefill not run in this selection:
cannot tell a path fault from the id rule``).  Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from pytest_eagle3.verdicts.distance import PRECISION_CEILING, roundoff_name
from pytest_eagle3.verdicts.observation import (  # noqa: F401 - re-exported: the diagnosis's input
    CAPTURE, OFFLINE, SERVED, Observation, forward_mode,
)
from pytest_eagle3.verdicts.run_wording import (  # noqa: F401 - the headlines are part of this module's API
    CLEAN, CONTRADICTED, DRAFT_SIDE, GLOBAL, LACK_PREFILL, LACK_RANKS, MIXED, MODES, NO_VERDICT, OFFLINE_LACKING,
    OFFLINE_OK, PAIR_RANK_LINE, PATH_ONLY, PRECISION, RANK_MODE, RANK_ONLY, STALE, STALE_REQUEST, UNOBSERVED_LINE,
    fail_lines, ordered, pass_lines, present, rank_text, where,
)
from pytest_eagle3.verdicts.separation import (
    TABLE_ATTRIBUTES, conjunction_text, holds, relevant, request_key, send_text, separating_table, separation,
)
from pytest_eagle3.verdicts.within import within, within_text

#: Modes of the target's decode-time forwards (one token per request, or a draft's tokens).
DECODE_MODES = ("decode", "verify")
#: Checks that compare captured values with the reference: only their passes are
#: evidence that a mode, path, rank or request is right.
VALUE_CHECKS = ("captures", "ranks")
#: The check that compares the TP ranks with each other (``test_ranks_hold_identical_captures``):
#: a disagreement says some rank is wrong, not which (rank 0 is the side every other is
#: compared with), so where the ranks' comparisons with the reference also failed, those
#: name the rank and the disagreements point to them.
PAIR_RANK_CHECK = "agree"
#: The per-test diagnosis tags that name the id rule (a global cause).
ID_RULE_KINDS = ("offset-twice", "offset-missing", "ids-ignored")

TITLE = "eagle3 diagnosis"
POINTER = "see the '{title}' section at the end: it weighs this failure against every other test of the run"




@dataclass(frozen=True)
class RunDiagnosis:
    """What :func:`diagnose_run` concluded.

    Attributes:
        tag: ``clean``, ``no-verdict``, ``draft-side``, ``draft``, ``precision``,
            ``rank``, ``rank-mode``, ``stale-state``, ``path-only``, ``confined``, ``global``
            or ``mixed``.
        headline: one line, starting with ``[tag]``.
        evidence: the lines that support it.
        lacking: what this selection did not run that the diagnosis would need.
    """

    tag: str
    headline: str
    evidence: tuple[str, ...] = ()
    lacking: tuple[str, ...] = ()
    #: The cause as attribute constraints (``TABLE_ATTRIBUTES`` names -> values): the
    #: comparisons it names are ``separation.named_set``'s; ``()``: a cause named by its
    #: effect (precision, draft side) or none.
    named: tuple[tuple[str, frozenset[str]], ...] = ()

    def lines(self) -> list[str]:
        return [self.headline, *self.evidence, *(f"lacking: {x}" for x in self.lacking)]

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "headline": self.headline, "evidence": list(self.evidence),
                "lacking": list(self.lacking), "named": {name: sorted(values) for name, values in self.named}}


def diagnose_run(observations: Iterable[Observation],
                 unobserved: Sequence[tuple[str, str]] = ()) -> RunDiagnosis | None:
    """The run's diagnosis from every :class:`Observation` (``None``: there are
    none).  ``unobserved``: ``(test, first line)`` of failed tests that left no
    observation (an engine that did not start, a check that does not hand over
    its context): named, never counted as right."""
    obs = list(observations)
    if not obs:
        return None
    diag = _diagnose(obs)
    if not unobserved:
        return diag
    also = tuple(UNOBSERVED_LINE.format(test=t, line=line) for t, line in unobserved[:4])
    if diag.tag == "clean":
        first, line = unobserved[0]
        return RunDiagnosis("no-verdict", NO_VERDICT.format(n=len(obs), k=len(unobserved), first=first, line=line),
                            also[1:], ())
    return RunDiagnosis(diag.tag, diag.headline, diag.evidence + also, diag.lacking, diag.named)


def compared(obs: Sequence[Observation]) -> tuple[list[Observation], tuple[str, ...]]:
    """The capture comparisons the rules separate, and the line that points failing
    pair checks to the ranks' own failures (then left out).  A passing pair or row-count
    check is no evidence that the values are right (two equally wrong captures agree),
    nor a right comparison that examined none of the wrong snapshots (``relevant``)."""
    captures = [o for o in obs if o.level == CAPTURE and (not o.ok or o.check in VALUE_CHECKS)]
    pair = [o for o in captures if not o.ok and o.check == PAIR_RANK_CHECK]
    pointing: tuple[str, ...] = ()
    if pair and any(not o.ok and o.check != PAIR_RANK_CHECK and o.rank is not None for o in captures):
        captures = [o for o in captures if not (o.check == PAIR_RANK_CHECK and not o.ok)]
        tests = ", ".join(dict.fromkeys(o.test.rsplit("::", 1)[-1] for o in pair))
        pointing = (PAIR_RANK_LINE.format(n=len(pair), tests=tests),)
    return relevant(captures), pointing


def _diagnose(obs: list[Observation]) -> RunDiagnosis:
    captures, pointing = compared(obs)
    bad = [o for o in captures if not o.ok]
    diag = _diagnose_captures(obs, captures, bad)
    if pointing:
        return RunDiagnosis(diag.tag, diag.headline, diag.evidence + pointing, diag.lacking, diag.named)
    return diag


def _diagnose_captures(obs: list[Observation], captures: list[Observation], bad: list[Observation]) -> RunDiagnosis:
    served_bad = [o for o in obs if o.level == SERVED and not o.ok]
    lacking = _lacking(captures, bad)
    if not bad and not served_bad:
        tests = len({o.test for o in obs})
        return RunDiagnosis("clean", CLEAN.format(n=len(obs), n_s="s" * (len(obs) != 1),
                                                  tests=tests, tests_s="s" * (tests != 1),
                                                  verb_s="s" * (len(obs) == 1),
                                                  modes=", ".join(present(o.mode for o in obs)),
                                                  ranks=rank_text(obs)), (), ())
    if not bad:
        return _draft_side(obs, captures, served_bad)
    for rule in (_precision, _rank_only, _rank_mode, _stale, _path_only, _confined):
        found = rule(captures, bad)
        if found is not None:
            tag, headline, evidence, *more = found
            extra = list(more[0]) if more else []
            named = tuple(more[1]) if len(more) > 1 else ()
            inner = within(bad) if named else []
            if inner:  # the slots and rows every wrong comparison shares: part of the cause
                named += tuple(inner)
                headline += WITHIN.format(what=within_text(inner))
            return RunDiagnosis(tag, headline, tuple(evidence), tuple(lacking + extra), named)
    return _global(captures, bad, lacking)


def _lacking(captures: Sequence[Observation], bad: Sequence[Observation]) -> list[str]:
    if not bad:
        return []
    out = []
    if not any(o.mode == "prefill" and o.path == "plain" for o in captures) and not any(
            o.mode == "prefill" and o.ok for o in captures):
        out.append(LACK_PREFILL)
    if max((o.tp for o in captures), default=1) > 1 and not any(o.rank is not None for o in captures):
        out.append(LACK_RANKS)
    return out


def _draft_side(obs: Sequence[Observation], captures: Sequence[Observation],
                served_bad: Sequence[Observation]) -> RunDiagnosis:
    offline = [o for o in obs if o.level == OFFLINE]
    offline_ok = [o for o in offline if o.ok and o.value is not None]
    best = max((o.value for o in offline_ok if o.value is not None), default=None)
    offline_text = OFFLINE_OK.format(value=best) if offline_ok else ""
    lacking = [] if offline_ok else [OFFLINE_LACKING]
    if not captures:
        lacking.append("no capture test in this selection: cannot tell the captures from the draft side")
    served = ", ".join(f"{o.value:.3f} ({o.test})" if o.value is not None else o.test for o in served_bad[:3])
    headline = DRAFT_SIDE.format(n=len(captures), offline=offline_text, served=served)
    if offline and not offline_ok:
        # The draft fails on SGLang's own captures too: the draft, not its consumer.
        headline = ("[draft] served and offline acceptance both fail while every capture comparison "
                    f"({len(captures)}) passed: the draft itself (its weights or its training contract)")
        return RunDiagnosis("draft", headline, tuple(fail_lines(served_bad)), tuple(lacking))
    return RunDiagnosis("draft-side", headline, tuple(fail_lines(served_bad)), tuple(lacking))


def _precision(captures: Sequence[Observation], bad: Sequence[Observation]):
    slotted = [o for o in bad if not math.isnan(o.worst_err)]
    if len(slotted) != len(bad) or not all(o.right_snapshots for o in bad):
        return None
    err = max(o.worst_err for o in bad)
    if err >= PRECISION_CEILING:
        return None
    tol = min((o.tol for o in bad if not math.isnan(o.tol)), default=math.nan)
    return ("precision", PRECISION.format(err=err, tol=tol, n=len(bad), fmt=roundoff_name(err)), fail_lines(bad))


def _rank_mode(captures: Sequence[Observation], bad: Sequence[Observation]):
    if any(o.rank is None for o in bad):
        return None
    ranks_seen = {o.rank for o in captures if o.rank is not None}
    modes_seen = {o.mode for o in captures if o.rank is not None}
    bad_ranks = {o.rank for o in bad}
    bad_modes = {o.mode for o in bad}
    if not (bad_ranks < ranks_seen and bad_modes < modes_seen):
        return None
    # Right on the same ranks in the other modes, and on the other ranks in these modes.
    if not any(o.ok and o.rank in bad_ranks and o.mode not in bad_modes for o in captures):
        return None
    if any(o.ok and o.rank in bad_ranks and o.mode in bad_modes for o in captures):
        return None  # a right comparison inside the named ranks and modes: they do not separate
    ranks = " and ".join(f"rank {r}" for r in sorted(bad_ranks))  # type: ignore[type-var]
    modes = " and ".join(m for m in MODES if m in bad_modes)
    return ("rank-mode", RANK_MODE.format(ranks=ranks, modes=modes),
            fail_lines(bad) + pass_lines([o for o in captures if o.ok and o.rank is not None]), [],
            [("TP rank", frozenset(f"rank {r}" for r in bad_ranks)), ("forward mode", frozenset(bad_modes))])


def _rank_only(captures: Sequence[Observation], bad: Sequence[Observation]):
    """Every failure on a strict subset of the TP ranks the run recorded, every
    comparison on those ranks wrong, and the other ranks right in the same modes."""
    if any(o.rank is None for o in bad):
        return None
    ranked = [o for o in captures if o.rank is not None]
    bad_ranks = {o.rank for o in bad}
    if not bad_ranks < {o.rank for o in ranked}:
        return None
    inside = [o for o in ranked if o.rank in bad_ranks]
    if any(o.ok for o in inside):
        return None
    bad_modes = {o.mode for o in bad}
    others = [o for o in ranked if o.rank not in bad_ranks and o.mode in bad_modes]
    if not others or not all(o.ok for o in others):
        return None
    ranks = " and ".join(f"TP rank {r}" for r in sorted(bad_ranks))  # type: ignore[type-var]
    return ("rank", RANK_ONLY.format(ranks=ranks, n=len(inside), m=len(others)),
            fail_lines(bad) + pass_lines(others), [], [("TP rank", frozenset(f"rank {r}" for r in bad_ranks))])


def _stale(captures: Sequence[Observation], bad: Sequence[Observation]):
    """On each engine with failures, every request before the first failing one
    passed (there was one), and from it on every comparison fails, across more
    than one mode or path (one mode or path alone is a path fault that ran late).
    Requests are ordered by send, then by their place in the send."""
    if any(o.order < 0 or not o.engine for o in bad):
        return None
    if len({(o.mode, o.path) for o in bad}) < 2:
        return None
    first_bad: dict[str, tuple[int, int]] = {}
    for o in bad:
        first_bad[o.engine] = min(first_bad.get(o.engine, request_key(o)), request_key(o))
    for engine, k in first_bad.items():
        on_engine = [o for o in captures if o.engine == engine and o.order >= 0]
        before = [o for o in on_engine if request_key(o) < k]
        after = [o for o in on_engine if request_key(o) >= k]
        if k[0] == 0 and k[1] <= 0 or not before or not all(o.ok for o in before):
            return None
        if any(o.ok for o in after):
            return None  # a right comparison after the first wrong one: not a state gone stale
    k = min(first_bad.values())
    right = [o for o in captures if o.ok and o.engine in first_bad and request_key(o) < first_bad[o.engine]]
    later = {send_text(o) for o in captures if o.engine in first_bad and request_key(o) >= first_bad[o.engine]}
    headline = STALE.format(k=k[0]) if k[1] <= 0 else STALE_REQUEST.format(k=k[0], r=k[1], n=k[0] + 1)
    return ("stale-state", headline, fail_lines(bad) + pass_lines(right), [],
            [("send on its engine", frozenset(later))])


def _path_only(captures: Sequence[Observation], bad: Sequence[Observation]):
    """The modes or paths whose comparisons all fail, while the same ids passed
    outside them (mode first, then path)."""
    best = None
    for key in ("mode", "path"):
        bad_values = {getattr(o, key) for o in bad}
        seen = {getattr(o, key) for o in captures}
        if not bad_values < seen:
            continue
        if any(o.ok for o in captures if getattr(o, key) in bad_values):
            continue  # a right comparison inside: the mode (path) does not separate
        best = (key, bad_values)
        break
    if best is None:
        return None
    key, bad_values = best
    good = [o for o in captures if o.ok and getattr(o, key) not in bad_values]
    bad_ids = {o.ids for o in bad}
    same_ids = [o for o in good if o.ids in bad_ids]
    if not same_ids:
        return None
    where = " and ".join(ordered(bad_values, key))
    right = ", ".join(ordered({getattr(o, key) for o in same_ids}, key))
    ids = " / ".join(str(list(i)) if i is not None else "(default)" for i in sorted(
        bad_ids, key=lambda x: (x is None, x or ())))
    headline = PATH_ONLY.format(where=where, right=right, ids=ids)
    lines = fail_lines(bad) + pass_lines(same_ids)
    rule_kinds = sorted({k for o in bad for k in o.kinds if k in ID_RULE_KINDS})
    if rule_kinds:
        lines.append(CONTRADICTED.format(kinds=" ".join(f"[{k}]" for k in rule_kinds), ids=ids, right=right))
    name = "forward mode" if key == "mode" else "path"
    return ("path-only", headline, lines, [], [(name, frozenset(str(v) for v in bad_values))])


def _global(captures: Sequence[Observation], bad: Sequence[Observation], lacking: list[str]) -> RunDiagnosis:
    good = [o for o in captures if o.ok]
    first = bad[0]
    bad_ids = {o.ids for o in bad}
    if good and any(o.ids in bad_ids for o in good):
        headline = MIXED.format(bad=where(bad), good=where(good), first=first.test)
        return RunDiagnosis("mixed", headline, tuple(separating_table(captures) + fail_lines(bad)
                                                     + pass_lines(good)), tuple(lacking))
    cause = first.line or ", ".join(f"[{k}]" for k in first.kinds) or "see the first failure"
    return RunDiagnosis("global", GLOBAL.format(cause=f"{cause} ({first.test})"),
                        tuple(fail_lines(bad)), tuple(lacking))


CONFINED = ("[confined] wrong exactly where {where}: all {n} comparisons there are wrong, the {m} elsewhere "
            "right")
#: What :func:`pytest_eagle3.verdicts.within.within` adds to a headline.
WITHIN = "; inside them only {what} wrong, the rest right"
ALSO_SEPARATES = "this selection cannot tell apart: {others} separate the same comparisons"



def _confined(captures: Sequence[Observation], bad: Sequence[Observation]):
    """The smallest exact conjunction (:func:`separation`); several of one size: the
    first named, the others said in the lacking line."""
    rules = separation(captures)
    if not rules:
        return None
    rule = rules[0]
    inside = [o for o in captures if all(holds(read(o), dict(rule)[name]) for name, read in TABLE_ATTRIBUTES
                                         if name in dict(rule))]
    outside = [o for o in captures if o not in inside]
    extra = [ALSO_SEPARATES.format(others="; ".join(conjunction_text(r) for r in rules[1:]))] if len(rules) > 1 else []
    return ("confined", CONFINED.format(where=conjunction_text(rule), n=len(inside), m=len(outside)),
            fail_lines(bad) + pass_lines(outside), extra, rule)



