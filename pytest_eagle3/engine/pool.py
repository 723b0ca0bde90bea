"""Running engines shared by the tests of one pytest process.

An engine is started on first use of its :class:`EngineConfig` and reused by
every later test with the same config.  At most ``max_alive`` engines run at
once (default 1: on a 2-core CPU machine an idle SGLang scheduler still
competes for cores), the least recently used is stopped first, and every
engine is stopped when the pool closes (session end, Ctrl-C, xdist worker
exit).  With ``upcoming`` (the run's engines in the order its tests use
them, from the plan), the pool starts the next engine in the background
while the current one starts and serves its tests (prefetch): engine starts
are mostly single-threaded Python imports, so on 2 cores two overlap well.  A
prefetch happens only when the free memory covers the next engine
(:data:`PREFETCH_GIB_BASE` + :data:`PREFETCH_GIB_PER_RANK` x TP, with margin),
and never on ``--device cuda`` (two engines would share the GPU memory
budget).  A config that failed to start fails fast for later tests with the same
error instead of waiting for another timeout, and a config that fails for a
cause an earlier one reported, or shares the startup path of one that failed,
gets one line pointing to that report (:mod:`pytest_eagle3.engine.start_failures`).  On ``--device cuda`` every
engine of the pool runs on one block of GPUs leased for the pool's lifetime
(:mod:`pytest_eagle3.engine.lease`): leased at the first start, released by
:meth:`EnginePool.close` after its engines stopped.
"""

from __future__ import annotations

import atexit
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from pytest_eagle3.engine.config import EngineConfig
from pytest_eagle3.engine.lease import GpuLeaser
from pytest_eagle3.worker.env import RECORD_DIR_ENV
from pytest_eagle3.engine.server import SGLangServer
from pytest_eagle3.engine import route_proof, tbo_start
from pytest_eagle3.engine.pp_start import explain_start
from pytest_eagle3.engine.start_failures import StartFailures
from pytest_eagle3.errors import Eagle3EngineError, Eagle3StartCauseSeen

#: A config that failed to start fails each later test with one line: the first
#: line of its error; the full error with the log tail is in the report of the
#: first test that used it.
FAILED_BEFORE = "SGLang engine {name} failed to start (see {who}): {error}"
#: A server that died under a request of a cause :mod:`pytest_eagle3.engine.tbo_start` names.
DIED_BEFORE = "SGLang engine {name} died under a request (see {who}): {error}"

#: Peak RSS of a CPU engine's process tree is about BASE + PER_RANK x TP GiB
#: (measured by benchmarks/bench_core.py: TP 1 3.3, TP 2 4.5, TP 4 6.8, TP 8 11.5).
PREFETCH_GIB_BASE = 2.0
PREFETCH_GIB_PER_RANK = 1.2
#: Free memory must exceed the next engine's estimate by this factor to prefetch it.
PREFETCH_MARGIN = 1.5


