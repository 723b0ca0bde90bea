"""End to end on CPU: every path variant SGLang 0.5.23 supports on CPU passes.

Runs ``pytest_eagle3.suite.test_paths --tp 2 --eagle3-slow`` once (engines of
their own for chunked prefill, radix cache, DP attention and the two id
variants); about 4 minutes on 2 cores.  The variant matrix and its skip reasons
come from :mod:`pytest_eagle3.engine.variants`.
"""

from __future__ import annotations

import pytest

from tests.inner_run import run_inner

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
    run = run_inner(tmp_path_factory.mktemp("e2e-paths"),
                    ["--pyargs", "pytest_eagle3.suite.test_paths", "--tp", "2", "--eagle3-slow"])
    return {name: (outcome, run.messages[name].split("\n", 1)[0]) for name, outcome in run.outcomes.items()}


def _name(tp: int, variant: str) -> str:
    return f"test_captures_identical_through_path[tp{tp}-{variant}]"


@pytest.mark.parametrize("tp, variant", [(tp, v) for tp, vs in RUNS_ON_CPU.items() for v in vs])
def test_variant_passes_on_cpu(outcomes: dict[str, tuple[str, str]], tp: int, variant: str) -> None:
    assert outcomes[_name(tp, variant)][0] == "passed", outcomes[_name(tp, variant)]


@pytest.mark.parametrize("variant", GPU_ONLY)
def test_gpu_only_variant_skips_with_reason(outcomes: dict[str, tuple[str, str]], variant: str) -> None:
    outcome, message = outcomes[_name(1, variant)]
    assert outcome == "skipped" and "this run is cpu" in message


def test_own_engine_variants_run_at_tp1_only_on_cpu(outcomes: dict[str, tuple[str, str]]) -> None:
    outcome, message = outcomes[_name(2, "chunked-prefill")]
    assert outcome == "skipped" and "runs at TP 1 only" in message
