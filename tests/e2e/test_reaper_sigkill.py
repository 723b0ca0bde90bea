"""SIGKILL of a pytest that runs a real SGLang engine leaves no process of that run
(the watchdog itself, with plain ``sleep`` processes: ``tests/unit/test_reaper.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.inner_run import RUN_MARK, run_processes
from tests.unit.test_reaper import _wait

pytestmark = pytest.mark.e2e

HOLD_ENGINE = """
import os, time
from pathlib import Path

def test_hold(eagle3_capture):
    eagle3_capture([0, 3, 5])
    Path(os.environ["READY_FILE"]).write_text("ready")
    time.sleep(600)
"""


def test_sigkill_of_pytest_leaves_no_process(tmp_path: Path) -> None:
    """SIGKILL a pytest holding a real SGLang engine (TP 1, CPU): within seconds no
    process of that run is left (SGLang's detokenizer used to survive)."""
    from pytest_eagle3.settings import default_cache_dir

    (tmp_path / "test_hold.py").write_text(HOLD_ENGINE)
    ready = tmp_path / "ready"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env.update({RUN_MARK: str(tmp_path), "READY_FILE": str(ready)})
    cache = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "test_hold.py", "--device", "cpu",
                             "--eagle3-cache", cache, "-p", "no:cacheprovider", "-q"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def mine() -> list[psutil.Process]:
        return run_processes(str(tmp_path), exclude=proc.pid)

    try:
        assert _wait(ready.exists, timeout=600), "the engine did not become ready"
        before = [p.name() for p in mine()]
        # SGLang's renamed workers are found too (their environment no longer has the marker).
        assert any(n.startswith("sglang::sched") for n in before), before
        assert any(n.startswith("sglang::detok") for n in before), before
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _wait(lambda: not mine(), timeout=30), [p.name() for p in mine()]
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in mine():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
