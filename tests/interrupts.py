"""Interrupt a pytest run of the packaged suite at chosen moments and count what is left.

Shared by ``tests/e2e/test_interrupts.py`` (10 seeded random interrupts of a
two-engine selection) and ``benchmarks/interrupts.py`` (any number, any
selection, the main job by default).  One interrupt:

1. start ``python -m pytest ARGS --device cpu --eagle3-cache CACHE`` in a work
   folder of its own, in a new session, with SIGINT restored to its default
   (a background job of a non-interactive shell starts with SIGINT ignored, and
   Python then never raises KeyboardInterrupt); every process of the run
   inherits ``RUN_MARK`` = that folder;
2. at the moment, note what the run is doing (its processes, the last line
   pytest printed) and send the signal to pytest's process alone, as a CI
   runner's timeout or the OOM killer does;
3. time pytest's exit, then look for the run's processes for ``SETTLE_S``
   seconds after it (by ``RUN_MARK``, working directory or session:
   :func:`tests.inner_run.run_processes`; SGLang's renamed workers lose the
   marker); whatever is still there is *left*;
4. compare the cache before and after: a complete entry written again is
   *rebuilt*, a new one is *completed*, a ``.tmp-`` file is *half-written*.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import psutil

from tests.inner_run import RUN_MARK, run_processes

#: Seconds after pytest's exit within which every process of the run must be gone.
SETTLE_S = 10.0
#: Seconds pytest gets to exit after SIGINT before the harness SIGKILLs it.
SIGINT_GRACE_S = 120.0


@dataclass
class Interrupt:
    """What one interrupt did.  Times are seconds from pytest's start (``at_s``)
    or from the signal (``exit_s``)."""

    index: int
    signal: str  # "SIGKILL" or "SIGINT"
    at_s: float  # when the signal was sent (planned moment)
    phase: str  # the run's processes at that moment, e.g. "scheduler_TP0 x2, watchdog x2"
    last_line: str  # the last line pytest had printed
    sent: bool = True  # False: pytest had finished before the moment
    exit_s: float | None = None  # signal -> pytest gone (None: did not exit within the grace)
    returncode: int | None = None
    left: list[str] = field(default_factory=list)  # processes alive SETTLE_S after the exit
    rebuilt: list[str] = field(default_factory=list)  # complete cache files written again
    completed: list[str] = field(default_factory=list)  # cache files that appeared complete
    half_written: list[str] = field(default_factory=list)  # .tmp- files left in the cache
    output: Path | None = None  # pytest's output file


def spread_moments(count: int, lo: float, hi: float, seed: int) -> list[float]:
    """``count`` seeded random moments in ``[lo, hi)`` seconds, one in each of
    ``count`` equal slices (so every phase of the run gets its share), shuffled."""
    rng = random.Random(seed)
    width = (hi - lo) / count
    moments = [round(lo + width * (i + rng.random()), 1) for i in range(count)]
    rng.shuffle(moments)
    return moments


def describe(proc: psutil.Process) -> str:
    """A short name for one process of a run."""
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    if "pytest_eagle3.reaper" in cmd:
        return "watchdog"
    if "reference_worker" in cmd:
        return "reference worker"
    if "--help" in cmd and "sglang" in cmd:
        return "flag probe"
    if "sglang.launch_server" in cmd:
        return "engine launcher"
    if name.startswith("sglang::"):
        return name[len("sglang::"):]
    if "resource_tracker" in cmd:
        return "resource tracker"
    if "multiprocessing" in cmd:
        return "engine process (starting)"
    return name


def summarize(procs: Sequence[psutil.Process]) -> str:
    counts = collections.Counter(describe(p) for p in procs)
    if not counts:
        return "pytest only"
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in sorted(counts.items()))


def cache_files(cache: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime_ns) of every file under ``cache`` but locks and logs."""
    out = {}
    for path in cache.rglob("*"):
        if path.name.endswith((".lock", ".log")):
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            out[str(path.relative_to(cache))] = (st.st_size, st.st_mtime_ns)
    return out


def _is_half(rel: str) -> bool:
    return ".tmp-" in rel or ".tmp/" in rel or rel.endswith(".tmp")


def _sid(proc: psutil.Process) -> int:
    try:
        return os.getsid(proc.pid)
    except (ProcessLookupError, PermissionError):
        return 0


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:160] if lines else ""


