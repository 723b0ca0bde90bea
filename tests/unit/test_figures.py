"""The ``eagle3 figures`` terminal section (plugin/figures.py): acceptance
figures, the power check's margin and the worst capture error per case, shown
on a passing run without ``-v``."""

from __future__ import annotations

import pytest

from pytest_eagle3.plugin import figures

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")

MEASURED = """
import pytest
from types import SimpleNamespace

def _report(errs, tol):
    return SimpleNamespace(ok=True, tol=tol, message=lambda verbose=False: "",
                           slots=[SimpleNamespace(expected_err=e) for e in errs])

@pytest.mark.parametrize("need", ["acceptance"])
def test_draft_acceptance_meets_the_gate(record_property, need):
    record_property("eagle3_accept_length", 3.985)
    record_property("eagle3_accept_rate", 0.985)
    record_property("eagle3_verify_count", 66)
    record_property("eagle3_gates", {"min_accept_length": 2.53, "min_accept_rate": 0.5, "source": "quality.json"})

def test_acceptance_gate_has_power(record_property):
    record_property("eagle3_offline", {
        "correct": {"first_token_accuracy": 1.0, "accept_length": 3.879, "reference_accept_length": 3.88},
        "ids-plus-1": {"first_token_accuracy": 0.0, "accept_length": 1.031, "reference_accept_length": 3.88},
        "slots-permuted": {"first_token_accuracy": 0.0, "accept_length": 1.113, "reference_accept_length": 3.88},
        "bf16-rounded": {"first_token_accuracy": 1.0, "accept_length": 3.879, "reference_accept_length": 3.88}})

@pytest.mark.parametrize("case", ["tp1-wide", "tp2-wide"])
def test_capture_order(pytestconfig, case):
    from pytest_eagle3.suite.outcome import fail_if_bad
    fail_if_bad(_report([1e-6, 3e-6], 1e-4), config=pytestconfig)
    fail_if_bad(_report([2e-6], 1e-4), config=pytestconfig)

@pytest.mark.parametrize("case", ["tp1-wide"])
def test_contracts(pytestconfig, case):
    from pytest_eagle3.suite.outcome import fail_if_bad
    fail_if_bad(_report([5e-6], 1e-4), config=pytestconfig)
"""


def test_a_passing_run_prints_its_figures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_measured=MEASURED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        f"*{figures.TITLE}*",
        "acceptance * accept length * rate * verifies * gate length/rate * outcome",
        "test_draft_acceptance_meets_the_gate[[]acceptance[]] * 3.985 * 0.985 * 66 * 2.53/0.50 * passed",
        "test_acceptance_gate_has_power: offline accept length 3.879 on SGLang's captures, 3.880 on the reference; "
        "best miswired 1.113 (slots-permuted)",
        "",
        "capture case * tests * worst rel. error * tolerance",
        "tp1-wide * 2 * 5e-06 * 0.0001 * ok",
        "tp2-wide * 1 * 3e-06 * 0.0001 * ok",
    ])


def test_no_section_without_figures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0
    assert figures.TITLE not in result.stdout.str()


def test_case_id() -> None:
    assert figures.case_id("a.py::test_x[tp2-wide]") == "tp2-wide"
    assert figures.case_id("a.py::test_x") == "test_x"
