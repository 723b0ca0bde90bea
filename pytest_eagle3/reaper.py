"""A watchdog that takes an engine's process group down when pytest dies.

SGLang's server runs in a process group of its own (``start_new_session``).
When pytest exits normally it stops the group itself
(:meth:`pytest_eagle3.engine.server.SGLangServer.stop`).  When pytest is
killed with SIGKILL no teardown runs; ``PR_SET_PDEATHSIG`` reaches only the
server's first process, and SGLang's own children can outlive it (measured on
sglang 0.5.23: ``sglang::detokenizer`` stayed alive in 3 of 3 SIGKILLs of
pytest).  This watchdog, started next to each engine and outside its group,
polls the pytest process and SIGKILLs the whole group once pytest is gone;
it exits by itself when the group is empty.

Run as ``python -m pytest_eagle3.reaper WATCH_PID PGID``.  Plain
stdlib: no torch, no sglang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

#: Seconds between polls.
POLL_S = 0.5


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return True


def group_alive(pgid: int) -> bool:
    """Whether any process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(watch_pid: int, pgid: int, poll_s: float = POLL_S) -> int:
    """Block until ``pgid`` is empty (return 0) or ``watch_pid`` is gone (SIGKILL
    the group, return 1)."""
    while group_alive(pgid):
        if not alive(watch_pid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return 1
        time.sleep(poll_s)
    return 0


def die_with_parent() -> None:
    """``preexec_fn`` of a helper subprocess (reference worker, ``--help`` probe):
    Linux sends it SIGKILL when the process that started it dies
    (``PR_SET_PDEATHSIG``).  No-op where prctl is missing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def spawn(pgid: int, watch_pid: int | None = None) -> subprocess.Popen:
    """Start the watchdog for ``pgid`` (watching this process by default), detached
    from this process's own group so a signal to pytest's group does not end it first."""
    return subprocess.Popen(
        [sys.executable, "-m", "pytest_eagle3.reaper", str(watch_pid or os.getpid()), str(pgid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not all(a.isdigit() for a in args):
        print("usage: python -m pytest_eagle3.reaper WATCH_PID PGID", file=sys.stderr)
        return 2
    return watch(int(args[0]), int(args[1]))


if __name__ == "__main__":
    sys.exit(main())