@dataclass
class EnginePool:
    """Start-once, reuse-many SGLang servers keyed by :class:`EngineConfig`."""

    log_dir: Path
    startup_timeout: float = 600.0
    max_alive: int = 1
    progress: Callable[[str], None] | None = None
    #: Called with ``(config, server)`` after each successful start.
    on_start: Callable[[EngineConfig, SGLangServer], None] | None = None
    #: ``--device cuda``: this process's GPU block, leased at the first start and
    #: released by :meth:`close` (``None`` on cpu: no lease).
    lease: "GpuLeaser | None" = None
    #: The run's engines in the order its tests use them (prefetch); empty: no prefetch.
    upcoming: Sequence[EngineConfig] = ()
    #: Results of deterministic runs and of engine facts, shared by the tests that
    #: read them (the capture runner's speculative decoding, ``/server_info``),
    #: for the pool's lifetime.
    results: dict = field(default_factory=dict)
    _alive: "OrderedDict[EngineConfig, SGLangServer]" = field(default_factory=OrderedDict)
    _starting: dict[EngineConfig, SGLangServer] = field(default_factory=dict)
    _failed: dict[EngineConfig, tuple[str, str]] = field(default_factory=dict)
    #: Start failures by cause (one failure per root cause; the terminal summary).
    start_failures: StartFailures = field(default_factory=StartFailures)
    #: Every config asked for, in order (with :attr:`upcoming`: the run's configurations).
    requested: list[EngineConfig] = field(default_factory=list)
    #: The installed SGLang's package folder: a failed start at PP or under two-batch overlap
    #: is read against its code (:mod:`pytest_eagle3.engine.pp_start`, :mod:`pytest_eagle3.engine.tbo_start`).
    sglang_location: str | None = None
    #: The test each live server was last handed to (named when it died under that test).
    _served_by: dict[EngineConfig, str] = field(default_factory=dict)
    #: Names of failed configs whose error is already a one-line pointer to another's report.
    _pointers: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        atexit.register(self.close)

    def get(self, config: EngineConfig, who: str | None = None) -> SGLangServer:
        """A started server for ``config``; ``who`` (a test id) is named to later
        tests when this start fails.

        Raises:
            Eagle3EngineError: the server failed to start (now or earlier in this run).
        """
        if config not in self.requested:
            self.requested.append(config)
        if config in self._failed:
            error, first = self._failed[config]
            if config.name in self._pointers:  # already one line pointing to the first report
                raise Eagle3StartCauseSeen(error)
            first_line = (error.splitlines() or [""])[0]
            raise Eagle3StartCauseSeen(FAILED_BEFORE.format(name=config.name, who=first, error=first_line))
        skip = self.start_failures.skip(config)
        if skip is not None:
            self._failed[config] = (skip, who or "the first test that used it")
            self._pointers.add(config.name)
            raise Eagle3StartCauseSeen(skip)
        server = self._alive.get(config)
        if server is not None and server.alive:
            self._alive.move_to_end(config)
            self._served_by[config] = who or "an earlier test"
            return server
        if server is not None:  # died since last use
            self._alive.pop(config)
            server.stop()
            died = getattr(server, "exit_explanation", None)
            if died is not None:  # a known root cause: one failure, not a restart each
                cause, line = died
                first = self._served_by.get(config, "an earlier test")
                pointer = DIED_BEFORE.format(name=config.name, who=first, error=line.splitlines()[0])
                self._failed[config] = (pointer, first)
                self._pointers.add(config.name)
                self.start_failures.record(config, cause, first)
                raise Eagle3StartCauseSeen(pointer)
        while len(self._alive) >= self.max_alive:
            _, oldest = self._alive.popitem(last=False)
            oldest.stop()
        # A prefetched server that died while starting fails in wait_ready, with its log.
        prefetched = self._starting.pop(config, None)
        while self._starting:  # prefetched for a test that did not come: it would only compete
            _, unused = self._starting.popitem()
            unused.stop()
        server = prefetched or self._spawn(config)
        self._prefetch_after(config, starting=prefetched is None)
        t0 = time.monotonic()
        try:
            server.wait_ready(progress=self.progress)
        except Eagle3EngineError as exc:
            who = who or "the first test that used it"
            explained = self._explain(config, exc.cause, server)
            if explained is not None:
                exc = Eagle3EngineError(f"{explained[1]}\n{exc}", cause=explained[0])
            self._failed[config] = (str(exc), who)
            line = self.start_failures.record(config, exc.cause, who)
            for blocked in [c for c in self._starting if self.start_failures.blocked(c) is not None]:
                self._starting.pop(blocked).stop()  # prefetched, and would fail the same way
            if line is not None:
                self._failed[config] = (line, who)
                self._pointers.add(config.name)
                raise Eagle3StartCauseSeen(line, cause=exc.cause) from None
            raise exc
        if self.progress:
            waited = f" (prefetched: this run waited {time.monotonic() - t0:.0f} s for it)" if prefetched else ""
            self.progress(f"SGLang {config.name} ready in {server.startup_seconds:.0f} s{waited}")
        self._alive[config] = server
        self._served_by[config] = who or "the first test that used it"
        if self.on_start is not None:
            self.on_start(config, server)
        return server

    def _spawn(self, config: EngineConfig, *, background: bool = False) -> SGLangServer:
        env = {**config.env_dict(), RECORD_DIR_ENV: str(self.record_dir(config))}
        args = config.args()
        if self.lease is not None:
            # CUDA_VISIBLE_DEVICES and nccl_port of this process's block (engine/lease.py).
            lease_args, lease_env = self.lease.engine_overrides()
            args.update(lease_args)
            env.update(lease_env)
        server = SGLangServer(
            config.name, args, env=env, log_dir=self.log_dir,
            startup_timeout=self.startup_timeout,
        )
        if self.progress:
            where = f" on {self.lease.describe()}" if self.lease is not None else ""
            when = " in the background (the next engine of this run)" if background else ""
            self.progress(f"starting SGLang {config.describe()}{where}{when} (log: {server.log_path})")
        server.explain_exit = lambda cause, log_text: self._explain(config, cause, server, log_text)
        return server.spawn()

    def _explain(self, config: EngineConfig, cause: str | None, server: SGLangServer,
                 log_text: str | None = None) -> tuple[str, str] | None:
        """``(cause key, line)`` naming why ``server`` died (:mod:`pytest_eagle3.engine.pp_start`,
        :mod:`pytest_eagle3.engine.tbo_start`, :mod:`pytest_eagle3.engine.route_proof`), or ``None``; never raises: the error it would
        explain must reach the test as it is."""
        try:
            explained = explain_start(config, cause, self.sglang_location)
            args = dict(config.server_args)
            if explained is None and cause and args.get("enable_two_batch_overlap"):
                text = log_text if log_text is not None else server.start_log()
                explained = tbo_start.explain_start(config, cause, text, self.sglang_location)
            if explained is None and cause and args.get("enable_attn_tp_input_scattered"):
                text = log_text if log_text is not None else server.start_log()
                explained = route_proof.explain_death(args, cause, text, config.tp)
            return explained
        except Exception:  # noqa: BLE001
            return None

    def _prefetch_after(self, config: EngineConfig, *, starting: bool = True) -> None:
        """Spawn the engine that follows ``config`` in :attr:`upcoming`, if any,
        not running, not failed, and the free memory covers it (and ``config``
        too when it was only just spawned: it has not allocated yet)."""
        if self.lease is not None or self._starting or config not in self.upcoming:
            return
        i = list(self.upcoming).index(config)
        nxt = next((c for c in list(self.upcoming)[i + 1:] if c != config), None)
        if (nxt is None or nxt in self._alive or nxt in self._starting or nxt in self._failed
                or self.start_failures.blocked(nxt) is not None):
            return
        if not enough_memory_for(nxt.tp, also=config.tp if starting else 0):
            return
        draft = dict(nxt.server_args).get("speculative_draft_model_path")
        if draft and not (Path(str(draft)) / "config.json").is_file():
            return  # its test builds the draft first (a cold cache): SGLang would not find it
        self._starting[nxt] = self._spawn(nxt, background=True)

    def configurations(self) -> int:
        """How many engine configurations this run has: the planned ones
        (:attr:`upcoming`) and every one asked for."""
        return len(set(self.upcoming) | set(self.requested))

    def record_dir(self, config: EngineConfig) -> Path:
        """Where the engine's per-rank recorder writes (``rank<r>/`` inside)."""
        return self.log_dir / f"{config.name}-record"

    def log_path(self, config: EngineConfig) -> Path:
        return self.log_dir / f"{config.name}.log"

    def close(self) -> None:
        """Stop every running engine (idempotent)."""
        while self._starting:
            _, server = self._starting.popitem()
            server.stop()
        while self._alive:
            _, server = self._alive.popitem()
            server.stop()
        if self.lease is not None:
            self.lease.release()


def engine_gib(tp: int) -> float:
    """Estimated peak RSS of a CPU engine's process tree at ``tp`` (GiB)."""
    return PREFETCH_GIB_BASE + PREFETCH_GIB_PER_RANK * tp


def enough_memory_for(tp: int, *, also: int = 0) -> bool:
    """Whether the free memory covers one more CPU engine at ``tp``, plus an
    engine at ``also`` that is starting and has not allocated yet (0: none),
    with :data:`PREFETCH_MARGIN`."""
    need = (engine_gib(tp) + (engine_gib(also) if also else 0.0)) * PREFETCH_MARGIN * 2**30
    return available_bytes() >= need


def available_bytes() -> int:
    """Memory this process tree may still use: the host's available memory, or
    less under a cgroup v2 limit (a CI container)."""
    import psutil

    free = int(psutil.virtual_memory().available)
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
    except (OSError, ValueError):
        return free
    if limit.isdigit():
        free = min(free, int(limit) - used)
    return free
