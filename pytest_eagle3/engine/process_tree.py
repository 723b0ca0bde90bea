"""Taking an SGLang server's processes down: the whole tree, the whole group,
and the child that dies with the test process."""

from __future__ import annotations

import os
import signal

def kill_tree(pid: int, *, timeout: float = 10.0, graceful: bool = True) -> None:
    """Terminate ``pid`` and all its descendants: SIGTERM, wait, then SIGKILL
    (``graceful=False``: SIGKILL at once)."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = parent.children(recursive=True) + [parent]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)


def die_with_parent() -> None:
    """In the child before exec: ask Linux for SIGTERM when the test process dies.

    Covers the server's first process when the test process is killed with
    SIGKILL (no teardown runs); the rest of its process group is taken down by
    the watchdog (:mod:`pytest_eagle3.reaper`).  Also used for the
    reference worker and the ``--help`` probe.  No-op where prctl is missing.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in process group ``pgid`` (no error if none)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
