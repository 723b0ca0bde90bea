"""Run the packaged suite in a child pytest against the real SGLang, read its JUnit XML.

Shared by the e2e tests.  Every process the child starts inherits ``RUN_MARK``
(its working directory) and that working directory, so a test can look for
leftovers (:func:`run_processes`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import psutil
import pytest

from pytest_eagle3.cli.selftest import parse_junit
from pytest_eagle3.settings import default_cache_dir

INNER_TIMEOUT_S = 40 * 60
RUN_MARK = "PYTEST_EAGLE3_E2E_RUN"


def run_processes(mark: str, *, exclude: int | None = None, sessions: Iterable[int] = ()) -> list[psutil.Process]:
    """The live processes of the run marked ``mark`` (its working directory).

    SGLang renames its workers with setproctitle (``sglang::scheduler_TP0``,
    ``sglang::detokenizer``), which on Linux overwrites the memory that
    ``/proc/<pid>/environ`` reads: their ``RUN_MARK`` is gone.  So a process
    belongs to the run when its environment has ``RUN_MARK=mark``, or its working
    directory is ``mark`` (workers keep the one they inherit), or it is in one of
    ``sessions`` (an engine's process group, even one spawned from elsewhere).
    """
    wanted = set(sessions)
    cwd = os.path.realpath(mark)
    out = []
    for proc in psutil.process_iter():
        if proc.pid == exclude:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            mine = (os.getsid(proc.pid) in wanted) or proc.cwd() == cwd
            if not mine:
                mine = proc.environ().get(RUN_MARK) == mark
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError,
                PermissionError):
            continue
        if mine:
            out.append(proc)
    return out


@dataclass
class InnerRun:
    returncode: int
    output: str
    outcomes: dict[str, str]  # test name (with params) -> passed/failed/skipped/xfailed/error
    messages: dict[str, str]  # test name -> failure/skip message
    mark: str  # value of RUN_MARK in the inner run's environment


def run_inner(work: Path, args: Sequence[str], files: Mapping[str, str] = {},
              env: Mapping[str, str] = {}) -> InnerRun:
    """``python -m pytest ARGS`` in ``work`` (with extra test ``files`` written there),
    on CPU, sharing the user's checkpoint cache; ``env`` is added to the inner
    run's environment (SGLang engines inherit it, e.g. ``PYTEST_EAGLE3_FAULT``)."""
    for name, text in files.items():
        (work / name).write_text(text)
    junit = work / "junit.xml"
    cache = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])
    extra = dict(env)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_EAGLE3_FAULT")}
    env.update(extra)
    env[RUN_MARK] = str(work)
    cmd = [sys.executable, "-m", "pytest", *args, "--device", "cpu", "--eagle3-cache", cache,
           "-p", "no:cacheprovider", "-rA", f"--junitxml={junit}"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=INNER_TIMEOUT_S)
    output = proc.stdout + proc.stderr
    (work / "inner-output.txt").write_text(output)
    if not junit.exists():
        pytest.fail(f"inner pytest wrote no JUnit XML (exit {proc.returncode}):\n{output[-4000:]}")
    outcomes, messages = parse_junit(junit)
    return InnerRun(proc.returncode, output, outcomes, messages, str(work))
