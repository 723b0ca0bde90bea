"""Interrupted at random moments, a run of the packaged suite leaves nothing behind.

A selection that starts two engines (TP 1, then TP 2 prefetched while TP 1
serves) is started again and again and sent SIGKILL or SIGINT, in turn, at
seeded random moments spread over its first 55 seconds: the flag probe, the
reference worker, an engine starting, a prefetched engine starting, engines
serving and being stopped.  After each: no process of the run is alive 10 s
after pytest's exit, pytest exits within seconds of SIGINT, and the next run
reuses the cache (no complete entry is written again).  ``--interrupts N`` and
``--interrupt-seed S`` change the count and the seed (printed, with a table of
every interrupt).  The harness: ``tests/interrupts.py``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from pytest_eagle3.settings import default_cache_dir
from tests import interrupts

pytestmark = [pytest.mark.e2e, pytest.mark.slow(reason="ten interrupted runs, about 5 min")]

#: Two engines (TP 1 and TP 2), one test each; about 57 s uninterrupted with a warm cache.
SELECTION = ["--pyargs", "pytest_eagle3.suite", "--tp", "2", "-k", "embedding_rows", "-q", "--eagle3-prefetch"]
WINDOW_S = (2.0, 55.0)
#: Seconds pytest may take to exit after SIGINT (it stops its engines first).
SIGINT_EXIT_S = 30.0


def test_random_interrupts_leave_nothing(tmp_path: Path, pytestconfig: pytest.Config,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    count = pytestconfig.getoption("--interrupts")
    seed = pytestconfig.getoption("--interrupt-seed")
    if seed is None:
        seed = random.SystemRandom().randrange(10**6)
    cache = Path(os.environ.get("PYTEST_EAGLE3_CACHE") or default_cache_dir()[0])
    with capsys.disabled():
        print(f"\ninterrupts: {count}, seed {seed} (rerun: --interrupt-seed {seed})\n{interrupts.HEADER}")
        results = interrupts.interrupt_runs(SELECTION, count=count, seed=seed, window=WINDOW_S,
                                            work=tmp_path, cache=cache, progress=print)
        print(interrupts.summary(results))
    sent = [r for r in results if r.sent]
    assert sent, f"seed {seed}: pytest finished before every moment; the window {WINDOW_S} is too late"
    problems = []
    for r in sent:
        where = f"seed {seed}, interrupt {r.index} ({r.signal} at {r.at_s} s, during: {r.phase}; output: {r.output})"
        if r.left:
            problems.append(f"{where}: left {', '.join(r.left)} {interrupts.SETTLE_S:.0f} s after pytest's exit")
        if r.signal == "SIGINT" and (r.exit_s is None or r.exit_s > SIGINT_EXIT_S):
            problems.append(f"{where}: pytest took {r.exit_s or '>120'} s to exit after SIGINT")
        if r.rebuilt:
            problems.append(f"{where}: complete cache files written again: {', '.join(r.rebuilt)}")
    assert not problems, "\n".join(problems)
