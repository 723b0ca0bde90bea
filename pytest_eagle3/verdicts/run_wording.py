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
