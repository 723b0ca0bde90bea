"""Tolerance table: how far a correct bf16 capture is from the fp32 reference,
and how far the nearest wrong snapshot is, per target preset.

transformers in bf16 against transformers in fp32 on the same checkpoint stands
in for a correct bf16 engine's noise (issue 11): for every suite prompt and
every residual-stream snapshot ``hs[i]`` the relative L2 error of bf16 vs
fp32 ("noise"), and the smallest relative L2 distance from ``hs[i]`` to any
other snapshot ``hs[j]`` of the same prompt ("nearest wrong").  A tolerance
between the worst noise and the best wrong distance, with margin on both sides
(their geometric mean), separates a correct capture from a wrong one.

    python benchmarks/bench_tolerance.py                      # tiny-dsv3 on CPU
    python benchmarks/bench_tolerance.py --target gpu-dsv3    # on a GPU runner (built on cuda)
    python benchmarks/bench_tolerance.py --json FILE

Prints a markdown table; the tolerance table of docs/gpu-tier.md is its output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_eagle3.settings import default_cache_dir  # noqa: E402
from pytest_eagle3.target.spec import TargetSpec, load_packaged_prompts  # noqa: E402


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def measure(target: str, cache: Path) -> dict:
    from pytest_eagle3.target.checkpoint import ensure_checkpoint
    from pytest_eagle3.target.reference import ensure_reference

    spec = TargetSpec.preset(target)
    t0 = time.monotonic()
    ckpt = ensure_checkpoint(spec, cache)
    prompts = load_packaged_prompts(vocab_size=spec.facts.vocab_size)
    fp32 = ensure_reference(ckpt, prompts, dtype="float32")
    bf16 = ensure_reference(ckpt, prompts, dtype="bfloat16")
    L = spec.facts.num_layers
    rows = []
    for i in range(L + 1):  # hs[0] .. hs[L-1] and the final_prenorm (index L+1 in the reference)
        idx = i if i < L else L + 1
        noise = max(rel(b[idx], f[idx]) for b, f in zip(bf16, fp32))
        others = [j for j in range(L + 2) if j != idx and j != L]
        wrong = min(rel(f[j], f[idx]) for f in fp32 for j in others)
        rows.append({"snapshot": f"hs[{idx}]" if i < L else "final_prenorm", "bf16_noise": noise,
                     "nearest_wrong": wrong})
    worst = max(r["bf16_noise"] for r in rows)
    best_wrong = min(r["nearest_wrong"] for r in rows)
    return {"target": target, "rows": rows, "worst_noise": worst, "nearest_wrong": best_wrong,
            "suggested_tolerance": math.sqrt(worst * best_wrong), "seconds": time.monotonic() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="tiny-dsv3")
    ap.add_argument("--cache", type=Path, default=default_cache_dir()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = measure(args.target, args.cache)
    print(f"target {result['target']}: bf16 vs fp32 (transformers), {len(result['rows'])} snapshots, "
          f"{result['seconds']:.1f} s")
    print("| snapshot | bf16 noise (max rel. L2) | nearest wrong snapshot (min rel. L2) |")
    print("|---|---|---|")
    for r in result["rows"]:
        print(f"| {r['snapshot']} | {r['bf16_noise']:.2e} | {r['nearest_wrong']:.2f} |")
    print(f"worst noise {result['worst_noise']:.2e}, nearest wrong {result['nearest_wrong']:.2f}, "
          f"suggested tolerance (geometric mean) {result['suggested_tolerance']:.2e}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
