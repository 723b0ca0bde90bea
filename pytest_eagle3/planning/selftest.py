"""The self-test plan: which packaged tests must catch each injected fault.

The faults themselves live in :mod:`pytest_eagle3.worker.faults` (injected into
SGLang's own computation); this module only picks the smallest part of
``pytest_eagle3.suite`` that must fail naming each kind.
"""

from __future__ import annotations

from pytest_eagle3.worker.faults import NEEDS_FUSED_ALLREDUCE, NEEDS_INPLACE_NORM, NEEDS_TP
from pytest_eagle3.planning.cases import WIDE_CASE

__all__ = ["NEEDS_TP", "self_test_args", "self_test_plan"]


def self_test_plan(no_tp: int = 1) -> dict[str, tuple[int, tuple[str, ...]]]:
    """kind -> (TP size, ids of the packaged tests that must fail naming it): the
    smallest part of ``pytest_eagle3.suite`` that catches each fault, one engine
    per kind (``pytest-eagle3 self-test`` runs it; ``tests/e2e/test_fault_self_test.py``).

    Kinds in :data:`NEEDS_TP` run at TP 2, the others at ``no_tp``, except
    ``offset-missing``: on the embedding-first list ``[0, 3, 5]`` it would ask for
    layer -1, which SGLang never captures (the packer then stops the scheduler
    at the first forward: "captured 2 of 3"), so it runs on SpecForge's default
    list ``[1, 3, 4]`` (SGLang: ``[2, 4, 5]``; faulted: ``[1, 3, 4]``), a TP 1 case.
    """
    def order(tp: int, case: str = WIDE_CASE) -> str:
        return f"test_capture_order[tp{tp}-{case}]"

    return {
        "offset-twice": (no_tp, (order(no_tp),)),
        "offset-missing": (1, (order(1, "specforge-default-ids"),)),
        "ids-ignored": (no_tp, (order(no_tp),)),
        "reversed-order": (no_tp, (order(no_tp),)),
        "normalized-input": (no_tp, (order(no_tp),)),
        "no-residual": (no_tp, (order(no_tp),)),
        "unreduced-embedding": (2, (order(2), f"test_embedding_rows_complete_on_every_shard[tp2-{WIDE_CASE}]")),
        "partial-sum": (2, (order(2), f"test_every_rank_fully_reduced[tp2-{WIDE_CASE}]")),
        "dp-gather-scaled": (2, (order(2),)),
        # Rows of one decode forward of several requests: the batched path variant.
        "wrong-request-rows": (no_tp, (f"test_captures_identical_through_path[tp{no_tp}-batch]",)),
        # Invisible on the native norm path: the child runs --eagle3-cpu-norm inplace (self_test_args).
        "aliased-capture": (no_tp, (order(no_tp),)),
        # Lives only where the all-reduce is fused: the child runs --eagle3-cpu-allreduce-fusion.
        "before-fused-allreduce": (2, (order(2), f"test_every_rank_fully_reduced[tp2-{WIDE_CASE}]")),
    }


def self_test_args(kind: str | None) -> tuple[str, ...]:
    """Child pytest arguments that put a fault's engine on the path where the
    fault lives: ``--eagle3-cpu-norm inplace`` for the kinds in
    :data:`~pytest_eagle3.worker.faults.NEEDS_INPLACE_NORM`,
    ``--eagle3-cpu-allreduce-fusion`` for those in
    :data:`~pytest_eagle3.worker.faults.NEEDS_FUSED_ALLREDUCE` (both act on cpu
    only; a GPU runs these paths natively).  ``None``: none."""
    if kind in NEEDS_INPLACE_NORM:
        return ("--eagle3-cpu-norm", "inplace")
    if kind in NEEDS_FUSED_ALLREDUCE:
        return ("--eagle3-cpu-allreduce-fusion",)
    return ()
