"""The packaged capture tests through the draft path (CPU, TP 1).

``--eagle3-capture-method eagle3-draft`` forces every capture test to read
SGLang's captures from an engine that loads an EAGLE-3 draft (a random-weights
draft per id list, SGLang reading the ids from its ``config.json``) with
``--enable-return-hidden-states``: the path every SGLang that serves DeepSeek
EAGLE-3 has, with no ``--enable-return-aux-hidden-states``.  Outcomes must be
those of the capture-only run (tests/e2e/test_suite_on_cpu.py).  One engine per id list:
SGLang's default, the embedding-first list and vLLM's first-id-1 list (the three id
rules a draft's ``config.json`` can put SGLang on); the two other default lists
(SpecForge's, speculators') read the same way and run in the capture-only run.
"""

from __future__ import annotations

import pytest

from tests.inner_run import InnerRun, run_inner

pytestmark = pytest.mark.e2e

CASES = ("default-no-ids", "kimi-embedding-first", "vllm-first-id-1")


@pytest.fixture(scope="module")
def inner(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    return run_inner(tmp_path_factory.mktemp("draft-path"),
                     ["--pyargs", "pytest_eagle3.suite.test_capture_order", "pytest_eagle3.suite.test_contracts",
                      "pytest_eagle3.suite.test_embedding_allreduce", "--tp", "1",
                      "--eagle3-capture-method", "eagle3-draft", "-k", " or ".join(f"tp1-{c}]" for c in CASES)])


def test_capture_tests_pass_through_the_draft_path(inner: InnerRun) -> None:
    expected = {f"test_capture_order[tp1-{c}]": "passed" for c in CASES}
    expected |= {f"test_draft_receives_its_training_contract[tp1-{c}]": "passed" for c in CASES}
    expected["test_draft_receives_its_training_contract[tp1-vllm-first-id-1]"] = "xfailed"
    expected["test_embedding_rows_complete_on_every_shard[tp1-kimi-embedding-first]"] = "passed"
    assert inner.outcomes == expected, inner.output[-4000:]


def test_every_engine_loaded_a_draft(inner: InnerRun) -> None:
    summary = inner.output.split("eagle3 engines", 1)[-1]
    ready = [line for line in summary.splitlines() if ": ready in " in line]
    assert len(ready) == len(CASES), summary
    assert all("speculative_draft_model_path=" in line and "enable_return_aux_hidden_states" not in line
               for line in ready), summary
