"""``--eagle3-bisect`` on the real SGLang on CPU: the plain engine is good (0), the
same engine fed a wrong id list through ``--sglang-arg`` is bad (1) with the
first failing assertion named, and an engine that cannot start in time is
untestable (125).  Each run starts one TP 1 engine; the verdict time is a
benchmark (``benchmarks/bisect_demo.py``), not asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_eagle3.plugin import bisect
from pytest_eagle3.settings import default_cache_dir

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_eagle3_env")]
CACHE = str(default_cache_dir()[0])


def _verdict(result: pytest.RunResult) -> str:
    return next((line for line in result.outlines if line.startswith("eagle3 bisect: ")), "")


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("--pyargs", "pytest_eagle3.suite", "--device", "cpu",
                                           "--eagle3-cache", CACHE, "--eagle3-bisect", "-p", "no:cacheprovider",
                                           *args, timeout=900)


def test_bisect_verdicts_on_the_real_engine(pytester: pytest.Pytester, tmp_path: Path) -> None:
    good = _run(pytester, "--eagle3-report", str(tmp_path / "good.json"))
    assert good.ret == bisect.GOOD, "\n".join(good.outlines[-40:])
    assert _verdict(good).startswith("eagle3 bisect: GOOD (exit 0): ")
    report = json.loads((tmp_path / "good.json").read_text())
    assert report["schema"] == 1 and report["sglang"]["version"] and report["run"]["bisect"]["exit"] == 0
    assert len(report["engines"]) == 1
    test = next(t for t in report["tests"] if "test_capture_order" in t["nodeid"])
    assert test["outcome"] == "passed" and test["properties"]["eagle3_ids"] == [0, 3, 5]
    assert test["properties"]["eagle3_engine"].startswith("tp1-cpu-")
    slots = test["verdicts"][0]["slots"]
    assert [s["expected"] for s in slots] == ["hs[0]", "hs[3]", "hs[5]"] and all(s["ok"] for s in slots)

    # The wiring regresses: SGLang captures one layer late in every slot.
    bad = _run(pytester, "--sglang-arg", "return_aux_hidden_state_layer_ids=[1,4,6]")
    assert bad.ret == bisect.BAD, "\n".join(bad.outlines[-40:])
    assert _verdict(bad).startswith("eagle3 bisect: BAD (exit 1): ")
    assert "slot" in _verdict(bad) or "slots wrong" in _verdict(bad), _verdict(bad)
    # The run-level cause leads, the first failure follows (every path fails alike: global).
    assert "eagle3 bisect: BAD (exit 1): [global] " in _verdict(bad) and "(first failure: " in _verdict(bad)

    # The engine cannot start (here: not within 1 s): not this commit's wiring.
    stuck = _run(pytester, "--eagle3-startup-timeout", "1")
    assert stuck.ret == bisect.UNTESTABLE, "\n".join(stuck.outlines[-40:])
    assert "Eagle3EngineError" in _verdict(stuck)
