"""``--eagle3-bisect``: a run whose exit status ``git bisect run`` understands.

* **0** (good): the deciding tests ran and every wiring assertion held;
* **1** (bad): a wiring assertion failed (a slot holds the wrong snapshot, an
  incomplete all-reduce, ...): the verdict line gives the run-level cause
  (:mod:`pytest_eagle3.plugin.diagnosis`) and the first failure;
* **125** (skip this commit): the commit cannot be tested: SGLang does not
  import, the engine does not start, a needed feature is missing, collection
  failed, or nothing ran.

The deciding set is small: the packaged tests served by the wide case's engine
at the smallest TP size of the run (capture order, contracts, embedding
all-reduce and the request-shape paths sharing that one engine), plus the same
at ``--tp`` when it is larger than 1 (one more engine, with the per-rank
checks).  Other tests are deselected.

An ``Eagle3Error`` that says the commit cannot be exercised
(:data:`UNTESTABLE_ERRORS`) marks its test untestable; an engine failure whose
log tail names the capture itself (:data:`CAPTURE_FAILURE`) is a wiring
failure.  Nothing here imports torch or sglang.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from pytest_eagle3.plugin import session as eagle3_session
from pytest_eagle3.planning import cases
from pytest_eagle3.plugin.run import get_run, get_settings

GOOD, BAD, UNTESTABLE = 0, 1, 125
#: Class names of errors that mean "this commit cannot be tested".
UNTESTABLE_ERRORS = ("Eagle3SGLangMissing", "Eagle3CaptureUnsupported", "Eagle3LeaseTimeout", "ReferenceFailed",
                     "Eagle3EngineError", "Eagle3StartCauseSeen", "Eagle3ConfigError")
#: An engine that dies on these words died of the capture wiring itself.
CAPTURE_FAILURE = re.compile(r"aux_hidden|layers_to_capture|captured \d+ of \d+|hidden_states_to_capture")
#: ``user_properties`` entry of a test that could not exercise the commit (survives xdist).
UNTESTABLE_PROPERTY = "eagle3_untestable"

VERDICT_LINE = "eagle3 bisect: {verdict} (exit {code}): {detail}"
NO_TESTS = "no deciding test ran (collection failed or everything was deselected)"
ALL_PASSED = "{n} wiring test(s) passed"


def mark_untestable(item: pytest.Item, error_class: str, message: str) -> None:
    """Called by the hooks when an ``Eagle3Error`` ends a test: remember whether it
    means "cannot test this commit"."""
    if error_class in UNTESTABLE_ERRORS and not CAPTURE_FAILURE.search(message):
        item.user_properties.append(
            (UNTESTABLE_PROPERTY, f"{error_class}: {message.splitlines()[0] if message else ''}"))


class BisectPlugin:
    """Selects the deciding tests, classifies outcomes, sets the exit status."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.passed = 0
        self.bad: list[str] = []
        self.untestable: list[str] = []
        self.collect_errors = 0

    def __hash__(self) -> int:
        return id(self)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        settings = get_settings(config)
        sizes = sorted({1, settings.tp})
        keep, drop = [], []
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            need = params.get(eagle3_session.NEED_ARGNAME)
            tp = eagle3_session.item_tp(item)
            wide = need is not None and need.case == cases.WIDE_CASE and need.engine_group == cases.WIDE_CASE
            (keep if wide and tp in sizes else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collect_errors += 1

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(report, "wasxfail"):
            return
        why = next((v for k, v in report.user_properties if k == UNTESTABLE_PROPERTY), None)
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed and why is not None:
            self.untestable.append(f"{report.nodeid}: {why}")
        elif report.failed:
            line = (report.longreprtext or "").strip().splitlines()
            first = next((x[2:] for x in line if x.startswith("E ")), line[0] if line else "failed")
            self.bad.append(f"{report.nodeid}: {first}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        code, verdict, detail = self.decide()
        get_run(self.config).bisect_result = {"verdict": verdict, "exit": code, "first": detail}
        session.exitstatus = code

    def decide(self) -> tuple[int, str, str]:
        """``(exit status, verdict word, detail)`` from what ran."""
        if self.bad:
            return BAD, "bad", self._cause(self.bad[0])
        if self.untestable:
            return UNTESTABLE, "untestable", self.untestable[0]
        if self.collect_errors or not self.passed:
            return UNTESTABLE, "untestable", NO_TESTS
        return GOOD, "good", ALL_PASSED.format(n=self.passed)

    def _cause(self, first: str) -> str:
        """The run-level diagnosis's headline (:mod:`pytest_eagle3.plugin.diagnosis`)
        with the first failure, or the first failure alone when there is none."""
        diagnosis = get_run(self.config).diagnosis if self.config is not None else None
        result = diagnosis.result() if diagnosis is not None else None
        if result is None or result.tag == "clean":
            return first
        return f"{result.headline} (first failure: {first})"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        code, verdict, detail = self.decide()
        terminalreporter.write_line(VERDICT_LINE.format(verdict=verdict.upper(), code=code, detail=detail))
