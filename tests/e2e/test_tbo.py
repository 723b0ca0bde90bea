"""End to end on CPU: two-batch overlap (TBO) on the DP-attention engine at TP 2.

* Without an EP all-to-all backend (the ``dp-attention`` variant with
  ``--eagle3-sglang-arg enable_two_batch_overlap=true``): SGLang 0.5.23 starts,
  splits each DP rank's batch into two micro-batches (the workers' proof line) and
  dies in the first micro-batch's DP gather; one failure names it ``[tbo-no-a2a]``.
* The ``two-batch-overlap`` path variant (DP attention, TBO, DeepEP through the CPU
  stand-in, bf16 dispatch): the TBO forward runs through the MoE and 0.5.23's packer
  raises "captured 1 of 3 aux hidden states"; one failure names it
  ``[tbo-uncaptured]``.

The same variant with the upstream fix ``tbo-capture-per-microbatch`` passes in the
self-test's control, and the fix's merge faults are caught and named there
(``tests/e2e/test_fault_self_test.py``).  About 1 minute per engine start, two starts.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.worker.tbo_proof import PROOF
from tests.inner_run import run_inner

TBO_VARIANT = ["--pyargs", "pytest_eagle3.suite.test_paths", "--tp", "2", "--eagle3-slow", "-k", "two-batch-overlap"]

pytestmark = pytest.mark.e2e


def test_tbo_without_an_a2a_backend_fails_once_with_its_cause(tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("sglang")
    work = tmp_path_factory.mktemp("tbo")
    run = run_inner(work, ["--pyargs", "pytest_eagle3.suite.test_paths", "--tp", "2", "--eagle3-slow",
                           "-k", "dp-attention", "--eagle3-sglang-arg", "enable_two_batch_overlap=true",
                           f"--basetemp={work / 'tmp'}"])
    logs = "".join(p.read_text(errors="replace") for p in work.glob("tmp/**/tp2-cpu-*.log"))
    if "two_batch_overlap.py" not in logs:
        pytest.skip("this SGLang took no two-batch overlap path on CPU")
    failed = {n: m for n, m in run.messages.items() if run.outcomes.get(n) in ("failed", "error")}
    assert failed, run.output[-3000:]
    full = [n for n, m in failed.items() if "[tbo-no-a2a] two-batch overlap with DP attention" in m]
    assert len(full) == 1, run.output[-4000:]
    message = failed[full[0]]
    assert "the TBO path ran (" in message and "in model_forward_stages)" in message, message[:2000]
    assert "(sglang/srt/layers/dp_attention.py:" in message and "two_batch_overlap.py:" in message
    assert PROOF.search(logs), "no worker proof line in the engine log"
    for name, m in failed.items():  # one root cause, one failure: any other test points to it
        if name != full[0]:
            assert f"(see {full[0].split('::')[-1]}" in m or full[0] in m, m[:600]


def _logs(work) -> str:
    return "".join(p.read_text(errors="replace") for p in work.glob("tmp/**/tp2-cpu-*.log"))


def test_tbo_through_deepep_fails_once_as_uncaptured(tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("sglang")
    work = tmp_path_factory.mktemp("tbo-deepep")
    run = run_inner(work, TBO_VARIANT + [f"--basetemp={work / 'tmp'}"])
    if not run.outcomes:
        pytest.skip("the two-batch-overlap variant does not run on this SGLang's CPU tier")
    logs = _logs(work)
    failed = {n: m for n, m in run.messages.items() if run.outcomes.get(n) in ("failed", "error")}
    named = [n for n, m in failed.items() if "[tbo-uncaptured] under two-batch overlap" in m]
    assert len(named) == 1 and len(failed) == 1, run.output[-4000:]
    message = failed[named[0]]
    assert "captured 1 of 3 aux hidden states" in message and "first_k_dense_replace=1" in message, message[:2000]
    assert "the TBO path ran (" in message and "deepseek_v2.py:" in message
    assert "pytest-eagle3 DeepEP stand-in: dispatch (normal)" in logs  # the MoE ran through the stand-in
    assert PROOF.search(logs), "no worker proof line in the engine log"

