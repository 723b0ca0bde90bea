"""How the run-level diagnosis words its evidence: the modes in order, the
contexts of wrong and right comparisons (:mod:`pytest_eagle3.verdicts.run_cause`).
Pure Python."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence

#: A run-level observation (:class:`pytest_eagle3.verdicts.run_cause.Observation`, read by attribute).
Observation = Any

#: Forward modes an observation can carry, in the order they are reported.
MODES = ("prefill", "later-chunk", "cache-hit", "decode", "verify")
EVIDENCE_FAIL = "  wrong: {test} ({ctx}){what}"
EVIDENCE_PASS = "  right: {count} comparisons on {ctx}"

def ordered(values: Iterable[Any], key: str) -> list[str]:
    vals = [str(v) for v in values]
    if key == "mode":
        return [m for m in MODES if m in vals] + sorted(v for v in vals if v not in MODES)
    return sorted(vals)


def present(values: Iterable[str]) -> list[str]:
    return ordered(set(values), "mode")


def rank_text(obs: Sequence[Observation]) -> str:
    ranks = sorted({o.rank for o in obs if o.rank is not None})
    return f"; TP ranks {', '.join(map(str, ranks))}" if ranks else ""


def where(obs: Sequence[Observation]) -> str:
    modes = ", ".join(present(o.mode for o in obs))
    paths = ", ".join(sorted({o.path for o in obs}))
    return f"modes {modes} / paths {paths}"


def fail_lines(bad: Sequence[Observation], limit: int = 6) -> list[str]:
    seen: dict[tuple[str, str], Observation] = {}
    for o in bad:
        seen.setdefault((o.test, o.context()), o)
    lines = []
    for (test, ctx), o in list(seen.items())[:limit]:
        what = f": {o.line}" if o.line else ""
        lines.append(EVIDENCE_FAIL.format(test=test, ctx=ctx, what=what))
    if len(seen) > limit:
        lines.append(f"  ... and {len(seen) - limit} more wrong")
    return lines


def pass_lines(good: Sequence[Observation], limit: int = 4) -> list[str]:
    groups: dict[str, int] = defaultdict(int)
    for o in good:
        groups[group(o)] += 1
    items = sorted(groups.items(), key=lambda kv: -kv[1])
    return [EVIDENCE_PASS.format(count=n, ctx=ctx) for ctx, n in items[:limit]]


def group(o: Observation) -> str:
    parts = [f"tp {o.tp}", o.mode]
    if o.rank is not None:
        parts.append(f"rank {o.rank}")
    if o.ids is not None:
        parts.append(f"ids {list(o.ids)}")
    return ", ".join(parts)


# The run-level diagnosis's headlines and lines (pytest_eagle3.verdicts.run_cause).
CLEAN = "[clean] nothing is wrong: {n} comparison{n_s} in {tests} test{tests_s} agree{verb_s} ({modes}{ranks})"
DRAFT_SIDE = ("[draft-side] captures right in every capture comparison ({n}){offline}; served acceptance "
              "{served}: the draft side consumes right captures wrong (its fc input order, its norm, "
              "or the ids its config.json declares)")
OFFLINE_OK = " and offline (accept length {value:.2f} on SGLang's own captures)"
OFFLINE_LACKING = "offline acceptance not run in this selection: cannot tell the draft from its captures' consumer"
PRECISION = ("[precision] every slot holds the right snapshot, off by up to {err:.1e} (tolerance {tol:.0e}) "
             "in {n} comparisons: a lower-precision copy ({fmt})")
RANK_ONLY = ("[rank] {ranks} only: every comparison of {ranks} is wrong ({n}) and every other rank's right "
             "({m}): a communication or state only {ranks} uses")
RANK_MODE = ("[rank-mode] {ranks} only, {modes} only: a {modes}-only path of {ranks} "
             "(a communication or state that only those forwards use)")
STALE = ("[stale-state] right for the first {k} send(s) of the suite's prompts on each engine, wrong from "
         "then on: state that changes over an engine's life")
STALE_REQUEST = ("[stale-state] right for the first {k} send(s) and the first {r} request(s) of send {n} on "
                 "each engine, wrong from then on: state that changes over an engine's life")
PATH_ONLY = ("[path-only] wrong only on {where}; right on {right} for ids {ids}: the {where} path "
             "captures other values, not the id rule")
GLOBAL = "[global] every mode and path the run took fails the same way: {cause}"
MIXED = ("[mixed] failures on {bad} and passes on {good} do not separate by mode, path, rank or "
         "request order: read the first failure ({first})")

NO_VERDICT = ("[no-verdict] none of the run's {n} comparisons is wrong, but {k} test(s) failed without one: "
              "{first}: {line}")
UNOBSERVED_LINE = "  also failed, without a comparison: {test}: {line}"
CONTRADICTED = ("  the per-test diagnosis {kinds} names the id rule; ids {ids} were captured right on "
                "{right} in this run, so the id rule is not the cause")
LACK_PREFILL = "plain prefill not run in this selection: cannot tell a path fault from the id rule"
LACK_RANKS = "no per-rank test in this selection: a fault on one TP rank shows only through rank 0's output"
PAIR_RANK_LINE = ("  also: {n} comparison(s) of the TP ranks with each other disagree ({tests}): a pair check "
                  "cannot say which rank is wrong; the ranks' comparisons with the reference above do")
