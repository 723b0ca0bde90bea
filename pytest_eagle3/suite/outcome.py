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
from typing import Any

import pytest

from pytest_eagle3.plugin.run import get_run
from pytest_eagle3.verdicts.outcome import FAILED, REPORTED, SKIPPED, XFAILED, Verdict
from pytest_eagle3.verdicts.summary import same_cause

def recorded_causes(config: pytest.Config) -> list[str]:
    """Tests of this pytest process that reported a capture defect in full
    (:func:`fail_if_bad`), in the order they did."""
    return list(dict.fromkeys(get_run(config).causes.values()))


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]


def fail_if_bad(report: Any, *, verbose: bool = False, config: pytest.Config | None = None,
                cause: str | None = None) -> Any:
    """``pytest.fail(report.message())`` without a traceback when ``not report.ok``;
    returns the report otherwise.  ``config`` (or ``verbose``) turns on the tables
    (``-v``); with ``config`` the run's ``pytest_eagle3_verdict`` hook
    (:mod:`pytest_eagle3.plugin.hookspec`) sees the report first.  ``cause``: a
    line known before the engine ran that explains the failure (it leads the message).

    One root cause, one failure: with ``config``, the first test whose diagnosis
    has a given :func:`~pytest_eagle3.verdicts.summary.cause_signature` reports
    it in full; a later one with the same signature fails with
    :data:`~pytest_eagle3.verdicts.summary.SAME_CAUSE`, naming the first and its
    own first slot line (per pytest process; with ``-v`` every test reports in full)."""
    __tracebackhide__ = True
    if config is not None and hasattr(config.hook, "pytest_eagle3_verdict"):
        config.hook.pytest_eagle3_verdict(config=config, report=report)
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


def conclude(verdict: Verdict, config: pytest.Config | None = None) -> Verdict:
    """The test's outcome from a check's verdict: ``pytest.fail`` / ``xfail`` /
    ``skip`` with its message (no traceback); a reported verdict goes through
    :func:`fail_if_bad` with ``config``.  Returns the verdict when the test goes on."""
    __tracebackhide__ = True
    if verdict.outcome == REPORTED:
        fail_if_bad(verdict.report, config=config, cause=verdict.cause)
    elif verdict.outcome == FAILED:
        pytest.fail(verdict.text, pytrace=False)
    elif verdict.outcome == XFAILED:
        pytest.xfail(verdict.text)
    elif verdict.outcome == SKIPPED:
        pytest.skip(verdict.text)
    return verdict
