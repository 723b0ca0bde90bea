"""No process outlives pytest: the engine watchdog and the parent-death guards.

The unit test uses plain ``sleep`` processes; the e2e test SIGKILLs a pytest
that runs a real SGLang engine and looks for anything of that run left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pytest_eagle3.engine import reaper
from tests.inner_run import RUN_MARK


def _wait(predicate, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_watchdog_kills_the_group_when_the_watched_process_dies() -> None:
    watched = subprocess.Popen(["sleep", "60"])
    # A "server" leading its own group, with a grandchild that would outlive it.
    group = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    dog = reaper.spawn(group.pid, watch_pid=watched.pid)
    try:
        time.sleep(1.0)
        assert reaper.group_alive(group.pid) and dog.poll() is None
        watched.kill()
        watched.wait()
        # group.poll() reaps the leader (this test is its parent; a real server's is pytest, gone).
        assert _wait(lambda: group.poll() is not None and not reaper.group_alive(group.pid)), \
            "group survived the watched process"
        assert dog.wait(timeout=10) == 1
    finally:
        for proc in (watched, group):
            proc.kill()
        try:
            os.killpg(group.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_watchdog_exits_when_the_group_is_gone() -> None:
    group = subprocess.Popen(["sleep", "1"], start_new_session=True)
    dog = reaper.spawn(group.pid)
    group.wait()
    assert dog.wait(timeout=10) == 0


def test_usage() -> None:
    assert reaper.main(["x"]) == 2


HOLD_ENGINE = """
import os, time
from pathlib import Path

def test_hold(eagle3_capture):
    eagle3_capture([0, 3, 5])
    Path(os.environ["READY_FILE"]).write_text("ready")
    time.sleep(600)
"""


@pytest.mark.e2e
def test_sigkill_of_pytest_leaves_no_process(tmp_path: Path) -> None:
    """SIGKILL a pytest holding a real SGLang engine (TP 1, CPU): within seconds no
    process of that run is left (SGLang's detokenizer used to survive)."""
    from pytest_eagle3.plugin.options import default_cache_dir

    (tmp_path / "test_hold.py").write_text(HOLD_ENGINE)
    ready = tmp_path / "ready"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env.update({RUN_MARK: str(tmp_path), "READY_FILE": str(ready)})
    cache = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "test_hold.py", "--device", "cpu",
                             "--eagle3-cache", cache, "-p", "no:cacheprovider", "-q"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def mine() -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            try:
                if p.pid != proc.pid and p.environ().get(RUN_MARK) == str(tmp_path):
                    out.append(p)
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
        return out

    try:
        assert _wait(ready.exists, timeout=600), "the engine did not become ready"
        before = [p.name() for p in mine()]
        assert len(before) >= 3, before  # launcher, scheduler, detokenizer at least
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
