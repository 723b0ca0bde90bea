"""Print how the run-level diagnosis names sampled faults (pytest_eagle3/verdicts/grammar.py).

Usage::

    python benchmarks/diagnosis_grammar.py [--samples 200] [--seed 0]

Per confinement size (attributes in the sampled conjunction: TP size, TP rank,
forward mode, prefill chunk, path, batch size, send on its engine, and the aux
slots the fault writes), the share of faults whose run-level
cause is the sampled conjunction (exact), another conjunction holding the same
comparisons (coarser: the run's selection cannot tell them apart), nothing
(unnamed) and a cause that holds a right comparison (wrong: must be 0).
"""

from __future__ import annotations

import argparse

from pytest_eagle3.verdicts.grammar import CLASSES, simulate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("size  " + "  ".join(f"{c:>8}" for c in CLASSES))
    wrong = 0
    for size in (1, 2, 3, 4):
        counts = simulate(args.samples, size, seed=args.seed)
        wrong += counts["wrong"]
        print(f"{size:>4}  " + "  ".join(f"{counts[c] / args.samples:>8.1%}" for c in CLASSES))
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
