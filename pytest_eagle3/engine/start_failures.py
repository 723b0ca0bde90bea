"""One failure per root cause of failed engine starts.

A fork whose engines cannot start on a tier (one ``TypeError`` in its MoE layer
while the model is built) fails every engine configuration of a run the same
way.  :class:`StartFailures` keeps the run's start failures by cause, so that:

* the first configuration that fails with a cause reports it in full (the
  error with the log tail, :data:`pytest_eagle3.engine.server.STARTUP_FAILED`);
* a later configuration failing with the same cause gets one line naming it and
  the test that shows it (:data:`SAME_CAUSE`);
* a configuration that shares its startup path with one that already failed is
  not started again to find out (:data:`SAME_PATH`);
* the run ends with one line per cause (:meth:`StartFailures.summary_lines`):
  "SGLang could not start on this tier: <cause>, in N of M engine configurations".

The cause is the first exception of the engine's log and the deepest SGLang
frame it passed (:func:`pytest_eagle3.engine.server_log.first_error`): its type,
message and ``file:line``.

The startup path (:func:`startup_path`) is the configuration without the
server arguments SGLang reads only after the model is built and the memory
pools are sized: the aux layer ids to capture, the radix cache switch and the
chunked-prefill size (every engine runs with ``--skip-server-warmup``, so no
forward runs before ``/health`` answers).  Two configurations with the same
startup path run the same code up to the point where a start can fail.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_eagle3.engine.config import EngineConfig

#: Server arguments read only after the model is built (see the module docstring).
AFTER_STARTUP_ARGS = frozenset({
    "return_aux_hidden_state_layer_ids", "disable_radix_cache", "chunked_prefill_size",
})

SAME_CAUSE = (
    "SGLang engine {name} failed to start with the cause {first} already reported: {cause} "
    "(full error and log tail: {who})"
)
SAME_PATH = (
    "SGLang engine {name} was not started: it differs from {first}, which failed to start with "
    "{cause}, only in server arguments read after the model is built ({args}); "
    "full error and log tail: {who}"
)
SUMMARY = "SGLang could not start on this tier: {cause}, in {failed} of {total} engine configurations"
SUMMARY_NOT_STARTED = "  {count} of them not started: same startup path as one that failed"
SUMMARY_FIRST = "  full error and log tail: {who}"


def startup_path(config: "EngineConfig") -> tuple:
    """``config`` without :data:`AFTER_STARTUP_ARGS`: equal for configurations that
    run the same code until the server answers ``/health``."""
    # At PP with SGLang's checks lifted, which stage holds the ids decides whether the first
    # forward fails (engine/pp_start.py): the ids are part of the startup path there.
    pp = int(dict(config.server_args).get("pp_size") or 1)
    after = AFTER_STARTUP_ARGS - {"return_aux_hidden_state_layer_ids"} if pp > 1 else AFTER_STARTUP_ARGS
    args = tuple((k, v) for k, v in config.server_args if k not in after)
    return (config.model_path, config.tp, config.device, args, config.env)


@dataclass
class StartFailure:
    """One cause of failed starts and the configurations it stopped.

    Attributes:
        cause: ``"TypeError: ... (sglang/srt/x.py:12)"``.
        first: name of the first configuration that failed with it.
        who: the test that reported it in full.
        failed: names of the configurations that failed to start with it.
        not_started: names of the configurations not started (same startup path).
    """

    cause: str
    first: str
    who: str
    failed: list[str] = field(default_factory=list)
    not_started: list[str] = field(default_factory=list)


@dataclass
class StartFailures:
    """The run's start failures by cause (one per pytest process)."""

    by_cause: dict[str, StartFailure] = field(default_factory=dict)
    _paths: dict[tuple, StartFailure] = field(default_factory=dict)
    #: startup path -> the server args of the configuration that failed on it.
    _failed_args: dict[tuple, dict] = field(default_factory=dict)

    def blocked(self, config: "EngineConfig") -> StartFailure | None:
        """The failure of a configuration with the same startup path, or ``None``."""
        return self._paths.get(startup_path(config))

    def skip(self, config: "EngineConfig") -> str | None:
        """One line (:data:`SAME_PATH`) when ``config`` need not start, else ``None``;
        records it under that cause."""
        failure = self.blocked(config)
        if failure is None:
            return None
        if config.name not in failure.not_started and config.name not in failure.failed:
            failure.not_started.append(config.name)
        theirs, mine = self._failed_args.get(startup_path(config), {}), dict(config.server_args)
        differ = sorted(k for k in AFTER_STARTUP_ARGS if theirs.get(k) != mine.get(k))
        return SAME_PATH.format(name=config.name, first=failure.first, cause=failure.cause,
                                args=", ".join(differ) or "none", who=failure.who)

    def record(self, config: "EngineConfig", cause: str | None, who: str) -> str | None:
        """Note that ``config`` failed to start with ``cause``; returns the one line
        (:data:`SAME_CAUSE`) when an earlier configuration already reported that
        cause, ``None`` when this is its first report (the caller raises the full error).
        A ``None`` cause (no traceback in the log: a timeout, a kill) is never merged."""
        if not cause:
            return None
        failure = self.by_cause.get(cause)
        if failure is None:
            failure = self.by_cause[cause] = StartFailure(cause, config.name, who)
            failure.failed.append(config.name)
            self._paths.setdefault(startup_path(config), failure)
            self._failed_args.setdefault(startup_path(config), dict(config.server_args))
            return None
        if config.name not in failure.failed:
            failure.failed.append(config.name)
        self._paths.setdefault(startup_path(config), failure)
        self._failed_args.setdefault(startup_path(config), dict(config.server_args))
        return SAME_CAUSE.format(name=config.name, first=failure.first, cause=cause, who=failure.who)

    def summary_lines(self, total: int) -> list[str]:
        """One line per cause: :data:`SUMMARY`, then how many were not started and
        where the full error is.  ``total``: the run's engine configurations."""
        lines = []
        for failure in self.by_cause.values():
            stopped = len(failure.failed) + len(failure.not_started)
            lines.append(SUMMARY.format(cause=failure.cause, failed=stopped, total=max(total, stopped)))
            if failure.not_started:
                lines.append(SUMMARY_NOT_STARTED.format(count=len(failure.not_started)))
            lines.append(SUMMARY_FIRST.format(who=failure.who))
        return lines
