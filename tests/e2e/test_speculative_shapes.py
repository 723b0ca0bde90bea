"""End to end on CPU: token trees at TP 1 and 2, the overlap pair, and what the draft is fed.

Runs the packaged suite's speculative-shape engines once (``--tp 2 --eagle3-slow``,
about 5 minutes on 2 cores): the shipped draft drafting SGLang's Llama default
token tree (5 steps, top-k 4, 8 verified nodes, prefills chunked at 16 tokens)
at TP 1 and TP 2, and the chain under SGLang's overlap schedule beside the
acceptance engine at TP 1.  The inner run's environment sets
``SGLANG_SIMULATE_ACC_LEN=1``, which SGLang 0.5.23 would turn into a simulated
accept length (``srt/speculative/spec_utils.py:276-278``): the header must say it
was removed and the accept lengths must be the measured ones.  The faults that
only these engines catch (``tree-order-aux``, ``chunk-seam-prediction``) run in
``tests/e2e/test_fault_self_test.py``.
"""

from __future__ import annotations

import re

import pytest

from tests.inner_run import InnerRun, run_inner

pytestmark = pytest.mark.e2e

TESTS = [
    "test_draft_acceptance_meets_the_gate[tp1-acceptance-tree]",
    "test_draft_acceptance_meets_the_gate[tp2-acceptance-tree]",
    "test_acceptance_gate_has_power[tp1-acceptance-tree]",
    "test_tree_verify_nodes_hold_their_root_paths[tp1-acceptance-tree]",
    "test_tree_verify_nodes_hold_their_root_paths[tp2-acceptance-tree]",
    "test_draft_reads_the_accepted_path[tp1-acceptance-tree]",
    "test_draft_reads_the_accepted_path[tp2-acceptance-tree]",
    "test_other_schedule_changes_nothing[tp1-acceptance-other-schedule]",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    work = tmp_path_factory.mktemp("e2e-shapes")
    return run_inner(work, ["--pyargs", "pytest_eagle3.suite.test_acceptance",
                            "pytest_eagle3.suite.test_speculative_shapes", "--tp", "2", "--eagle3-slow", "-v",
                            "-k", "acceptance-tree or other-schedule", f"--basetemp={work / 'tmp'}"],
                     env={"SGLANG_SIMULATE_ACC_LEN": "1"})


@pytest.mark.parametrize("name", TESTS)
def test_the_shape_passes(run: InnerRun, name: str) -> None:
    assert run.outcomes.get(name) == "passed", (run.outcomes.get(name), run.messages.get(name, "")[:2000])


def test_the_header_says_the_simulated_acceptance_was_removed(run: InnerRun) -> None:
    assert "eagle3: SGLANG_SIMULATE_ACC_LEN=1 set here: removed from every engine's environment" in run.output


def test_the_tree_was_drafted_and_its_nodes_compared(run: InnerRun) -> None:
    """Each TP size's verify check compared nodes off the accepted path, and the tree engine's
    accept length is the measured one (above the chain's 4 - 1 = 3 draft tokens, not 1)."""
    for tp in (1, 2):
        m = re.search(rf"test_tree_verify_nodes_hold_their_root_paths\[tp{tp}-acceptance-tree\]: verify compared "
                      r"(\d+) tree nodes of (\d+) forwards \((\d+) off the accepted path\)", run.output)
        assert m and int(m.group(3)) > 0, run.output[-3000:]
    gate = re.search(r"test_draft_acceptance_meets_the_gate\[tp1-acceptance-tree\]\s+([\d.]+)", run.output)
    assert gate and float(gate.group(1)) > 3.0, run.output[-3000:]


def test_the_draft_was_fed_at_chunk_seams_and_after_tree_verifies(run: InnerRun) -> None:
    m = re.search(r"test_draft_reads_the_accepted_path\[tp2-acceptance-tree\]: draft fed (\d+) prefill rows "
                  r"\((\d+) at chunk ends\) and (\d+) accepted-path rows after (\d+) verifies, TP ranks 0, 1",
                  run.output)
    assert m and int(m.group(2)) > 0 and int(m.group(4)) > 0, run.output[-3000:]


def test_the_pair_ran_both_schedules(run: InnerRun) -> None:
    assert re.search(r"test_other_schedule_changes_nothing\[tp1-acceptance-other-schedule\]: chain: no overlap "
                     r"schedule; other-schedule: overlap schedule \(from /server_info\); same tokens", run.output)
