"""Interrupt the packaged suite at seeded random moments; count what each interrupt left.

By default the main job (README command 1: ``pytest --pyargs pytest_eagle3.suite
--tp 2``), 20 interrupts, SIGKILL and SIGINT in turn, at moments spread over
5-180 s (one per slice of the window, in random order).  Per interrupt it
prints the moment, what the run was doing then, how long pytest took to exit,
the processes of the run alive 10 s after that exit, and the cache files
written again or left half-written (harness: ``tests/interrupts.py``).

Run from the repository root in the dev environment, with nothing else running::

    python benchmarks/interrupts.py --count 20 --seed 7 --json /tmp/interrupts.json

The cache is the user's (``--eagle3-cache`` default) unless ``--cache`` says
otherwise; warm it first (one uninterrupted run), or the first interrupts
measure checkpoint builds.  Exit status 1 when any process was left.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_eagle3.settings import default_cache_dir  # noqa: E402
from tests import interrupts  # noqa: E402

MAIN_JOB = ["--pyargs", "pytest_eagle3.suite", "--tp", "2", "-q"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None, help="default: a new one, printed")
    ap.add_argument("--window", type=float, nargs=2, default=(5.0, 180.0), metavar=("FROM_S", "TO_S"))
    ap.add_argument("--signals", nargs="+", default=["SIGKILL", "SIGINT"], choices=["SIGKILL", "SIGINT", "SIGTERM"])
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write every interrupt's record here")
    ap.add_argument("pytest_args", nargs="*", help="the run to interrupt (after --); default: the main job")
    args = ap.parse_args(argv)
    seed = random.SystemRandom().randrange(10**6) if args.seed is None else args.seed
    cache = args.cache or default_cache_dir()[0]
    run = args.pytest_args or MAIN_JOB
    work = Path(tempfile.mkdtemp(prefix="eagle3-interrupts-"))
    print(f"{args.count} interrupts of: pytest {' '.join(run)}; seed {seed}; window {args.window[0]:g}-"
          f"{args.window[1]:g} s; cache {cache}; outputs under {work}")
    print(interrupts.HEADER, flush=True)
    t0 = time.monotonic()
    results = interrupts.interrupt_runs(run, count=args.count, seed=seed, window=tuple(args.window), work=work,
                                        cache=Path(cache), signals=args.signals,
                                        progress=lambda row: print(row, flush=True))
    print(interrupts.summary(results))
    print(f"total {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"seed": seed, "run": run, "window": args.window,
                                         "interrupts": [dataclasses.asdict(r) for r in results]},
                                        indent=2, default=str))
    return 1 if any(r.left for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
