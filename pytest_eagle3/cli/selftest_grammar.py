"""``pytest-eagle3 self-test --grammar N --seed S``: sampled faults on the real engine.

Draws ``N`` faults from the grammar with seed ``S``
(:func:`pytest_eagle3.planning.grammar_faults.sample_faults`: a confinement by TP
size, TP rank and forward mode, times an effect), and for each runs the packaged
suite's default selection in a child pytest with the fault injected into every
SGLang process (``--eagle3-fault JSON``).  Each run's report
(``--eagle3-report``) holds its observations and the run-level diagnosis's named
cause; :func:`pytest_eagle3.verdicts.grammar.judge_run` classifies it:

* ``exact``: the named cause is the sampled confinement;
* ``coarser``: another conjunction that holds the same comparisons (the
  selection cannot tell them apart);
* ``unnamed``: nothing named (``[mixed]`` or ``[global]``);
* ``wrong``: the named cause holds a right comparison or misses a wrong one;
* ``off-target``: the wrong comparisons are not the ones the confinement holds.

A sample passes when it is exact or coarser.  Same seed, same faults.
Nothing here imports torch or sglang: the children do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pytest_eagle3.planning.grammar_faults import SampledFault, sample_faults
from pytest_eagle3.verdicts.grammar import judge_run
from pytest_eagle3.verdicts.run_cause import Observation

#: Classes that satisfy the grammar's property.
PASSING = ("exact", "coarser")


@dataclass
class SampleResult:
    """One sampled fault's run: its class, why, the diagnosis headline, the log."""

    sample: SampledFault
    verdict: str
    why: str
    headline: str
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        return self.verdict in PASSING


def read_report(path: Path) -> tuple[list[Observation], tuple, str]:
    """Observations, the named cause (attribute -> values) and the headline of an
    ``--eagle3-report`` file.

    Raises:
        ValueError: no report, or one without a run-level diagnosis.
    """
    if not path.is_file():
        raise ValueError(f"no report at {path}")
    data = json.loads(path.read_text())
    obs = [Observation.from_json(o) for t in data.get("tests", ()) for o in t.get("observations", ())]
    diag = data.get("diagnosis")
    if not diag:
        raise ValueError(f"{path}: no run-level diagnosis")
    named = tuple((name, frozenset(values)) for name, values in (diag.get("named") or {}).items())
    return obs, named, str(diag.get("headline", ""))


def grammar_test(work: Path, n: int, seed: int, runner: Callable[..., Any], *, tp: int = 2,
                 extra: Sequence[str] = (), progress: Callable[[str], None] = print,
                 only: Sequence[int] | None = None) -> list[SampleResult]:
    """Run ``n`` sampled faults (seed ``seed``; ``only``: just those sample numbers,
    1-based) through the default selection at ``--eagle3-tp tp``, one after the
    other; one child pytest each (``runner(work_dir, tests, tp, fault, extra)``:
    :func:`pytest_eagle3.cli.selftest.run_child`, no tests), its files under
    ``work/sample-K``."""

    def one(sample: SampledFault) -> SampleResult:
        where = work / f"sample-{sample.index}"
        progress(f"[{sample.index}/{n}] {sample.text}: --eagle3-fault '{sample.fault_json}'")
        run = runner(where, (), tp, sample.fault_json, list(extra))
        try:
            obs, named, headline = read_report(where / "report.json")
            verdict, why = judge_run(obs, named, sample.conjunction)
        except ValueError as exc:
            verdict, why, headline = "NOT RUN", f"exit {run.returncode}: {exc}", ""
        progress(f"      sample {sample.index}: {verdict} in {run.seconds:.0f} s: {why}\n"
                 f"      run: {headline[:400]}")
        return SampleResult(sample, verdict, why, headline, run.seconds, where / "output.txt")

    return [one(sample) for sample in sample_faults(n, seed) if not only or sample.index in only]


def render_grammar(results: Sequence[SampleResult], seed: int, n: int | None = None) -> list[str]:
    """The summary: each sample's confinement, class and diagnosis; the counts
    (``n``: the samples drawn, where only some ran; default: all of ``results``)."""
    head = f"--grammar {n if n is not None else len(results)} --seed {seed}"
    if n is not None and len(results) != n:
        head += "".join(f" --sample {r.sample.index}" for r in results)
    lines = [f"pytest-eagle3 self-test {head}: sampled confinement -> run-level cause"]
    for r in results:
        lines.append(f"  {r.sample.index:>2}. {r.sample.text}")
        lines.append(f"      {r.verdict}: {r.why}")
        lines.append(f"      run: {r.headline[:400]}")
    counts = {v: sum(r.verdict == v for r in results) for v in dict.fromkeys(r.verdict for r in results)}
    passed = sum(r.ok for r in results)
    lines.append(f"{passed} of {len(results)} named exactly or coarser ("
                 + ", ".join(f"{v} {c}" for v, c in counts.items()) + ")")
    return lines
