"""Self-test: the packaged suite catches each wiring bug injected into the real SGLang.

For every kind of the fault catalog (:data:`pytest_eagle3.engine.faults.CATALOG`)
one inner pytest runs the smallest part of the packaged suite that exercises
it, against the real SGLang on CPU, with ``PYTEST_EAGLE3_FAULT`` in its
environment: every SGLang process of that run installs the fault inside its own
capture path (``engine/faults.py``, through the ``sglang.srt.plugins`` hooks).
Each run must fail, and the failing test's message must name the fault's kind
(the diagnosis tag ``[kind]`` of ``verdicts/diagnose.py``).  One run without a
fault over the union of those selections must pass: the control.

One engine per inner run.  Kinds that need TP > 1 (a vocab shard, a rank's
partial MLP sum, the attention-TP size) run at TP 2, the others at TP 1
(``PYTEST_EAGLE3_FAULT_TP=2`` runs those at TP 2 too, except ``offset-missing``,
whose id list exists at TP 1 only).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import pytest

from pytest_eagle3.engine.faults import CATALOG, NEEDS_TP
from tests.inner_run import InnerRun, run_inner

pytestmark = pytest.mark.e2e

WIDE = "kimi-embedding-first"
#: TP of the kinds that need none (1 by default; the env var forces 2).
NO_TP = int(os.environ.get("PYTEST_EAGLE3_FAULT_TP", "1"))


@dataclass(frozen=True)
class Case:
    """What runs for one fault and which tests must fail naming it."""

    tp: int
    tests: tuple[str, ...]  # packaged test ids (names with parameters) that must fail

    def select(self) -> str:
        return " or ".join(self.tests)


def capture_order(tp: int, case: str = WIDE) -> str:
    return f"test_capture_order[tp{tp}-{case}]"


CASES: dict[str, Case] = {
    # The id faults change layers_to_capture: the capture-order test sees every slot move.
    "offset-twice": Case(NO_TP, (capture_order(NO_TP),)),
    # [0, 3, 5] would become [-1, 2, 4]: SGLang's packer then crashes the scheduler at the
    # first forward ("captured 2 of 3"), so use a list without 0: [1, 3, 4] -> [2, 4, 5] -> [1, 3, 4].
    "offset-missing": Case(1, (capture_order(1, "specforge-default-ids"),)),
    "ids-ignored": Case(NO_TP, (capture_order(NO_TP),)),
    "reversed-order": Case(NO_TP, (capture_order(NO_TP),)),
    "normalized-input": Case(NO_TP, (capture_order(NO_TP),)),
    "no-residual": Case(NO_TP, (capture_order(NO_TP),)),
    "unreduced-embedding": Case(2, (capture_order(2), f"test_embedding_rows_complete_on_every_shard[tp2-{WIDE}]")),
    "partial-sum": Case(2, (capture_order(2), f"test_every_rank_fully_reduced[tp2-{WIDE}]")),
    "dp-gather-scaled": Case(2, (capture_order(2),)),
    # Rows of one decode forward of several requests: the batched path variant.
    "wrong-request-rows": Case(NO_TP, (f"test_captures_identical_through_path[tp{NO_TP}-batch]",)),
}

TIMES: dict[str, float] = {}


def _run(tmp_path, tests: tuple[str, ...], tp: int, fault: str | None) -> InnerRun:
    args = ["--pyargs", "pytest_eagle3.suite", "--tp", str(tp), "-k", " or ".join(tests)]
    env = {"PYTEST_EAGLE3_FAULT": json.dumps({"kind": fault})} if fault else {}
    t0 = time.monotonic()
    run = run_inner(tmp_path, args, env=env)
    TIMES[fault or "none"] = time.monotonic() - t0
    return run


def test_catalog_is_covered() -> None:
    assert set(CASES) == set(CATALOG)
    assert all(CASES[k].tp == 2 for k in NEEDS_TP)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_fault_is_caught_and_named(kind: str, tmp_path) -> None:
    case = CASES[kind]
    run = _run(tmp_path, case.tests, case.tp, kind)
    assert run.returncode == 1, run.output[-4000:]
    assert set(run.outcomes) == set(case.tests), (run.outcomes, run.output[-3000:])
    for name in case.tests:
        assert run.outcomes[name] == "failed", (name, run.outcomes[name], run.output[-3000:])
        assert f"[{kind}]" in run.messages[name], run.messages[name][:4000]


def test_no_fault_passes(tmp_path) -> None:
    """The control: the union of the selections above, without a fault, passes."""
    tests = sorted({t for c in CASES.values() for t in c.tests})
    tp = max(c.tp for c in CASES.values())
    run = _run(tmp_path, tuple(tests), tp, None)
    assert run.returncode == 0, run.output[-4000:]
    assert run.outcomes == {t: "passed" for t in tests}, run.output[-4000:]
    assert "[" not in "".join(run.messages.values())


def test_report_times() -> None:
    """Last: print each inner run's wall time (``-s``) for the README."""
    if TIMES:
        print("\neagle3 fault self-test wall times: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items())
              + f"; total {sum(TIMES.values()):.0f} s")
