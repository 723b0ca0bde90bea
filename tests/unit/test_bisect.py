"""``--eagle3-bisect`` exit codes for ``git bisect run`` and the ``--eagle3-report`` JSON,
without an engine: an SGLang that cannot import makes the commit untestable
(125).  On the real engine: ``tests/e2e/test_bisect_verdicts.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_eagle3.plugin import bisect
from tests.unit.test_bad_input import HIDE_SGLANG, run_suite

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")


def _verdict(result: pytest.RunResult) -> str:
    return next((line for line in result.outlines if line.startswith("eagle3 bisect: ")), "")


def test_sglang_that_cannot_import_is_untestable(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = run_suite(pytester, tmp_path / "cache", "--eagle3-bisect", "--eagle3-report",
                       str(tmp_path / "r.json"), conftest=HIDE_SGLANG)
    assert result.ret == bisect.UNTESTABLE, "\n".join(result.outlines)
    assert _verdict(result).startswith("eagle3 bisect: UNTESTABLE (exit 125): ")
    assert "Eagle3SGLangMissing: SGLang is not installed" in _verdict(result)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run"]["bisect"]["exit"] == 125 and report["sglang"]["version"] is None
    assert report["tests"] and all(t["outcome"] == "error" for t in report["tests"])


def test_decide() -> None:
    plugin = bisect.BisectPlugin(config=None)  # type: ignore[arg-type]
    assert plugin.decide() == (125, "untestable", bisect.NO_TESTS)
    plugin.passed = 3
    assert plugin.decide() == (0, "good", "3 wiring test(s) passed")
    plugin.untestable.append("t: Eagle3EngineError: x")
    assert plugin.decide()[0] == 125
    plugin.bad.append("t2: slot 0 holds hs[1]")
    assert plugin.decide() == (1, "bad", "t2: slot 0 holds hs[1]")


def test_a_bad_verdict_leads_with_the_run_level_cause(pytestconfig, monkeypatch) -> None:
    from types import SimpleNamespace

    from pytest_eagle3.verdicts.run_cause import RunDiagnosis

    plugin = bisect.BisectPlugin(config=pytestconfig)
    plugin.bad.append("t2: slot 0 holds hs[1]")
    diag = RunDiagnosis("path-only", "[path-only] wrong only on cache-hit")
    monkeypatch.setattr(bisect, "get_run", lambda config: SimpleNamespace(
        diagnosis=SimpleNamespace(result=lambda: diag)))
    assert plugin.decide() == (1, "bad", "[path-only] wrong only on cache-hit (first failure: t2: slot 0 holds hs[1])")
