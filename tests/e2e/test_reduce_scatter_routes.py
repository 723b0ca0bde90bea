"""End to end on CPU: input-scattered attention with the capture gathered, at TP 2.

sglang 0.5.23's capture-only engine with ``--enable-attn-tp-input-scattered``
(the CPU tier stands in only for the device condition of ``AttnTpContext.init_context``)
dies at the first multi-row batch: the capture holds each rank's slice of the rows
(``[input-scattered-capture]``, ``tests/e2e/test_path_variants.py``).  With the fix
``input-scattered-capture-gathered`` (the capture gathered over the TP group) the
same test passes, and every prefill forward's captures passed ``tp_reduce_scatter``
on both ranks (the workers' lines).  About 1 minute (one engine start).
"""

from __future__ import annotations

import pytest

from pytest_eagle3.engine.route_proof import forwards
from pytest_eagle3.worker.env import FIX_ENV
from tests.inner_run import run_inner

pytestmark = pytest.mark.e2e


def test_input_scattered_passes_with_the_capture_gathered(tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("sglang")
    work = tmp_path_factory.mktemp("scattered")
    run = run_inner(work, ["--pyargs", "pytest_eagle3.suite.test_paths", "--tp", "2", "--eagle3-slow",
                           "-k", "attn-tp-input-scattered", f"--basetemp={work / 'tmp'}"],
                    env={FIX_ENV: "input-scattered-capture-gathered"})
    name = "test_captures_identical_through_path[tp2-attn-tp-input-scattered]"
    assert run.outcomes.get(name) == "passed", run.output[-4000:]
    logs = "".join(p.read_text(errors="replace") for p in work.glob("tmp/**/tp2-cpu-*.log"))
    assert "upstream fix input-scattered-capture-gathered applied" in logs
    seen = forwards(logs)
    for rank in (0, 1):
        extend = [f for f in seen if f.rank == rank and f.mode == "EXTEND" and f.captured]
        assert extend and all("tp_reduce_scatter" in f.routes for f in extend), seen
        # Gathered: every forward returned all of its rows.
        assert all(f.rows == f.tokens for f in extend), seen
