"""The self-test plan read from the suite's ``eagle3_catches`` markers selects,
for every fault kind, exactly the packaged tests (and TP) it selected when the
plan named tests by id (:mod:`pytest_eagle3.planning.selftest`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_eagle3.planning import selftest
from pytest_eagle3.planning.selftest import CATCHES_MARK, Catch, self_test_plan, suite_catches
from pytest_eagle3.worker.faults import CATALOG, NEEDS_TP, RUN_LEVEL

WIDE = "kimi-embedding-first"


def order(tp: int, case: str = WIDE) -> str:
    return f"test_capture_order[tp{tp}-{case}]"


def plan_by_id(no_tp: int) -> dict[str, tuple[int, tuple[str, ...]]]:
    """The plan as it was written by test id before the markers."""
    return {
        "offset-twice": (no_tp, (order(no_tp),)),
        "offset-missing": (1, (order(1, "specforge-default-ids"),)),
        "ids-ignored": (no_tp, (order(no_tp),)),
        "reversed-order": (no_tp, (order(no_tp),)),
        "normalized-input": (no_tp, (order(no_tp),)),
        "no-residual": (no_tp, (order(no_tp),)),
        "unreduced-embedding": (2, (order(2), f"test_embedding_rows_complete_on_every_shard[tp2-{WIDE}]")),
        "partial-sum": (2, (order(2), f"test_every_rank_fully_reduced[tp2-{WIDE}]")),
        "dp-gather-scaled": (2, (order(2),)),
        "wrong-request-rows": (no_tp, (f"test_captures_identical_through_path[tp{no_tp}-batch]",)),
        "aliased-capture": (no_tp, (order(no_tp),)),
        "before-fused-allreduce": (2, (order(2), f"test_every_rank_fully_reduced[tp2-{WIDE}]")),
        # Confined to one path (added with the markers): the default run's paths catch them.
        "no-residual-on-cache-hit": (no_tp, (f"test_captures_identical_through_path[tp{no_tp}-radix-cache-hit]",)),
        "no-residual-on-later-chunk": (no_tp, (f"test_captures_identical_through_path[tp{no_tp}-chunked-prefill]",)),
        "partial-sum-on-rank-decode": (2, (f"test_every_rank_fully_reduced[tp2-{WIDE}]",)),
        # Named by the run-level diagnosis (worker/faults.py RUN_LEVEL).
        "stale-no-residual": (no_tp, (f"test_draft_receives_its_training_contract[tp{no_tp}-{WIDE}]",
                                      f"test_captures_identical_through_path[tp{no_tp}-decode]")),
        "half-precision-copy": (no_tp, (order(no_tp),)),
        "draft-fc-reversed": (1, ("test_draft_acceptance_meets_the_gate[tp1-acceptance]",)),
        # On the token-tree engine (--eagle3-slow): what the draft is fed after a verify / at a chunk seam.
        "tree-order-aux": (1, ("test_draft_reads_the_accepted_path[tp1-acceptance-tree]",)),
        "chunk-seam-prediction": (1, ("test_draft_reads_the_accepted_path[tp1-acceptance-tree]",)),
        # At --eagle3-pp 2 with the relay fix (self_test_args / self_test_env).
        "pp-earlier-stage-zeroed": (1, (order(1),)),
        # Under two-batch overlap with the fix that merges the micro-batches (--eagle3-slow, TP 2).
        "tbo-microbatch-dropped": (2, ("test_captures_identical_through_path[tp2-two-batch-overlap]",)),
        "tbo-microbatches-swapped": (2, ("test_captures_identical_through_path[tp2-two-batch-overlap]",)),
        # On attention DP's decode reduce-scatter (--eagle3-slow, TP 2).
        "partial-before-dp-reduce-scatter": (2, ("test_captures_identical_through_path[tp2-dp-attention]",
                                                 "test_every_rank_fully_reduced[tp2-dp-attention]")),
        "other-rank-slice-after-dp-reduce-scatter": (2, ("test_captures_identical_through_path[tp2-dp-attention]",)),
    }


@pytest.mark.parametrize("no_tp", [1, 2])
def test_contrasts_are_the_tests_that_must_pass_with_the_fault_on(no_tp: int) -> None:
    assert selftest.contrast_plan(no_tp) == {
        "stale-no-residual": (order(no_tp),),
        "draft-fc-reversed": ("test_acceptance_gate_has_power[tp1-acceptance]", order(1)),
    }


@pytest.mark.parametrize("no_tp", [1, 2])
def test_markers_select_what_the_ids_selected(no_tp: int) -> None:
    want = plan_by_id(no_tp)
    got = self_test_plan(no_tp)
    assert set(got) == set(want) == set(CATALOG)
    for kind in want:
        assert got[kind][0] == want[kind][0], kind
        assert set(got[kind][1]) == set(want[kind][1]), kind
        if kind not in RUN_LEVEL:  # the self-test quotes the first test's line
            assert got[kind][1][0] == want[kind][1][0], kind
    assert all(got[k][0] == 2 for k in NEEDS_TP)


def test_every_marked_kind_is_a_catalog_kind() -> None:
    assert {k for c in suite_catches() for k in c.kinds} <= set(CATALOG)


def test_markers_are_read_from_pytest_s_collection(pytester: pytest.Pytester) -> None:
    # Function, class and module (pytestmark) markers alike: what pytest itself sees.
    pytester.makepyfile(test_a=(
        "import pytest\nfrom pytest_eagle3.planning import cases\n\n"
        f"pytestmark = pytest.mark.{CATCHES_MARK}('module-kind', need='m')\n\n"
        "@pytest.mark.gpu\n"
        f"@pytest.mark.{CATCHES_MARK}('scaled', 'zero-rows', need=cases.WIDE_CASE)\n"
        f"@pytest.mark.{CATCHES_MARK}('offset-missing', need='other', tp=1)\n"
        "def test_x():\n    pass\n\n"
        f"@pytest.mark.{CATCHES_MARK}('class-kind', need='c')\n"
        "class TestY:\n    def test_y(self):\n        pass\n"))
    out = pytester.path / "catches.json"
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "pytest_eagle3.plugin.catches",
                                           "--eagle3-catches-out", str(out))
    assert result.ret == 0, result.stdout.str()
    catches = selftest.parse_catches(json.loads(out.read_text()))
    assert set(catches) == {Catch("test_x", ("scaled", "zero-rows"), WIDE), Catch("test_x", ("offset-missing",), "other", 1),
                            Catch("test_x", ("module-kind",), "m"), Catch("test_y", ("class-kind",), "c"),
                            Catch("test_y", ("module-kind",), "m")}
    with pytest.raises(ValueError, match="test_z: eagle3_catches needs need="):
        selftest.parse_catches({"test_z": [{"kinds": ["scaled"], "need": None, "tp": None}]})


def test_every_suite_marker_is_registered() -> None:
    """The marker names the packaged tests use are the ones the plugin registers."""
    hooks = Path(selftest.__file__).parent.parent / "plugin" / "hooks.py"
    assert f'"{CATCHES_MARK}(' in hooks.read_text() or f"'{CATCHES_MARK}(" in hooks.read_text()
    assert suite_catches()  # pytest collects the suite and its markers
