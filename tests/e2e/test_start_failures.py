"""End to end on CPU: engines that cannot start for one cause report it once.

The packaged capture tests at ``--tp 2`` with ``--eagle3-sglang-arg
quantization=fp8``: SGLang 0.5.23 refuses fp8 on the CPU tier's float32 while
it loads the model (``ValueError ... (sglang/srt/model_loader/loader.py)``), in
both engine configurations (TP 1 and TP 2), as a fork whose MoE layer raises at
startup would.  The first failing test shows the error with the log tail; every
other test says in one line where it was reported; the run ends with one line
for the cause.  About a minute on 2 cores.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.engine.start_failures import SUMMARY
from tests.inner_run import InnerRun, run_inner

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def inner(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    return run_inner(tmp_path_factory.mktemp("e2e-start-failures"),
                     ["--pyargs", "pytest_eagle3.suite.test_capture_order", "pytest_eagle3.suite.test_contracts",
                      "--tp", "2", "--eagle3-sglang-arg", "quantization=fp8"])


def test_one_failure_carries_the_cause_and_the_log(inner: InnerRun) -> None:
    failed = [name for name, outcome in inner.outcomes.items() if outcome == "failed"]
    assert len(failed) == len(inner.outcomes) >= 10, inner.output[-3000:]
    full = [name for name in failed if "--- last 60 lines of the SGLang log ---" in inner.messages[name]]
    assert len(full) == 1, full
    assert "ValueError: torch.float32 is not supported for quantization method fp8" in inner.messages[full[0]]
    for name in failed:
        if name != full[0]:
            message = inner.messages[name]
            first = message.strip().splitlines()[0]
            assert "last 60 lines" not in message and "Eagle3StartCauseSeen" in first and full[0] in first, message


def test_the_summary_names_the_cause_once(inner: InnerRun) -> None:
    head = SUMMARY.split("{cause}")[0]
    lines = [line for line in inner.output.splitlines() if line.startswith(head)]
    assert len(lines) == 1, inner.output[-3000:]
    assert "ValueError: torch.float32 is not supported for quantization method fp8" in lines[0]
    assert lines[0].endswith("in 2 of 2 engine configurations"), lines[0]
