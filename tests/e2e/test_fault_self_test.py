"""Self-test: the packaged suite catches each wiring bug injected into the real SGLang.

Runs ``pytest-eagle3 self-test``'s own code (:mod:`pytest_eagle3.cli.selftest`)
once over the whole catalog.  For every kind of the fault catalog
(:data:`pytest_eagle3.worker.faults.CATALOG`) one inner pytest runs the smallest part of the packaged suite that exercises
it, against the real SGLang on CPU, with ``--eagle3-fault KIND``: every SGLang process of that run installs the fault inside its own
capture path (``worker/faults.py``, through the ``sglang.srt.plugins`` hooks).
Each run must fail, and the failing test's message must name the fault's kind
(the diagnosis tag ``[kind]`` of ``verdicts/diagnose.py``).  One run without a
fault over the union of those selections must pass: the control.

One engine per inner run.  Kinds that need TP > 1 (a vocab shard, a rank's
partial MLP sum, the attention-TP size) run at TP 2, the others at TP 1
(``PYTEST_EAGLE3_FAULT_TP=2`` runs those at TP 2 too, except ``offset-missing``,
whose id list exists at TP 1 only): :func:`pytest_eagle3.planning.selftest.self_test_plan`.
Measured on 2 cores: about 13-20 minutes in all (one engine per fault, the
control seven), most of it engine starts.
"""

from __future__ import annotations

import os

import pytest

from pytest_eagle3.cli import selftest
from pytest_eagle3.worker.faults import CATALOG, NEEDS_TP, RUN_LEVEL, named_as
from pytest_eagle3.planning.selftest import contrast_plan, self_test_plan
from pytest_eagle3.settings import default_cache_dir
from tests.inner_run import RUN_MARK

pytestmark = pytest.mark.e2e

#: TP of the kinds that need none (1 by default; the env var forces 2).
NO_TP = int(os.environ.get("PYTEST_EAGLE3_FAULT_TP", "1"))

#: kind -> (TP size, packaged tests that must fail naming it).
CASES = self_test_plan(NO_TP)
#: kind -> packaged tests that must pass with it on (the run-level diagnosis's contrast).
CONTRASTS = contrast_plan(NO_TP)


@pytest.fixture(scope="module")
def self_test_result(tmp_path_factory) -> selftest.SelfTestResult:
    """``pytest-eagle3 self-test`` over the whole catalog (the verb's own code),
    on CPU, sharing the user's checkpoint cache; the table is printed (``-s``)."""
    work = tmp_path_factory.mktemp("self-test")
    cache = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])
    base = dict(os.environ)

    def runner(where, tests, tp, fault, extra, env=None):
        # ``env``: the whole environment a kind asks for (a PP kind adds the relay fix).
        return selftest.run_child(where, tests, tp, fault, extra, env={**(env or base), RUN_MARK: str(work)})

    result = selftest.self_test(work, no_tp=NO_TP, extra=["--device", "cpu", "--eagle3-cache", cache],
                                progress=lambda m: None, runner=runner)
    print("\n" + "\n".join(selftest.render(result)))
    return result


def test_catalog_is_covered() -> None:
    assert set(CASES) == set(CATALOG)
    assert all(CASES[k][0] == 2 for k in NEEDS_TP)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_fault_is_caught_and_named(kind: str, self_test_result) -> None:
    got = {k.kind: k for k in self_test_result.kinds}[kind]
    assert got.tp == CASES[kind][0] and got.tests == CASES[kind][1]
    assert got.verdict == selftest.CAUGHT, f"{got.verdict}: {got.detail}\n{got.log.read_text()[-3000:]}"
    if named_as(kind) is not None:
        assert f"[{named_as(kind)}]" in got.detail  # a kind confined to one path is named by its computation
    if kind in RUN_LEVEL:
        assert f"run: [{RUN_LEVEL[kind]}]" in got.detail  # ... and the run-level diagnosis names the confinement
    if kind in ("partial-before-dp-reduce-scatter", "other-rank-slice-after-dp-reduce-scatter"):  # ... and the route
        assert f"[{named_as(kind)}] on the dp_reduce_scatter route" in got.log.read_text(errors="replace")


def test_no_fault_passes(self_test_result) -> None:
    """The control: the union of the selections above, without a fault, passes."""
    control = self_test_result.control
    assert control is not None and control.verdict == "passed", f"{control.detail}\n{control.log.read_text()[-3000:]}"
    assert set(control.tests) == {t for _, names in CASES.values() for t in names} | {
        t for names in CONTRASTS.values() for t in names}
    assert self_test_result.ok


def test_an_aliased_capture_is_invisible_on_the_native_norm_path(tmp_path) -> None:
    """Why the in-place norm path is the CPU tier's default: on SGLang's native,
    out-of-place norms a capture that kept the residual's storage still holds the
    right values (nothing writes that storage again), so the suite passes with
    the aliased-capture fault injected; the in-place run above catches it."""
    tests = CASES["aliased-capture"][1]
    cache = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])
    run = selftest.run_child(tmp_path, tests, CASES["aliased-capture"][0], "aliased-capture",
                             ["--device", "cpu", "--eagle3-cache", cache, "--eagle3-cpu-norm", "native"],
                             env={**os.environ, RUN_MARK: str(tmp_path)})
    assert run.returncode == 0 and all(run.outcomes.get(t) == "passed" for t in tests), run.output[-3000:]
    assert "norm path forward_native, out of place (--eagle3-cpu-norm native)" in run.output
