"""The fault grammar on the real SGLang: sampled faults through the default selection.

Runs ``pytest-eagle3 self-test --grammar N --seed S``'s own code
(:func:`pytest_eagle3.cli.selftest_grammar.grammar_test`) for :data:`SAMPLES`
faults of seed :data:`SEED`: each a confinement by TP size, TP rank and forward
mode (:mod:`pytest_eagle3.planning.grammar_faults`) times an effect, injected into
every SGLang process of a child ``pytest --pyargs pytest_eagle3.suite --tp 2``
(the main job's selection: its five engines).  The run-level diagnosis of each
must name the sampled confinement, or a conjunction that holds the same
comparisons.  About 4 minutes per sample on 2 cores.  Three single faults beside
the samples: one confined to a slot, one that starts inside the decode steps, one in
attention DP's verify forwards.
"""

from __future__ import annotations

import os

import pytest

from pytest_eagle3.cli import selftest
from pytest_eagle3.cli.selftest_grammar import grammar_test, render_grammar
from pytest_eagle3.settings import default_cache_dir
from tests.inner_run import RUN_MARK

pytestmark = pytest.mark.e2e

#: The seed and the number of samples CI runs (seed 1's first two: ``no-residual`` in
#: cache-hit forwards only, and in rank 0's decode forwards only).
SEED, SAMPLES = 1, 2


def test_sampled_faults_are_named_by_their_confinement(tmp_path) -> None:
    cache = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])

    def runner(where, tests, tp, fault, extra):
        return selftest.run_child(where, tests, tp, fault, extra, env={**os.environ, RUN_MARK: str(tmp_path)})

    results = grammar_test(tmp_path, SAMPLES, SEED, runner, extra=["--device", "cpu", "--eagle3-cache", cache],
                           progress=lambda m: None)
    table = "\n".join(render_grammar(results, SEED))
    (tmp_path / "grammar.txt").write_text(table + "\n")
    assert len(results) == SAMPLES and all(r.ok for r in results), f"{table}\nlogs: {results[0].log.parent.parent}"


def _faulted(tmp_path, tests: list[str], tp: int, fault: str, *extra: str) -> selftest.ChildRun:
    """One child run of the packaged suite's ``tests`` at TP ``tp`` on cpu with ``fault``
    injected, sharing the user's checkpoint cache."""
    cache = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])
    return selftest.run_child(tmp_path, tests, tp, fault, ["--device", "cpu", "--eagle3-cache", cache, *extra],
                              env={**os.environ, RUN_MARK: str(tmp_path)})


def test_a_fault_in_one_slot_is_named_by_that_slot(tmp_path) -> None:
    """``no-residual`` written only into packed slot 2 of decode forwards (the worker's
    ``slots`` option) at TP 1, through the decode and batch paths: the run-level cause
    holds the decode comparisons and, inside them, slot 2 only (slots 0 and 1 right).
    About 30 seconds."""
    run = _faulted(tmp_path, ["tp1-batch", "tp1-decode"], 1,
                   '{"kind": "no-residual", "when": ["decode"], "slots": [2]}')
    diagnosis = run.diagnosis or {}
    assert diagnosis.get("named", {}).get("slot") == ["2"], run.output[-3000:]
    assert diagnosis.get("named", {}).get("forward mode") == ["decode"], diagnosis
    assert "inside them only slot 2 wrong" in diagnosis.get("headline", ""), diagnosis


def test_a_fault_on_some_decode_steps_is_named_on_their_rows(tmp_path) -> None:
    """A read before attention DP's reduce-scatter that starts after 3 forwards of each
    TP worker (``after``): the dp-attention path's decode rows are wrong from a later
    step on, the first right, as when a decode step beside another DP rank's extend is
    SUM_LEN-padded and skips the route.  The partial sum is fitted on the wrong rows and
    named.  Before that fit the whole slot matched nothing and the run was unnamed
    (CI, 2026-12-07).  About 40 seconds."""
    run = _faulted(tmp_path, ["test_captures_identical_through_path[tp2-dp-attention]"], 2,
                   '{"kind": "partial-before-dp-reduce-scatter", "after": 3}', "--eagle3-slow")
    assert run.returncode == 1, run.output[-3000:]
    assert "[partial-sum]" in run.output, run.output[-3000:]
    if "of 2 wrong" in run.output:  # the scheduler put the fault's start inside the decode steps
        assert "MLP share on its 1 wrong row of 2 (rel.err" in run.output, run.output[-3000:]


def test_a_partial_sum_in_dp_verify_rows_is_named_by_each_rank(tmp_path) -> None:
    """The same read in attention DP's target-verify forwards only: each TP rank's
    verify rows of the requests it served are compared at their positions, and the
    request's evidence at those positions names ``[partial-sum]`` (before, the slot
    lines only: "matches no snapshot").  About 50 seconds."""
    run = _faulted(tmp_path, ["test_every_rank_agrees_in_verify[tp2-acceptance-dp-attention]"], 2,
                   '{"kind": "partial-before-dp-reduce-scatter", "when": ["verify"]}', "--eagle3-slow")
    assert run.returncode == 1, run.output[-3000:]
    assert "verify rows at positions" in run.output, run.output[-3000:]
    # "MLP share (rel.err", or "MLP share on its N wrong rows of M" where a verify step was SUM_LEN-padded.
    assert "'s MLP share " in run.output and "[partial-sum]" in run.output, run.output[-3000:]
    assert "[path-only] wrong only on verify" in run.output, run.output[-3000:]
