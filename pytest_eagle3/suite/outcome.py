"""A verdict becomes the test's outcome: the one place the packaged suite fails.

The checks (:mod:`pytest_eagle3.verdicts`) return values; :func:`conclude`
turns a :class:`~pytest_eagle3.verdicts.outcome.Verdict` into ``pytest.fail`` /
``xfail`` / ``skip`` without a traceback, and :func:`fail_if_bad` does it for a
comparison report, through the run's ``pytest_eagle3_verdict`` hook
(:mod:`pytest_eagle3.plugin.hookspec`) and the one-cause-one-failure ledger of
this pytest process.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import pytest

from pytest_eagle3.plugin.diagnosis import observe
from pytest_eagle3.plugin.run import get_run
from pytest_eagle3.verdicts.outcome import FAILED, PASSED, REPORTED, SKIPPED, XFAILED, Verdict
from pytest_eagle3.verdicts.summary import same_cause

def recorded_causes(config: pytest.Config) -> list[str]:
    """Tests of this pytest process that reported a capture defect in full
    (:func:`fail_if_bad`), in the order they did."""
    return list(dict.fromkeys(get_run(config).causes.values()))


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]


def fail_if_bad(report: Any, *, verbose: bool = False, config: pytest.Config | None = None,
                cause: str | None = None, where: Mapping[str, Any] | None = None) -> Any:
    """``pytest.fail(report.message())`` without a traceback when ``not report.ok``;
    returns the report otherwise.  ``config`` (or ``verbose``) turns on the tables
    (``-v``); with ``config`` the run's ``pytest_eagle3_verdict`` hook
    (:mod:`pytest_eagle3.plugin.hookspec`) sees the report first.  ``cause``: a
    line known before the engine ran that explains the failure (it leads the message).

    One root cause, one failure: with ``config``, the first test whose diagnosis
    has a given :func:`~pytest_eagle3.verdicts.summary.cause_signature` reports
    it in full; a later one with the same signature fails with
    :data:`~pytest_eagle3.verdicts.summary.SAME_CAUSE`, naming the first and its
    own first slot line (per pytest process; with ``-v`` every test reports in full).

    ``where``: the verdict's context for the run-level diagnosis
    (:class:`~pytest_eagle3.verdicts.run_cause.Observation` fields: ``path``,
    ``mode``, ``ids``, ``order``, ``engine``...; :mod:`pytest_eagle3.plugin.diagnosis`)."""
    __tracebackhide__ = True
    if config is not None and hasattr(config.hook, "pytest_eagle3_verdict"):
        config.hook.pytest_eagle3_verdict(config=config, report=report)
    observe(config, report, where)
    if not report.ok:
        if config is not None:
            verbose = verbose or config.get_verbosity() > 0
            if cause is None and not verbose:
                short = same_cause(report, get_run(config).causes, _current_test())
                if short is not None:
                    pytest.fail(short, pytrace=False)
        message = report.message(verbose=verbose)
        pytest.fail(f"{cause}\n{message}" if cause else message, pytrace=False)
    return report


def conclude(verdict: Verdict, config: pytest.Config | None = None,
             where: Mapping[str, Any] | None = None) -> Verdict:
    """The test's outcome from a check's verdict: ``pytest.fail`` / ``xfail`` /
    ``skip`` with its message (no traceback); a reported verdict goes through
    :func:`fail_if_bad` with ``config``.  Returns the verdict when the test goes on.
    ``where`` (with ``config``): as for :func:`fail_if_bad`; a passed or failed
    verdict is observed too (a skip or an XFAIL is not evidence)."""
    __tracebackhide__ = True
    if verdict.outcome == REPORTED:
        fail_if_bad(verdict.report, config=config, cause=verdict.cause, where=where)
        return verdict
    _observe(config, verdict, where)
    if verdict.outcome == FAILED:
        pytest.fail(verdict.text, pytrace=False)
    elif verdict.outcome == XFAILED:
        pytest.xfail(verdict.text)
    elif verdict.outcome == SKIPPED:
        pytest.skip(verdict.text)
    return verdict


def _observe(config: pytest.Config | None, verdict: Verdict, where: Mapping[str, Any] | None) -> None:
    """Hand ``verdict`` to the run-level diagnosis (a skip or an XFAIL is not evidence)."""
    if where is None or verdict.outcome in (SKIPPED, XFAILED):
        return
    if verdict.outcome == REPORTED:
        observe(config, verdict.report, where)
    elif verdict.report is not None and verdict.outcome == PASSED:
        observe(config, verdict.report, where, ok=True)
    elif getattr(verdict.report, "slots", None) and verdict.outcome == FAILED:
        # A slot comparison worded with its context (a TP rank's rows): its slots are the evidence.
        observe(config, verdict.report, where, ok=False)
    else:
        observe(config, verdict, where, ok=verdict.outcome == PASSED)


def conclude_each(checks: Sequence[tuple[Any, Mapping[str, Any] | None]], config: pytest.Config | None) -> None:
    """Every ``(verdict or comparison report, where)`` is observed first, then the
    test stops on the first that fails, as :func:`conclude` would: the run-level
    diagnosis sees every request of the test, not only those before the first
    wrong one."""
    __tracebackhide__ = True
    verdicts = [c if isinstance(c, Verdict) else Verdict.reported(c) for c, _ in checks]
    for verdict, (_, where) in zip(verdicts, checks):
        _observe(config, verdict, where)
    for verdict in verdicts:
        conclude(verdict, config)
