"""End to end on CPU: every path variant SGLang 0.5.23 supports on CPU passes.

Runs ``pytest_eagle3.suite.test_paths --tp 2 --eagle3-slow`` once (chunked
prefill and radix-cache hits on the wide case's engines; engines of their own
for DP attention and its all-reduce pair, input-scattered attention, all-reduce
fusion on, unchunked prefill, single-batch overlap, two-batch overlap and the two
id variants), with the per-rank tests on the DP attention engine and the verify
check on an EAGLE-3 draft engine under DP attention; about 10 minutes on 2 cores.
The variant matrix and its skip reasons come from :mod:`pytest_eagle3.engine.variants`.
"""

from __future__ import annotations

import pytest

from tests.inner_run import InnerRun, run_inner

pytestmark = pytest.mark.e2e

RUNS_ON_CPU = {
    1: ("plain", "decode", "batch", "chunked-prefill", "unchunked-prefill", "radix-cache-hit",
        "ids-at-first-k-dense", "ids-last-capturable",
        # SGLang's SBO hooks on the stand-in stream; the runner fails it unless the hooks ran.
        "single-batch-overlap"),
    # All-reduce fusion on (SGLang's fused path, the gloo stand-in) against off, row for row.
    2: ("plain", "decode", "batch", "chunked-prefill", "radix-cache-hit", "dp-attention", "dp-attention-all-reduce",
        "allreduce-fusion-on", "allreduce-fusion-off"),
}
GPU_ONLY = ("cuda-graph-on", "cuda-graph-off")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    work = tmp_path_factory.mktemp("e2e-paths")
    return run_inner(work, ["--pyargs", "pytest_eagle3.suite.test_paths", "pytest_eagle3.suite.test_per_rank",
                            "pytest_eagle3.suite.test_acceptance", "--tp", "2", "--eagle3-slow", "-v",
                            "-k", "test_captures_identical_through_path or dp-attention", f"--basetemp={work / 'tmp'}"])


#: The dp-attention engine's first log line lacks these (TBO, the pair, the draft engine).
NOT_DP_ONLY = ("--enable-two-batch-overlap", "--boundary-reduction", "--speculative-draft-model-path")


def _engine_logs(run: InnerRun, flag: str, without: tuple[str, ...] = ()) -> str:
    """The SGLang logs of the inner run's engines started with ``flag`` and none of ``without``."""
    from pathlib import Path

    return "".join(text for p in Path(run.mark).glob("tmp/**/tp2-cpu-*.log")
                   if flag in (first := (text := p.read_text(errors="replace")).split("\n", 1)[0])
                   and not any(w in first for w in without))


@pytest.fixture(scope="module")
def outcomes(run: InnerRun) -> dict[str, tuple[str, str]]:
    return {name: (outcome, run.messages[name].split("\n", 1)[0]) for name, outcome in run.outcomes.items()}


def _name(tp: int, variant: str) -> str:
    return f"test_captures_identical_through_path[tp{tp}-{variant}]"


@pytest.mark.parametrize("tp, variant", [(tp, v) for tp, vs in RUNS_ON_CPU.items() for v in vs])
def test_variant_passes_on_cpu(outcomes: dict[str, tuple[str, str]], tp: int, variant: str) -> None:
    assert outcomes[_name(tp, variant)][0] == "passed", outcomes[_name(tp, variant)]


def _left_out(run: InnerRun, name: str) -> str:
    """The summary line of the reason ``name`` was left out for (``-v`` lists ids under it)."""
    reason = ""
    for line in run.output.split("eagle3 left out", 1)[-1].splitlines():
        if " left out: " in line:
            reason = line
        elif line.strip().endswith(name):
            return reason
    return ""


@pytest.mark.parametrize("variant", GPU_ONLY)
def test_gpu_only_variant_left_out_with_reason(run: InnerRun, outcomes, variant: str) -> None:
    assert _name(1, variant) not in outcomes
    assert "this run is cpu" in _left_out(run, _name(1, variant))


@pytest.mark.parametrize("variant", ("allreduce-fusion-on", "allreduce-fusion-off"))
def test_fusion_pair_needs_tp2(run: InnerRun, outcomes, variant: str) -> None:
    assert _name(1, variant) not in outcomes
    assert "this case runs at TP 1" in _left_out(run, _name(1, variant))


def test_own_engine_variants_run_at_tp1_only_on_cpu(run: InnerRun, outcomes) -> None:
    assert _name(2, "ids-at-first-k-dense") not in outcomes
    assert "run at TP 1 only on cpu" in _left_out(run, _name(2, "ids-at-first-k-dense"))


