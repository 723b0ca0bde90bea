"""Time the core stages of a pytest-eagle3 CPU run and print them as a table.

Each stage goes through the package functions the suite itself uses:

1. checkpoint: the ``torch``/``safetensors`` import overhead, then ``ensure_checkpoint``
   of the default CPU preset (cold in a fresh cache);
2. reference: ``ensure_reference`` for the suite prompts (cold: the transformers worker runs);
3. the SGLang flag probe, then per TP size an engine built as the suite builds it
   (``capture_server_args`` with the every-TP case's ids, ``build_engine_config``,
   ``SGLangServer``): start time, one ``capture()`` call over all suite prompts, stop
   time, and the peak RSS summed over the server's process tree (psutil, every 0.5 s);
4. acceptance, per TP size and per draft (``--drafts``; default the preset's shipped
   draft; ``tiny-dsv3-mla``, ``tiny-dsv3-mla-fc-norm``, ``tiny-dsv3-mla-norm-output``
   are SGLang's MLA draft layout): the draft's load and validation
   (``validate_draft``, ``load_examples``), the EAGLE-3 speculative-decoding
   engine start (the config the acceptance test uses: ``capture.api.engine_config``
   with ``draft=``), and the acceptance run (greedy speculative decoding of the
   draft's learnt prompts, ``capture_draft_path``) with its accept length;
5. the main job: ``python -m pytest --pyargs pytest_eagle3.suite --tp 2
   -p no:cacheprovider --eagle3-cache <cache>`` with the cache warmed above (~5 min),
   once per ``--main-job-paths`` entry (``inplace``, ``native``: SGLang's norm path;
   ``fused``: the all-reduce fusion path; ``pp2``: every engine at pipeline
   parallelism 2 with ``PYTEST_EAGLE3_UPSTREAM_FIX=pp-capture-relay``), one after the other; or, with
   ``--main-job-first-and-warm``, on a new empty cache (a new machine's first
   run) and again on that cache (warm).  Each main job reports its engine starts,
   their summed start time and how long the tests waited for engines (from the
   run's ``[eagle3] SGLang ... ready in`` lines).

Run from the repository root in the dev environment, e.g.
``python benchmarks/bench_core.py --tp 1 2 4 8 --json /tmp/bench.json``.
A fresh temp cache is deleted at the end; server logs are kept. The load average
before and after is recorded: other work on the machine skews the times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from pytest_eagle3.target.checkpoint.cache import cache_key
from pytest_eagle3.plugin.validate import check_tp_divides
from pytest_eagle3.settings import DEFAULT_TARGETS, TP_CHOICES
from pytest_eagle3.target.spec import TargetSpec, load_packaged_prompts
from pytest_eagle3.worker.env import FIX_ENV

REPO = Path(__file__).resolve().parent.parent
MAIN_JOB_TP = 2
GB = 1024**3


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@contextmanager
def heartbeat(label: str, every: float = 15.0) -> Iterator[None]:
    """Print ``label: N s`` every ``every`` seconds while the block runs."""
    done, t0 = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            log(f"{label}: {time.monotonic() - t0:.0f} s")

    (thread := threading.Thread(target=beat, daemon=True)).start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class TreeRSS(threading.Thread):
    """Peak of the RSS summed over a process tree (root pid from ``get_pid``)."""

    def __init__(self, get_pid: Callable[[], int | None], interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.get_pid, self.interval = get_pid, interval
        self.peak_bytes, self.peak_procs = 0, 0
        self._done = threading.Event()

    def run(self) -> None:
        import psutil

        while not self._done.is_set():
            pid = self.get_pid()
            if pid is not None:
                try:
                    root = psutil.Process(pid)
                    procs = [root, *root.children(recursive=True)]
                except psutil.Error:
                    procs = []
                total = sum(_rss(proc) for proc in procs)
                if total > self.peak_bytes:
                    self.peak_bytes, self.peak_procs = total, len(procs)
            self._done.wait(self.interval)

    def finish(self) -> None:
        self._done.set()
        self.join()


def _rss(proc: Any) -> int:
    try:
        return int(proc.memory_info().rss)
    except Exception:  # noqa: BLE001 - the process exited between listing and reading
        return 0


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def wide_case_ids(spec: TargetSpec, version: Any) -> list[int] | None:
    """Ids of the suite's every-TP case (embedding first), from the suite's own cases."""
    from pytest_eagle3.planning import cases

    ids = cases.resolve(cases.WIDE_CASE, spec.facts.num_layers, spec.facts.hidden_size, version).ids
    return None if ids is None else list(ids)


def bench_engine(install: Any, ckpt: Path, prompts: list[list[int]], spec: TargetSpec, tp: int,
                 log_dir: Path, timeout: float) -> dict[str, Any]:
    from pytest_eagle3.capture.api import capture, capture_server_args
    from pytest_eagle3.engine.config import build_engine_config
    from pytest_eagle3.engine.server import SGLangServer
    from pytest_eagle3.errors import Eagle3Error

    keys = ("start_s", "capture_s", "stop_s", "peak_rss_bytes", "peak_procs", "log", "error")
    row: dict[str, Any] = {"tp": tp, **dict.fromkeys(keys)}
    problem = check_tp_divides(tp, spec.facts.num_attention_heads)
    if problem:
        row["error"] = problem
        return row
    ids = wide_case_ids(spec, install.id_rule(spec.facts.architecture))
    config = build_engine_config(install, model_path=str(ckpt), tp=tp, device="cpu",
                                 test_args=capture_server_args(install, ids))
    server = SGLangServer(config.name, config.args(), env=config.env_dict(), log_dir=log_dir,
                          startup_timeout=timeout)
    row["log"] = str(server.log_path)
    sampler = TreeRSS(lambda: server.proc.pid if server.proc is not None else None)
    log(f"engine tp{tp}: starting {config.describe()} ids={ids} (log: {server.log_path})")
    sampler.start()
    try:
        server.start(progress=log)
        row["start_s"] = server.startup_seconds
        log(f"engine tp{tp}: ready in {server.startup_seconds:.1f} s; capturing {len(prompts)} prompts")
        caps, row["capture_s"] = timed(lambda: capture(server, prompts))
        if len(caps) != len(prompts):
            row["error"] = f"{len(caps)} captures for {len(prompts)} prompts"
    except Eagle3Error as exc:
        row["error"] = str(exc).splitlines()[0]
        log(f"engine tp{tp}: FAILED: {row['error']}")
    finally:
        _, row["stop_s"] = timed(server.stop)
        sampler.finish()
        row["peak_rss_bytes"], row["peak_procs"] = sampler.peak_bytes, sampler.peak_procs
    log(f"engine tp{tp}: stopped; peak tree RSS {sampler.peak_bytes / GB:.2f} GiB")
    return row


def bench_acceptance(install: Any, ckpt: Path, spec: TargetSpec, preset: str, tp: int, log_dir: Path,
                     timeout: float) -> dict[str, Any]:
    """Draft load, speculative-decoding engine start and acceptance run at ``tp`` for the
    shipped draft ``preset`` (``fixtures/drafts/<preset>``)."""
    from pytest_eagle3.capture.api import engine_config
    from pytest_eagle3.capture.draft_path import capture_draft_path
    from pytest_eagle3.capture.spec_metrics import aggregate
    from pytest_eagle3.draft import shipped_draft_dir, validate_draft
    from pytest_eagle3.draft.power import load_examples
    from pytest_eagle3.engine.server import SGLangServer
    from pytest_eagle3.errors import Eagle3Error
    from pytest_eagle3.settings import Settings

    row: dict[str, Any] = dict.fromkeys(("draft_load_s", "start_s", "run_s", "tokens", "verifies",
                                         "accept_length", "log", "error"))
    row["tp"] = tp
    row["draft"] = preset
    draft = shipped_draft_dir(preset)

    def load() -> Any:
        validate_draft(draft, spec.facts.hidden_size, spec.facts.vocab_size)
        return load_examples(draft)

    try:
        examples, row["draft_load_s"] = timed(load)
    except Eagle3Error as exc:
        row["error"] = str(exc).splitlines()[0]
        return row
    config = engine_config(install, Settings(tp=tp, device="cpu"), model_path=str(ckpt), tp=tp,
                           ids=None, facts=spec.facts, draft=str(draft))
    server = SGLangServer(config.name, config.args(), env=config.env_dict(), log_dir=log_dir,
                          startup_timeout=timeout)
    row["log"] = str(server.log_path)
    log(f"acceptance tp{tp}: starting {config.describe()} (log: {server.log_path})")
    try:
        server.start(progress=log)
        row["start_s"] = server.startup_seconds
        log(f"acceptance tp{tp}: ready in {server.startup_seconds:.1f} s; decoding {len(examples)} prompts")

        def run() -> list[Any]:
            out: list[Any] = []
            for e in examples:
                out += capture_draft_path(server, [list(e.prompt)], decode_steps=max(0, len(e.continuation) - 1))
            return out

        runs, row["run_s"] = timed(run)
        total = aggregate([r.metrics for r in runs])
        row.update(tokens=total.completion_tokens, verifies=total.verify_count,
                   accept_length=round(total.accept_length, 3))
    except Eagle3Error as exc:
        row["error"] = str(exc).splitlines()[0]
        log(f"acceptance tp{tp}: FAILED: {row['error']}")
    finally:
        server.stop()
    return row


#: ``--main-job-paths`` values -> the suite flags that select the path.
MAIN_JOB_PATHS = {
    "default": (),
    "inplace": ("--eagle3-cpu-norm", "inplace"),
    "native": ("--eagle3-cpu-norm", "native"),
    "fused": ("--eagle3-cpu-allreduce-fusion",),
    # The default run with, and explicitly without, the next engine started in the background.
    "prefetch": ("--eagle3-prefetch",),
    "no-prefetch": ("--eagle3-no-prefetch",),
    # Pipeline parallelism 2 (every engine: TP x 2 processes), with SGLang's PP checks
    # lifted and each stage's captures relayed to the last (MAIN_JOB_ENV).
    "pp2": ("--eagle3-pp", "2"),
}
#: ``--main-job-paths`` values -> environment the main job adds.
MAIN_JOB_ENV = {"pp2": {FIX_ENV: "pp-capture-relay"}}


READY = re.compile(r"\[eagle3\] SGLang (\S+) ready in (\d+) s(?: \(prefetched: this run waited (\d+) s for it\))?")


def engine_stats(lines: list[str]) -> dict[str, Any]:
    """From the main job's progress lines: engine starts, their summed start time,
    and how long the tests waited for engines (a prefetched engine's wait; the
    whole start of one that was not prefetched), in seconds."""
    starts = [(m.group(1), int(m.group(2)), m.group(3)) for line in lines if (m := READY.search(line))]
    return {"engine_starts": len(starts), "start_s_sum": sum(s for _, s, _ in starts),
            "wait_s_sum": sum(int(w) if w is not None else s for _, s, w in starts),
            "engines": [name for name, _, _ in starts]}


def run_main_job(cache: Path, path: str = "default", label: str = "") -> dict[str, Any]:
    # Verbosity 0 (not -q): the progress lines say when each engine was ready.
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "pytest_eagle3.suite", "--tp",
           str(MAIN_JOB_TP), "-p", "no:cacheprovider", "--eagle3-cache", str(cache),
           *MAIN_JOB_PATHS[path]]
    log("main job: $ " + " ".join(cmd))
    lines: list[str] = []
    t0 = time.perf_counter()
    with heartbeat("main job running", every=30):
        # From the checkout whose pytest_eagle3 this script imported (PYTHONPATH=<other
        # checkout> times that one's main job: before/after a change).
        import pytest_eagle3

        checkout = Path(pytest_eagle3.__file__).resolve().parent.parent
        proc = subprocess.Popen(cmd, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", env={**os.environ, **MAIN_JOB_ENV.get(path, {})})
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            print("    | " + line.rstrip(), flush=True)
        rc = proc.wait()
    summary = next((ln.strip("= ") for ln in reversed(lines) if ln.strip()), "")
    return {"seconds": time.perf_counter() - t0, "returncode": rc, "summary": summary,
            "command": cmd, "skipped": False, "path": path, "label": label, **engine_stats(lines)}


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(r: dict[str, Any]) -> None:
    rows = [
        ("checkpoint import (torch)", r["checkpoint"]["import_s"], "import torch, safetensors.torch"),
        ("checkpoint build" + (" (cold)" if r["checkpoint"]["cold"] else " (warm)"),
         r["checkpoint"]["build_s"], f"{r['preset']} -> ensure_checkpoint"),
        ("reference" + (" (cold)" if r["reference"]["cold"] else " (warm)"),
         r["reference"]["seconds"], f"{r['reference']['prompts']} prompts, float32, subprocess"),
        ("sglang probe" + (" (cold)" if r["probe"]["cold"] else " (warm)"), r["probe"]["seconds"],
         f"sglang {r['probe']['version']}, launch_server --help"),
    ]
    for e in r["engines"]:
        rss = "-" if not e["peak_rss_bytes"] else f"{e['peak_rss_bytes'] / GB:.2f} GiB"
        note = f"peak tree RSS {rss} ({e['peak_procs']} procs), stop {fmt(e['stop_s'])} s"
        rows.append((f"engine start tp{e['tp']}", e["start_s"], e["error"] or note))
        rows.append((f"capture tp{e['tp']}", e["capture_s"], f"{r['reference']['prompts']} prompts"))
    for a in r.get("acceptance", []):
        d = a.get("draft", "")
        rows.append((f"draft load tp{a['tp']}", a["draft_load_s"], f"{d}: validate_draft + continuations.json"))
        rows.append((f"spec engine start tp{a['tp']}", a["start_s"], a["error"] or f"EAGLE-3, {d}"))
        rows.append((f"acceptance run tp{a['tp']}", a["run_s"],
                     f"{a['tokens']} tokens, {a['verifies']} verifies, accept length {a['accept_length']}"))
    for m in r.get("main_jobs") or [r["main_job"]]:
        path = "" if m.get("path", "default") == "default" else f", {m['path']}"
        label = f", {m['label']}" if m.get("label") else ""
        rows.append((f"main job (suite --tp {MAIN_JOB_TP}{path}{label})", m["seconds"],
                     "skipped" if m["skipped"] else f"rc {m['returncode']}: {m['summary']}"))
        if not m["skipped"]:
            rows.append(("  engines", m.get("start_s_sum"),
                         f"{m.get('engine_starts')} starts (summed start time); tests waited "
                         f"{m.get('wait_s_sum')} s for engines"))
    print(f"\n{'stage':<30} {'time_s':>8}  notes")
    print("-" * 78)
    for name, secs, note in rows:
        print(f"{name:<30} {fmt(secs):>8}  {note}")
    print(f"\nload average before {r['loadavg_before']}, after {r['loadavg_after']}; "
          f"{r['cpus']} CPUs; cache {r['cache_dir']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2], choices=TP_CHOICES,
                    help="TP sizes to start engines for (default: 1 2)")
    ap.add_argument("--cache", type=Path, default=None,
                    help="eagle3 cache dir (default: a fresh temp dir, deleted at the end)")
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--skip-main-job", action="store_true", help="skip the ~5 min suite run")
    ap.add_argument("--drafts", nargs="+", default=None, metavar="NAME",
                    help="shipped drafts (fixtures/drafts/NAME) to time the acceptance stages of "
                    "(default: the preset's own)")
    ap.add_argument("--startup-timeout", type=float, default=600.0, help="per engine (s)")
    ap.add_argument("--main-job-paths", nargs="+", default=["default"], choices=sorted(MAIN_JOB_PATHS),
                    help="run the main job once per path, one after the other: SGLang's in-place or native "
                    "norms (--eagle3-cpu-norm), or the fused all-reduce (--eagle3-cpu-allreduce-fusion); "
                    "default: the suite's defaults")
    ap.add_argument("--main-job-first-and-warm", action="store_true",
                    help="run the main job on a new, empty cache (a new machine's first run: checkpoint, "
                    "reference, flag probe and drafts built inside the run), then again on that cache (warm)")
    ap.add_argument("--main-job-only", action="store_true",
                    help="skip the engine and acceptance stages (the checkpoint and reference are still built)")
    opts = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-"))
    cache = opts.cache.expanduser().absolute() if opts.cache else work / "cache"
    log_dir = work / "sglang-logs"
    preset = DEFAULT_TARGETS["cpu"]
    r: dict[str, Any] = {
        "schema": 1, "preset": preset, "cache_dir": str(cache), "python": sys.executable,
        "cpus": len(os.sched_getaffinity(0)), "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "loadavg_after": None, "tp": opts.tp,
    }
    log(f"cache {cache}; logs {log_dir}; load average {r['loadavg_before']}")
    try:
        from pytest_eagle3.target.checkpoint import check_entry, ensure_checkpoint, entry_dir

        spec = TargetSpec.preset(preset)
        cold = check_entry(entry_dir(spec, cache), cache_key(spec)) is not None
        log("checkpoint: importing torch")
        _, import_s = timed(lambda: (__import__("torch"), __import__("safetensors.torch")))
        log(f"checkpoint: building {preset} ({'cold' if cold else 'warm'})")
        with heartbeat("checkpoint build"):
            ckpt, build_s = timed(lambda: ensure_checkpoint(spec, cache))
        r["checkpoint"] = {"import_s": import_s, "build_s": build_s, "cold": cold, "path": str(ckpt)}

        from pytest_eagle3.target.reference import ensure_reference, reference_path

        prompts = load_packaged_prompts(vocab_size=spec.facts.vocab_size)
        cold = not reference_path(ckpt, prompts).is_file()
        log(f"reference: {len(prompts)} prompts ({'cold' if cold else 'warm'})")
        with heartbeat("reference"):
            _, ref_s = timed(lambda: ensure_reference(ckpt, prompts))
        r["reference"] = {"seconds": ref_s, "cold": cold, "prompts": len(prompts)}

        from pytest_eagle3.sglang_source.install import probe

        cold = not (cache / "sglang-flags").is_dir()
        log(f"sglang: probing flags ({'cold: launch_server --help' if cold else 'warm'})")
        install, probe_s = timed(lambda: probe(cache))
        r["probe"] = {"seconds": probe_s, "version": install.version, "cold": cold}
        r["engines"] = [] if opts.main_job_only else [
            bench_engine(install, ckpt, prompts, spec, tp, log_dir, opts.startup_timeout) for tp in opts.tp]

        r["acceptance"] = [] if opts.main_job_only else [
            bench_acceptance(install, ckpt, spec, draft, tp, log_dir, opts.startup_timeout)
            for draft in (opts.drafts or [preset]) for tp in opts.tp]

        if opts.skip_main_job:
            r["main_job"] = {"seconds": None, "returncode": None, "summary": None,
                             "command": None, "skipped": True}
        elif opts.main_job_first_and_warm:
            first_cache = work / "first-run-cache"
            r["main_jobs"] = [run_main_job(first_cache, "default", "first run, empty cache"),
                              run_main_job(first_cache, "default", "warm")]
        else:
            r["main_jobs"] = [run_main_job(cache, path) for path in opts.main_job_paths]
    finally:
        if opts.cache is None:
            shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(work / "first-run-cache", ignore_errors=True)
    r["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print_table(r)
    if opts.json:
        opts.json.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        log(f"wrote {opts.json}")
    failed = any(e["error"] for e in r["engines"] + r["acceptance"]) or any(
        m["returncode"] not in (0, None) for m in r.get("main_jobs") or [r["main_job"]])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
