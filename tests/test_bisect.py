"""``--eagle3-bisect`` exit codes for ``git bisect run`` and the ``--eagle3-report`` JSON.

Without an engine: an SGLang that cannot import makes the commit untestable
(125).  With the real SGLang on CPU (``e2e``): the plain engine is good (0), the
same engine fed a wrong id list through ``--sglang-arg`` is bad (1) with the
first failing assertion named, and an engine that cannot start in time is
untestable (125).  Each e2e run starts one TP 1 engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from pytest_eagle3.plugin import bisect
from pytest_eagle3.plugin.options import default_cache_dir
from tests.test_bad_input import HIDE_SGLANG, run_suite

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")
CACHE = str(default_cache_dir()[0])


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


def _run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, float]:
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("--pyargs", "pytest_eagle3.suite", "--device", "cpu",
                                           "--eagle3-cache", CACHE, "--eagle3-bisect", "-p", "no:cacheprovider",
                                           *args, timeout=900)
    return result, time.monotonic() - t0


@pytest.mark.e2e
def test_bisect_verdicts_on_the_real_engine(pytester: pytest.Pytester, tmp_path: Path) -> None:
    good, seconds = _run(pytester, "--eagle3-report", str(tmp_path / "good.json"))
    assert good.ret == bisect.GOOD, "\n".join(good.outlines[-40:])
    assert _verdict(good).startswith("eagle3 bisect: GOOD (exit 0): ")
    assert seconds < 240, seconds  # README: a verdict in about 1 minute on 2 cores (one TP 1 engine)
    report = json.loads((tmp_path / "good.json").read_text())
    assert report["schema"] == 1 and report["sglang"]["version"] and report["run"]["bisect"]["exit"] == 0
    assert len(report["engines"]) == 1
    test = next(t for t in report["tests"] if "test_capture_order" in t["nodeid"])
    assert test["outcome"] == "passed" and test["properties"]["eagle3_ids"] == [0, 3, 5]
    assert test["properties"]["eagle3_engine"].startswith("tp1-cpu-")
    slots = test["verdicts"][0]["slots"]
    assert [s["expected"] for s in slots] == ["hs[0]", "hs[3]", "hs[5]"] and all(s["ok"] for s in slots)

    # The wiring regresses: SGLang captures one layer late in every slot.
    bad, _ = _run(pytester, "--sglang-arg", "return_aux_hidden_state_layer_ids=[1,4,6]")
    assert bad.ret == bisect.BAD, "\n".join(bad.outlines[-40:])
    assert _verdict(bad).startswith("eagle3 bisect: BAD (exit 1): ")
    assert "slot" in _verdict(bad) or "slots wrong" in _verdict(bad), _verdict(bad)

    # The engine cannot start (here: not within 1 s): not this commit's wiring.
    stuck, _ = _run(pytester, "--eagle3-startup-timeout", "1")
    assert stuck.ret == bisect.UNTESTABLE, "\n".join(stuck.outlines[-40:])
    assert "Eagle3EngineError" in _verdict(stuck)
