"""The ``eagle3 figures`` section of the terminal summary: what a run measured.

Shown without ``-v`` whenever a packaged test measured something:

* per acceptance test: accept length (tokens per verify) and accept rate
  (accepted / proposed draft tokens) against the gate, verify steps, outcome;
* per power check: the draft offline on SGLang's captures, on the reference,
  and the best miswired wiring (the gate's margin);
* per capture case (the ``[...]`` id of the tests that share it): the worst
  relative L2 error of an expected slot against the tolerance, over every test
  of that case.

Figures travel as ``record_property`` entries named ``eagle3_*`` (they reach
the pytest-xdist controller and JUnit XML); the worst error per test is added
here from the ``pytest_eagle3_verdict`` hook.  Engine start times are the
``eagle3 engines`` section (:mod:`pytest_eagle3.plugin.run`).

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_eagle3.draft.wiring import CORRECT, MISWIRINGS
from pytest_eagle3.plugin.current_item import TracksCurrentItem

TITLE = "eagle3 figures"
WORST_PROPERTY = "eagle3_worst_rel_err"
#: Properties of the speculative-shape tests (suite/test_speculative_shapes.py) printed as they are:
#: the tree nodes a verify check compared, what the draft was fed, which schedule each engine ran.
SHAPE_PROPERTIES = ("eagle3_tree", "eagle3_draft_feed", "eagle3_schedules")
ACCEPT_HEAD = ("acceptance", "accept length", "rate", "verifies", "gate length/rate", "outcome")
POWER_LINE = ("{test}: offline accept length {got:.3f} on SGLang's captures, {ref:.3f} on the reference; "
              "best miswired {worst:.3f} ({name})")
CAPTURE_HEAD = ("capture case", "tests", "worst rel. error", "tolerance", "")


def worst_expected_error(report: Any) -> float | None:
    """The largest relative L2 error of an expected slot (slot reports) or an
    embedding row (embedding reports); ``None`` for reports without one."""
    slots = getattr(report, "slots", None)
    if slots:
        errors = [v.expected_err for v in slots if not math.isnan(v.expected_err)]
        return max(errors) if errors else None
    rows = getattr(report, "rows", None)
    if rows:
        return max(r.err for r in rows)
    return None


def case_id(nodeid: str) -> str:
    """``tests/x.py::test_a[tp2-wide]`` -> ``tp2-wide``; the test name without one."""
    head, sep, rest = nodeid.partition("[")
    return rest.rstrip("]") if sep else head.rpartition("::")[2]


def short_name(nodeid: str) -> str:
    return nodeid.rpartition("::")[2]


@dataclass
class CaseFigure:
    tests: int = 0
    worst: float = 0.0
    tol: float = 0.0


@dataclass
class Figures(TracksCurrentItem):
    """Collects the run's figures from test reports and prints them."""

    acceptance: list[tuple[str, ...]] = field(default_factory=list)
    power: list[str] = field(default_factory=list)
    #: What the speculative-shape tests compared (:data:`SHAPE_PROPERTIES`), one line each.
    shapes: list[str] = field(default_factory=list)
    cases: dict[str, CaseFigure] = field(default_factory=dict)

    def __hash__(self) -> int:
        return id(self)

    def pytest_eagle3_verdict(self, config: pytest.Config, report: Any) -> None:
        err, tol = worst_expected_error(report), getattr(report, "tol", None)
        if self.item is None or err is None or tol is None:
            return
        props = self.item.user_properties
        old = next((i for i, (k, _) in enumerate(props) if k == WORST_PROPERTY), None)
        if old is None:
            props.append((WORST_PROPERTY, {"err": err, "tol": tol}))
        elif err > props[old][1]["err"]:
            props[old] = (WORST_PROPERTY, {"err": err, "tol": tol})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
            return
        props = dict(report.user_properties)
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        if "eagle3_accept_length" in props:
            gates = props.get("eagle3_gates") or {}
            rate = props.get("eagle3_accept_rate")
            self.acceptance.append((
                short_name(report.nodeid), f"{props['eagle3_accept_length']:.3f}",
                "-" if rate is None else f"{rate:.3f}", str(props.get("eagle3_verify_count", "-")),
                f"{gates.get('min_accept_length', float('nan')):.2f}/{gates.get('min_accept_rate', float('nan')):.2f}",
                outcome))
        offline = props.get("eagle3_offline")
        if isinstance(offline, dict) and CORRECT in offline:
            # Only wirings SGLang can produce: probes and benign ones (bf16) are no margin.
            miswired = {n: q for n, q in offline.items() if n in MISWIRINGS}
            if miswired:
                name, worst = max(miswired.items(), key=lambda kv: kv[1]["accept_length"])
                self.power.append(POWER_LINE.format(
                    test=short_name(report.nodeid), got=offline[CORRECT]["accept_length"],
                    ref=offline[CORRECT]["reference_accept_length"], worst=worst["accept_length"], name=name))
        self.shapes += [f"{short_name(report.nodeid)}: {props[k]}" for k in SHAPE_PROPERTIES
                        if isinstance(props.get(k), str)]
        worst = props.get(WORST_PROPERTY)
        if isinstance(worst, dict):
            case = self.cases.setdefault(case_id(report.nodeid), CaseFigure())
            case.tests += 1
            case.worst = max(case.worst, float(worst["err"]))
            case.tol = float(worst["tol"])

    def lines(self) -> list[str]:
        out: list[str] = []
        if self.acceptance:
            out += _grid([ACCEPT_HEAD, *self.acceptance])
        out += self.power
        out += self.shapes
        if self.cases:
            if out:
                out.append("")
            rows = [(name, str(c.tests), f"{c.worst:.2g}", f"{c.tol:.2g}", "ok" if c.worst <= c.tol else "OVER")
                    for name, c in sorted(self.cases.items())]
            out += _grid([CAPTURE_HEAD, *rows])
        return out

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        lines = self.lines()
        if lines:
            terminalreporter.section(TITLE, sep="-")
            for line in lines:
                terminalreporter.line(line)


def _grid(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
