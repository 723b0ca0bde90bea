"""Running engines shared by the tests of one pytest process.

An engine is started on first use of its :class:`EngineConfig` and reused by
every later test with the same config.  At most ``max_alive`` engines run at
once (default 1: on a 2-core CPU machine an idle SGLang scheduler still
competes for cores), the least recently used is stopped first, and every
engine is stopped when the pool closes (session end, Ctrl-C, xdist worker
exit).  A config that failed to start fails fast for later tests with the same
error instead of waiting for another timeout.  On ``--device cuda`` every
engine of the pool runs on one block of GPUs leased for the pool's lifetime
(:mod:`pytest_eagle3.engine.lease`): leased at the first start, released by
:meth:`EnginePool.close` after its engines stopped.
"""

from __future__ import annotations

import atexit
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pytest_eagle3.engine.config import EngineConfig
from pytest_eagle3.engine.lease import GpuLeaser
from pytest_eagle3.engine.recorder_hook import RECORD_DIR_ENV
from pytest_eagle3.engine.server import SGLangServer
from pytest_eagle3.errors import Eagle3EngineError

#: A config that failed to start fails each later test with one line: the first
#: line of its error; the full error with the log tail is in the report of the
#: first test that used it.
FAILED_BEFORE = "{error} [failed earlier in this run; its log tail is in the first failing test's report]"


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
    _alive: "OrderedDict[EngineConfig, SGLangServer]" = field(default_factory=OrderedDict)
    _failed: dict[EngineConfig, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        atexit.register(self.close)

    def get(self, config: EngineConfig) -> SGLangServer:
        """A started server for ``config``.

        Raises:
            Eagle3EngineError: the server failed to start (now or earlier in this run).
        """
        if config in self._failed:
            first_line = (self._failed[config].splitlines() or [""])[0]
            raise Eagle3EngineError(FAILED_BEFORE.format(error=first_line))
        server = self._alive.get(config)
        if server is not None and server.alive:
            self._alive.move_to_end(config)
            return server
        if server is not None:  # died since last use
            self._alive.pop(config)
            server.stop()
        while len(self._alive) >= self.max_alive:
            _, oldest = self._alive.popitem(last=False)
            oldest.stop()
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
            self.progress(f"starting SGLang {config.describe()}{where} (log: {server.log_path})")
        try:
            server.start(progress=self.progress)
        except Eagle3EngineError as exc:
            self._failed[config] = str(exc)
            raise
        if self.progress:
            self.progress(f"SGLang {config.name} ready in {server.startup_seconds:.0f} s")
        self._alive[config] = server
        if self.on_start is not None:
            self.on_start(config, server)
        return server

    def record_dir(self, config: EngineConfig) -> Path:
        """Where the engine's per-rank recorder writes (``rank<r>/`` inside)."""
        return self.log_dir / f"{config.name}-record"

    def log_path(self, config: EngineConfig) -> Path:
        return self.log_dir / f"{config.name}.log"

    def close(self) -> None:
        """Stop every running engine (idempotent)."""
        while self._alive:
            _, server = self._alive.popitem()
            server.stop()
        if self.lease is not None:
            self.lease.release()