def interrupt_once(index: int, args: Sequence[str], *, sig: str, at_s: float, work: Path,
                   cache: Path, settle_s: float = SETTLE_S) -> Interrupt:
    """Start pytest with ``args`` in ``work``, send ``sig`` at ``at_s`` seconds, and
    report what was left (see the module docstring).  Left processes are killed
    after they are counted."""
    work.mkdir(parents=True, exist_ok=True)
    mark = str(work)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_EAGLE3_FAULT")}
    env[RUN_MARK] = mark
    output = work / "pytest-output.txt"
    before = cache_files(cache)
    cmd = [sys.executable, "-m", "pytest", *args, "--device", "cpu", "--eagle3-cache", str(cache),
           "-p", "no:cacheprovider"]
    with open(output, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_default_sigint)
    t0 = time.monotonic()
    sessions: set[int] = {proc.pid}
    result = Interrupt(index, sig, at_s, "", "", output=output)
    try:
        try:
            proc.wait(timeout=at_s)
            result.sent = False  # finished before the moment
        except subprocess.TimeoutExpired:
            # The sessions of everything the run started (each engine leads its own).
            sessions = {proc.pid} | {_sid(p) for p in run_processes(mark, exclude=proc.pid)} - {0}
            result.phase = summarize(run_processes(mark, exclude=proc.pid, sessions=sessions))
            result.last_line = _last_line(output)
            result.at_s = round(time.monotonic() - t0, 1)
            t_sig = time.monotonic()
            proc.send_signal(getattr(signal, sig))
            try:
                proc.wait(timeout=SIGINT_GRACE_S)
                result.exit_s = round(time.monotonic() - t_sig, 1)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        result.returncode = proc.returncode
        end = time.monotonic() + settle_s
        left = run_processes(mark, exclude=proc.pid, sessions=sessions)
        while left and time.monotonic() < end:
            time.sleep(0.25)
            left = run_processes(mark, exclude=proc.pid, sessions=sessions)
        result.left = [describe(p) for p in left]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in run_processes(mark, exclude=proc.pid, sessions=sessions):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    after = cache_files(cache)
    for rel, stat in sorted(after.items()):
        if _is_half(rel):
            result.half_written.append(rel)
        elif rel not in before:
            result.completed.append(rel)
        elif before[rel] != stat:
            result.rebuilt.append(rel)
    return result


def interrupt_runs(args: Sequence[str], *, count: int, seed: int, window: tuple[float, float],
                   work: Path, cache: Path, signals: Sequence[str] = ("SIGKILL", "SIGINT"),
                   settle_s: float = SETTLE_S, progress=None) -> list[Interrupt]:
    """``count`` interrupts at :func:`spread_moments`, the signals taken in turn."""
    results = []
    for i, at_s in enumerate(spread_moments(count, window[0], window[1], seed)):
        sig = signals[i % len(signals)]
        res = interrupt_once(i, args, sig=sig, at_s=at_s, work=work / f"run-{i:02d}", cache=cache,
                             settle_s=settle_s)
        results.append(res)
        if progress is not None:
            progress(format_row(res))
    return results


HEADER = f"{'#':>3} {'signal':<7} {'at s':>6} {'exit s':>6} {'left':>4} {'rebuilt':>7} {'half':>4}  phase"


def format_row(r: Interrupt) -> str:
    exit_s = "-" if r.exit_s is None else f"{r.exit_s:.1f}"
    if not r.sent:
        return f"{r.index:>3} {r.signal:<7} {r.at_s:>6.1f} {'':>6} {'':>4} {'':>7} {'':>4}  (pytest had finished)"
    return (f"{r.index:>3} {r.signal:<7} {r.at_s:>6.1f} {exit_s:>6} {len(r.left):>4} {len(r.rebuilt):>7} "
            f"{len(r.half_written):>4}  {r.phase}" + (f"; LEFT: {', '.join(r.left)}" if r.left else ""))


def summary(results: Sequence[Interrupt]) -> str:
    sent = [r for r in results if r.sent]
    sigint = [r.exit_s for r in sent if r.signal == "SIGINT" and r.exit_s is not None]
    left = sum(len(r.left) for r in sent)
    return (f"{len(sent)} interrupts sent ({sum(r.signal == 'SIGKILL' for r in sent)} SIGKILL, "
            f"{sum(r.signal == 'SIGINT' for r in sent)} SIGINT); processes left {SETTLE_S:.0f} s after "
            f"pytest's exit: {left}; slowest exit after SIGINT: "
            f"{max(sigint) if sigint else '-'} s; cache files rebuilt: {sum(len(r.rebuilt) for r in sent)}, "
            f"completed: {sum(len(r.completed) for r in sent)}")
