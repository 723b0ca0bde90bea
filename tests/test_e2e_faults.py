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
whose id list exists at TP 1 only): :func:`pytest_eagle3.engine.faults.self_test_plan`.
Measured on 2 shared cores: about 13-20 minutes in all (one engine per fault, the
control three), most of it engine starts.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from pytest_eagle3.engine.faults import CATALOG, NEEDS_TP, self_test_plan
from tests.inner_run import InnerRun, run_inner

pytestmark = pytest.mark.e2e

#: TP of the kinds that need none (1 by default; the env var forces 2).
NO_TP = int(os.environ.get("PYTEST_EAGLE3_FAULT_TP", "1"))


#: kind -> (TP size, packaged tests that must fail naming it).
CASES = self_test_plan(NO_TP)

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
    assert all(CASES[k][0] == 2 for k in NEEDS_TP)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_fault_is_caught_and_named(kind: str, tmp_path) -> None:
    tp, tests = CASES[kind]
    run = _run(tmp_path, tests, tp, kind)
    assert run.returncode == 1, run.output[-4000:]
    assert set(run.outcomes) == set(tests), (run.outcomes, run.output[-3000:])
    for name in tests:
        assert run.outcomes[name] == "failed", (name, run.outcomes[name], run.output[-3000:])
        assert f"[{kind}]" in run.messages[name], run.messages[name][:4000]


def test_no_fault_passes(tmp_path) -> None:
    """The control: the union of the selections above, without a fault, passes."""
    tests = sorted({t for _, names in CASES.values() for t in names})
    tp = max(tp for tp, _ in CASES.values())
    run = _run(tmp_path, tuple(tests), tp, None)
    assert run.returncode == 0, run.output[-4000:]
    assert run.outcomes == {t: "passed" for t in tests}, run.output[-4000:]
    assert "[" not in "".join(run.messages.values())


def test_report_times() -> None:
    """Last: print each inner run's wall time (``-s``) for the README."""
    if TIMES:
        print("\neagle3 fault self-test wall times: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items())
              + f"; total {sum(TIMES.values()):.0f} s")
