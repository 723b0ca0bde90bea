"""What SGLang does with the captures at pipeline parallelism once its gate is lifted.

SGLang 0.5.23 refuses ``--enable-return-aux-hidden-states`` unless ``pp_size == 1``
(``srt/arg_groups/validation_hook.py:725``; ``pytest-eagle3 info --pp 2`` reads it).
This script starts the capture-only engine on the tiny DeepSeek-V3 target at
PP 2 (TP 1 per stage, on CPU, over gloo) with the upstream fix
``pp-capture-gate-lifted`` (that one check lifted, as the open upstream PRs that
loosen the PP gates would; :mod:`pytest_eagle3.worker.pp_relay`) or, with
``--fix pp-capture-relay``, the lift plus the fix, once per id list; sends one
request asking for the captures, and prints what happened: the reply, or the
first error in the engine's log with its file and line.

    python benchmarks/pp_behind_gate.py                # ids [0, 3, 5] and [4, 5, 6]
    python benchmarks/pp_behind_gate.py --ids 1,2,3
    python benchmarks/pp_behind_gate.py --fix pp-capture-relay

Measured on 0.5.23 (docs/compatibility.md): ids on both stages -> the last
stage's packer raises "captured 1 of 3 aux hidden states"
(``srt/layers/aux_hidden_states.py:87``) at the first forward; ids on the last
stage only -> stage 0's scheduler fails reading the result's hidden states
(``srt/managers/scheduler_components/batch_result_processor.py:331``).  Either
way the engine dies at the first request.  With ``pp-capture-relay``: both id
lists served (the prefill's captures 6 x 3H for the 6 prompt tokens, then
each decode step's).  Needs no GPU; about 1 minute per id list.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pytest_eagle3.worker.upstream_fixes import PP_LIFTS

def _shape(value: object) -> str:
    """``[[...], ...]`` -> ``"6 x 192"``."""
    dims = []
    while isinstance(value, list):
        dims.append(len(value))
        value = value[0] if value else None
    return " x ".join(map(str, dims))


def _run(ckpt: Path, ids: list[int], port: int, log: Path, fix: str) -> str:
    from pytest_eagle3.engine.cpu.recipe import cpu_env
    from pytest_eagle3.engine.server_log import startup_cause
    from pytest_eagle3.worker.env import FIX_ENV

    env = dict(os.environ)
    env.update(cpu_env(2))
    env[FIX_ENV] = fix
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(ckpt), "--device", "cpu", "--pp-size", "2",
           "--tp-size", "1", "--attention-backend", "torch_native", "--disable-cuda-graph", "--dtype", "float32",
           "--disable-overlap-schedule", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096",
           "--skip-server-warmup", "--disable-radix-cache", "--skip-tokenizer-init", "--port", str(port),
           "--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
           "--return-aux-hidden-state-layer-ids", *map(str, ids)]
    def engine_error() -> str:
        return startup_cause(log).removeprefix(": ") or "no error in its log"

    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir(),
                                start_new_session=True)
    try:
        start = time.time()
        while time.time() - start < 300:
            if proc.poll() is not None:
                time.sleep(1)
                return f"the engine exited (code {proc.returncode}) before it was healthy; its first error: {engine_error()}"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        body = {"input_ids": [5, 6, 7, 8, 9, 10], "return_hidden_states": True,
                "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            reply = json.loads(urllib.request.urlopen(req, timeout=120).read())
            rows = reply.get("meta_info", {}).get("hidden_states")
            if not rows:
                return "served, without captures"
            return "served: captures " + ", ".join(_shape(r) for r in rows) + " (prefill, then each decode step)"
        except OSError as exc:
            time.sleep(3)
            return f"the request failed ({type(exc).__name__}); the engine's first error: {engine_error()}"
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ids", action="append", default=None, help="an id list, e.g. 0,3,5 (repeatable)")
    ap.add_argument("--port", type=int, default=31877)
    ap.add_argument("--fix", default="pp-capture-gate-lifted", choices=sorted(PP_LIFTS),
                    help="the upstream fix the engine runs with (default: the lift alone)")
    args = ap.parse_args()
    from pytest_eagle3.settings import default_cache_dir
    from pytest_eagle3.target.checkpoint import ensure_checkpoint
    from pytest_eagle3.target.spec import TargetSpec

    ckpt = ensure_checkpoint(TargetSpec.preset("tiny-dsv3"), default_cache_dir()[0])
    lists = [[int(v) for v in s.split(",")] for s in args.ids] if args.ids else [[0, 3, 5], [4, 5, 6]]
    logs = Path(tempfile.mkdtemp(prefix="eagle3-pp-"))
    for ids in lists:
        log = logs / f"pp2-ids-{'-'.join(map(str, ids))}.log"
        print(f"PP 2, {args.fix}, ids {ids}: {_run(ckpt, ids, args.port, log, args.fix)} (log: {log})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
