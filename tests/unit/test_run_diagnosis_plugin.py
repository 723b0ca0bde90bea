"""The ``eagle3 diagnosis`` section (``pytest_eagle3.plugin.diagnosis``): every
verdict a test hands over with its context reaches the end of the run, also
through pytest-xdist; the section closes the summary, the JSON report carries
it, and a failed test that left evidence points to it."""

from __future__ import annotations

import json

import pytest

TESTS = '''
import pytest
from pytest_eagle3.suite.outcome import conclude, conclude_each
from pytest_eagle3.verdicts.outcome import Verdict

def where(mode, order):
    return {"path": "plain", "ids": [0, 3, 5], "mode": mode, "order": order, "engine": "e1"}

@pytest.mark.parametrize("n", range(3))
def test_fresh(n, pytestconfig):
    conclude_each([(Verdict.passed(), where("prefill", n)), (Verdict.passed(), where("later-chunk", n))],
                  pytestconfig)

def test_hit(pytestconfig):
    conclude_each([(Verdict.passed(), where("prefill", 3)),
                   (Verdict.failed("slot 1 holds hs[2] [offset-missing]"), where("cache-hit", 3))], pytestconfig)

def test_untouched():
    pass
'''


@pytest.mark.parametrize("xdist", [False, True])
def test_the_run_names_a_fault_confined_to_cache_hits(pytester: pytest.Pytester, clean_eagle3_env, xdist) -> None:
    pytester.makepyfile(test_run=TESTS)
    report = pytester.path / "r.json"
    args = ["-p", "no:cacheprovider", f"--eagle3-report={report}"] + (["-n", "2"] if xdist else [])
    result = pytester.runpytest_subprocess(*args)
    out = result.stdout.str()
    assert result.ret == 1, out
    lines = result.stdout.lines
    title = next(i for i, line in enumerate(lines) if "eagle3 diagnosis" in line and line.startswith("-"))
    assert lines[title + 1].startswith("[path-only] wrong only on cache-hit; right on prefill, later-chunk "
                                       "for ids [0, 3, 5]"), out
    assert "[offset-missing] names the id rule" in out and "not the cause" in out
    # The section closes the terminal summary (only the short summary follows).
    assert all("eagle3" not in line for line in lines[title + 2:] if line.startswith("-"))
    # The failed test points to it in one line; the passing ones carry nothing.
    assert "see the 'eagle3 diagnosis' section at the end" in out
    data = json.loads(report.read_text())
    diagnosis = data["diagnosis"]
    assert diagnosis["tag"] == "path-only" and diagnosis["headline"] == lines[title + 1]
    hit = next(t for t in data["tests"] if t["nodeid"].endswith("test_hit"))
    assert [(o["mode"], o["ok"]) for o in hit["observations"]] == [("prefill", True), ("cache-hit", False)]


def test_a_clean_run_says_so_in_one_line(pytester: pytest.Pytester, clean_eagle3_env) -> None:
    pytester.makepyfile(test_run=TESTS.replace('Verdict.failed("slot 1 holds hs[2] [offset-missing]")',
                                                "Verdict.passed()"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0
    lines = result.stdout.lines
    title = next(i for i, line in enumerate(lines) if "eagle3 diagnosis" in line)
    assert lines[title + 1] == ("[clean] nothing is wrong: 8 comparisons in 4 tests agree "
                                "(prefill, later-chunk, cache-hit)")
    assert next(line for line in lines[title + 2:] if line).startswith("=")


def test_a_run_without_evidence_prints_no_section(pytester: pytest.Pytester, clean_eagle3_env) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0 and "eagle3 diagnosis" not in result.stdout.str()


def test_a_packaged_failure_without_evidence_is_named_and_a_projects_own_is_not(
        pytester: pytest.Pytester, clean_eagle3_env) -> None:
    pytester.makepyfile(test_run=TESTS.replace('Verdict.failed("slot 1 holds hs[2] [offset-missing]")',
                                                "Verdict.passed()") + '''
@pytest.mark.eagle3_engines()
def test_ours_without_evidence():
    assert False, "ranks disagree"

def test_the_projects_own():
    assert False, "not ours"
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    lines = result.stdout.lines
    title = next(i for i, line in enumerate(lines) if "eagle3 diagnosis" in line and line.startswith("-"))
    assert lines[title + 1].startswith("[no-verdict] none of the run's 8 comparisons is wrong, but 1 test(s) "
                                       "failed without one: test_run.py::test_ours_without_evidence"), lines[title:]
    assert "not ours" not in "\n".join(lines[title:title + 4])
