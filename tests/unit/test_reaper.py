"""No process outlives pytest: the engine watchdog and the parent-death guards.

These use plain ``sleep`` processes; ``tests/e2e/test_reaper_sigkill.py`` SIGKILLs
a pytest that runs a real SGLang engine and looks for anything of that run left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from pytest_eagle3 import reaper


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