def test_dp_attention_proves_its_reduce_scatter_on_every_rank(run: InnerRun, outcomes) -> None:
    """Every MAX_LEN-padded decode forward that returned captures ran dp_reduce_scatter on
    both ranks, and each rank had one (the test itself fails otherwise: engine/route_proof.py);
    the workers' lines are in the log."""
    from pytest_eagle3.engine.route_proof import forwards

    assert outcomes[_name(2, "dp-attention")][0] == "passed"
    seen = forwards(_engine_logs(run, "--attn-dp-size", without=NOT_DP_ONLY))
    for rank in (0, 1):
        decode = [f for f in seen if f.rank == rank and f.mode == "DECODE" and f.captured and f.padding == "MAX_LEN"]
        assert decode and all("dp_reduce_scatter" in f.routes for f in decode), seen
        assert not any("dp_reduce_scatter" in f.routes for f in seen if f.rank == rank and f.padding == "SUM_LEN")
        assert not any(f.routes for f in seen if f.rank == rank and f.mode == "EXTEND")


def test_the_dp_attention_pair_ran_without_the_route(run: InnerRun, outcomes) -> None:
    """dp-attention's pair (--boundary-reduction ar) passed row for row, and its workers
    logged MAX_LEN-padded decode forwards with captures and no dp_reduce_scatter."""
    from pytest_eagle3.engine.route_proof import forwards

    assert outcomes[_name(2, "dp-attention")][0] == "passed"
    seen = forwards(_engine_logs(run, "--boundary-reduction"))
    for rank in (0, 1):
        assert any(f.rank == rank and f.mode == "DECODE" and f.captured and f.padding == "MAX_LEN" for f in seen), seen
    assert seen and not any(f.routes for f in seen), seen


@pytest.mark.parametrize("name", ("test_every_rank_embedding_complete[tp2-dp-attention]",
                                  "test_every_rank_fully_reduced[tp2-dp-attention]",
                                  "test_every_rank_agrees_in_verify[tp2-acceptance-dp-attention]"))
def test_per_rank_and_verify_pass_under_dp_attention(outcomes, name: str) -> None:
    assert outcomes[name][0] == "passed", outcomes[name]


def test_verify_takes_the_dp_reduce_scatter_route_on_every_rank(run: InnerRun) -> None:
    """The EAGLE-3 draft engine under attention DP: every MAX_LEN-padded verify forward
    that returned captures ran dp_reduce_scatter, on both ranks."""
    from pytest_eagle3.engine.route_proof import forwards

    seen = forwards(_engine_logs(run, "--speculative-draft-model-path"))
    for rank in (0, 1):
        verify = [f for f in seen if f.rank == rank and f.mode == "TARGET_VERIFY" and f.captured
                  and f.padding == "MAX_LEN"]
        assert verify and all("dp_reduce_scatter" in f.routes for f in verify), seen


def test_input_scattered_fails_once_naming_the_sliced_capture(run: InnerRun, outcomes) -> None:
    """sglang 0.5.23 turns input-scattered attention on for the capture-only engine (the
    device condition stood in on CPU) and dies at the first multi-row batch: the capture
    holds each rank's slice of the rows.  Green with the fix: tests/e2e/test_reduce_scatter_routes.py."""
    name = _name(2, "attn-tp-input-scattered")
    outcome, _ = outcomes[name]
    message = run.messages[name]
    assert outcome == "failed" and "[input-scattered-capture] under input-scattered attention" in message, \
        message[:3000]
    assert "ran tp_reduce_scatter (srt/layers/layer_boundary/ops.py:" in message
    assert "this case runs at TP 1" in _left_out(run, _name(1, "attn-tp-input-scattered"))


def test_two_batch_overlap_fails_once_naming_the_uncaptured_layers(run: InnerRun, outcomes) -> None:
    """DP attention, TBO and DeepEP (the CPU stand-in): 0.5.23's packer raises at the first TBO
    forward, and the one failure says why (the fix turns it green in the self-test's control,
    tests/e2e/test_fault_self_test.py)."""
    name = _name(2, "two-batch-overlap")
    outcome, _ = outcomes[name]
    message = run.messages[name]
    assert outcome == "failed" and "[tbo-uncaptured] under two-batch overlap" in message, message[:3000]
    assert "captured 1 of 3 aux hidden states" in message and "first_k_dense_replace=1" in message
    assert "the TBO path ran (" in message and "deepseek_v2.py:" in message  # the workers' proof lines
    assert _name(1, "two-batch-overlap") not in outcomes
    assert "this case runs at TP 1" in _left_out(run, _name(1, "two-batch-overlap"))
