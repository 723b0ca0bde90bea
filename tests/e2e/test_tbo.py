"""End to end on CPU: two-batch overlap (TBO) without an EP all-to-all backend.

The ``dp-attention`` variant (not its all-reduce pair) with ``--eagle3-sglang-arg enable_two_batch_overlap=true``
(no ``moe_a2a_backend``): SGLang 0.5.23 starts, splits each DP rank's batch into two
micro-batches (the workers' proof line) and dies in the first micro-batch's DP
gather; one failure names it ``[tbo-no-a2a]``.  About 1 minute (one engine start).

TBO as DeepSeek-V3 runs it (the ``two-batch-overlap`` variant, DeepEP through the
CPU stand-in): ``[tbo-uncaptured]`` in ``tests/e2e/test_path_variants.py``; green with
the fix ``tbo-capture-per-microbatch`` in the self-test's control, whose merge faults
are caught and named there (``tests/e2e/test_fault_self_test.py``).
"""

from __future__ import annotations

import pytest

from pytest_eagle3.worker.tbo_proof import PROOF
from tests.inner_run import run_inner

pytestmark = pytest.mark.e2e


def test_tbo_without_an_a2a_backend_fails_once_with_its_cause(tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("sglang")
    work = tmp_path_factory.mktemp("tbo")
    run = run_inner(work, ["--pyargs", "pytest_eagle3.suite.test_paths", "--tp", "2", "--eagle3-slow",
                           "-k", "dp-attention and not all-reduce",
                           "--eagle3-sglang-arg", "enable_two_batch_overlap=true",
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

