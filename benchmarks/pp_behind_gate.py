"""What SGLang does with the captures at pipeline parallelism once its gate is lifted.

SGLang 0.5.23 refuses ``--enable-return-aux-hidden-states`` unless ``pp_size == 1``
(``srt/arg_groups/validation_hook.py:725``; ``pytest-eagle3 info --pp 2`` reads it).
This script lifts that one check, as the open upstream PRs that loosen the PP
gates would, by running ``handle_aux_hidden_state_capture`` on a view of the
server args whose ``pp_size`` reads 1 (every other check and the engine itself
see the real ``pp_size``), starts the capture-only engine on the tiny DeepSeek-V3
target at PP 2 (TP 1 per stage, on CPU, over gloo) once per id list, sends one
request asking for the captures, and prints what happened: the reply, or the
first error in the engine's log with its file and line.

    python benchmarks/pp_behind_gate.py                # ids [0, 3, 5] and [4, 5, 6]
    python benchmarks/pp_behind_gate.py --ids 1,2,3

Measured on 0.5.23 (docs/compatibility.md): ids on both stages -> the last
stage's packer raises "captured 1 of 3 aux hidden states"
(``srt/layers/aux_hidden_states.py:87``) at the first forward; ids on the last
stage only -> stage 0's scheduler fails reading the result's hidden states
(``srt/managers/scheduler_components/batch_result_processor.py:331``).  Either
way the engine dies at the first request.  Needs no GPU; about 1 minute per id list.
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

SERVE = "--serve-with-pp-capture-gate-lifted"


def _serve() -> None:
    """Run sglang.launch_server with the capture-only PP check lifted (this process only)."""
    import runpy

    import sglang.srt.arg_groups.validation_hook as vh

    original = vh.handle_aux_hidden_state_capture

    def lifted(server_args):  # noqa: ANN001, ANN202 - SGLang's own signature
        real_view = vh.resolving_view

        def view(args):  # noqa: ANN001, ANN202
            inner = real_view(args)

            class _PpOne:
                def __getattr__(self, name: str) -> object:
                    return 1 if name == "pp_size" else getattr(inner, name)

                def __setattr__(self, name: str, value: object) -> None:
                    setattr(inner, name, value)

            return _PpOne()

        vh.resolving_view = view
        try:
            return original(server_args)
        finally:
            vh.resolving_view = real_view

    vh.handle_aux_hidden_state_capture = lifted
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    runpy.run_module("sglang.launch_server", run_name="__main__")


def _run(ckpt: Path, ids: list[int], port: int, log: Path) -> str:
    from pytest_eagle3.engine.cpu.recipe import cpu_env
    from pytest_eagle3.engine.server_log import first_error

    env = dict(os.environ)
    env.update(cpu_env(2))
    cmd = [sys.executable, __file__, SERVE, "--model-path", str(ckpt), "--device", "cpu", "--pp-size", "2",
           "--tp-size", "1", "--attention-backend", "torch_native", "--disable-cuda-graph", "--dtype", "float32",
           "--disable-overlap-schedule", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096",
           "--skip-server-warmup", "--disable-radix-cache", "--skip-tokenizer-init", "--port", str(port),
           "--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
           "--return-aux-hidden-state-layer-ids", *map(str, ids)]
    def engine_error() -> str:
        text = log.read_text(errors="replace")
        at = text.find("Scheduler hit an exception")
        found = first_error(text[at:] if at >= 0 else text)
        if not found:
            return "no error in its log"
        return f"{found[0]}" + (f" at {found[1]}" if found[1] else "")

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
            return f"served: {len(rows) if rows is not None else 'no'} capture rows"
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
    if len(sys.argv) > 1 and sys.argv[1] == SERVE:
        _serve()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ids", action="append", default=None, help="an id list, e.g. 0,3,5 (repeatable)")
    ap.add_argument("--port", type=int, default=31877)
    args = ap.parse_args()
    from pytest_eagle3.settings import default_cache_dir
    from pytest_eagle3.target.checkpoint import ensure_checkpoint
    from pytest_eagle3.target.spec import TargetSpec

    ckpt = ensure_checkpoint(TargetSpec.preset("tiny-dsv3"), default_cache_dir()[0])
    lists = [[int(v) for v in s.split(",")] for s in args.ids] if args.ids else [[0, 3, 5], [4, 5, 6]]
    logs = Path(tempfile.mkdtemp(prefix="eagle3-pp-"))
    for ids in lists:
        log = logs / f"pp2-ids-{'-'.join(map(str, ids))}.log"
        print(f"PP 2, ids {ids}: {_run(ckpt, ids, args.port, log)} (log: {log})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
