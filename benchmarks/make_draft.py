"""Regenerate a packaged synthetic EAGLE-3 draft and print how long each stage took.

Same as ``python -m pytest_eagle3.draft.build``: trains the draft of a target preset
(default ``tiny-dsv3``) with its fixed seed and step count on one CPU thread, and
writes ``fixtures/drafts/<preset>/`` (config.json, model.safetensors, quality.json,
continuations.json). Run from the repository root in the dev environment::

    python benchmarks/make_draft.py                    # rewrite fixtures/drafts/tiny-dsv3
    python benchmarks/make_draft.py --out /tmp/draft   # leave the shipped draft alone

The load average is printed before and after: other work on the machine skews the
wall-clock times (``training_cpu_seconds`` in quality.json is less sensitive).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    from pytest_eagle3.draft.build import QUALITY_FILE, main as build_main

    load_before = os.getloadavg()
    start = time.perf_counter()
    rc = build_main(sys.argv[1:])
    wall = time.perf_counter() - start
    out = None
    for i, arg in enumerate(sys.argv[1:]):
        if arg == "--out":
            out = Path(sys.argv[i + 2])
    if out is None:
        from pytest_eagle3.draft import shipped_draft_dir

        preset = sys.argv[sys.argv.index("--preset") + 1] if "--preset" in sys.argv else "tiny-dsv3"
        out = shipped_draft_dir(preset)
    q = json.loads((out / QUALITY_FILE).read_text())
    rows = [
        ("data (greedy continuations + snapshots)", q["data_seconds"]),
        ("training wall", q["training_seconds"]),
        ("training CPU", q["training_cpu_seconds"]),
        ("total wall", round(wall, 1)),
    ]
    for name, secs in rows:
        print(f"{name:42s} {secs:8.1f} s")
    print(f"{'parameters':42s} {q['parameters']:10d}")
    print(f"{'model.safetensors bytes':42s} {q['weights_bytes']:10d}")
    for name, qual in q["quality"].items():
        print(f"  {name:26s} first-token acc {qual['first_token_accuracy']:.3f}  "
              f"accept length {qual['accept_length']:.3f}")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
