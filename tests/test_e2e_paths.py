"""End to end on CPU: every path variant SGLang 0.5.23 supports on CPU passes.

Runs ``pytest_eagle3.suite.test_paths --tp 2 --eagle3-slow`` once (engines of
their own for chunked prefill, radix cache, DP attention and the two id
variants); about 4 minutes on 2 cores.  The variant matrix and its skip reasons
come from :mod:`pytest_eagle3.variants`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_eagle3.options import default_cache_dir

pytestmark = pytest.mark.e2e

RUNS_ON_CPU = {
    1: ("plain", "decode", "batch", "chunked-prefill", "radix-cache-hit", "ids-at-first-k-dense",
        "ids-last-capturable"),
    2: ("plain", "decode", "batch", "dp-attention"),
}
GPU_ONLY = ("allreduce-fusion-on", "allreduce-fusion-off", "cuda-graph-on", "cuda-graph-off",
            "attn-tp-input-scattered", "two-batch-overlap")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    work = tmp_path_factory.mktemp("e2e-paths")
    junit = work / "junit.xml"
    cache = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "pytest_eagle3.suite.test_paths", "--tp", "2",
           "--device", "cpu", "--eagle3-slow", "--eagle3-cache", cache, "-p", "no:cacheprovider",
           f"--junitxml={junit}"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=40 * 60)
    (work / "inner-output.txt").write_text(proc.stdout + proc.stderr)
    if not junit.exists():
        pytest.fail(f"inner pytest wrote no JUnit XML (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome, message = {"failure": "failed"}.get(tag, tag), node.get("message") or ""
                break
        out[case.get("name", "")] = (outcome, message)
    return out


def _name(tp: int, variant: str) -> str:
    return f"test_captures_identical_through_path[tp{tp}-{variant}]"


@pytest.mark.parametrize("tp, variant", [(tp, v) for tp, vs in RUNS_ON_CPU.items() for v in vs])
def test_variant_passes_on_cpu(outcomes: dict[str, tuple[str, str]], tp: int, variant: str) -> None:
    assert outcomes[_name(tp, variant)] == ("passed", ""), outcomes[_name(tp, variant)]


@pytest.mark.parametrize("variant", GPU_ONLY)
def test_gpu_only_variant_skips_with_reason(outcomes: dict[str, tuple[str, str]], variant: str) -> None:
    outcome, message = outcomes[_name(1, variant)]
    assert outcome == "skipped" and "this run is cpu" in message


def test_own_engine_variants_run_at_tp1_only_on_cpu(outcomes: dict[str, tuple[str, str]]) -> None:
    outcome, message = outcomes[_name(2, "chunked-prefill")]
    assert outcome == "skipped" and "runs at TP 1 only" in message
