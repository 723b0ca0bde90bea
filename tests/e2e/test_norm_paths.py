"""The packaged suite on SGLang's native norm path and through all-reduce fusion (CPU, real engine).

The CPU tier's default is SGLang's in-place AMX norm branch (every other e2e
test runs it).  Here the TP 2 half of the main job runs twice more:

* ``--eagle3-cpu-norm native``: SGLang's out-of-place ``forward_native``, the
  path every earlier release of this project verified; every capture and
  per-rank check passes (the acceptance engine, whose gate depends on those
  captures, runs in the two other runs: about 1.5 minutes less).
* ``--eagle3-cpu-allreduce-fusion``: each MLP all-reduce deferred into the next
  layer's fused all-reduce + residual add + RMSNorm, as on Hopper/Blackwell at
  TP > 1; captures, per-rank checks and acceptance pass, and every TP 2
  engine's log shows the fused op called on both ranks (the suite itself fails
  a test whose engine never ran it: ``pytest_eagle3/engine/standin_proof.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_eagle3.engine.standin_proof import PATHS, ops_called
from tests.inner_run import InnerRun, run_inner

pytestmark = pytest.mark.e2e

NORM_PROOF, FUSION_PROOF = PATHS[:2]


def _suite(work: Path, *extra: str, select: str = "tp2") -> InnerRun:
    pytest.importorskip("sglang")
    return run_inner(work, ["--pyargs", "pytest_eagle3.suite", "--tp", "2", "-k", select,
                            f"--basetemp={work / 'tmp'}", *extra])


def _all_passed(run: InnerRun) -> None:
    bad = {n: o for n, o in run.outcomes.items() if o not in ("passed", "xfailed")}
    assert run.returncode == 0 and not bad, f"{bad}\n" + run.output[-4000:]
    assert sum(o == "passed" for o in run.outcomes.values()) >= 8, run.outcomes


def _engine_logs(run: InnerRun) -> list[Path]:
    return sorted(Path(run.mark).glob("tmp/**/tp2-cpu-*.log"))


def test_native_norm_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = _suite(tmp_path_factory.mktemp("native"), "--eagle3-cpu-norm", "native", select="tp2 and not acceptance")
    _all_passed(run)
    assert "eagle3: norm path forward_native, out of place (--eagle3-cpu-norm native)" in run.output
    logs = _engine_logs(run)
    assert logs and not any(ops_called(p.read_text(errors="replace"), NORM_PROOF) for p in logs)


def test_fused_allreduce_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = _suite(tmp_path_factory.mktemp("fusion"), "--eagle3-cpu-allreduce-fusion")
    _all_passed(run)
    assert "eagle3: all-reduce fusion at TP > 1 (--eagle3-cpu-allreduce-fusion): SGLang's fused path" in run.output
    assert any(n.startswith("test_draft_acceptance_meets_the_gate[tp2") and o == "passed"
               for n, o in run.outcomes.items()), run.outcomes
    logs = _engine_logs(run)
    assert logs
    for log in logs:
        called = ops_called(log.read_text(errors="replace"), FUSION_PROOF)
        assert called and len(set().union(*called.values())) == 2, f"{log}: {called}"
