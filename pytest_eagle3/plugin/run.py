"""The run object: everything one pytest run of pytest-eagle3 holds, under one stash key.

:class:`Eagle3Run` is created on first use (:func:`get_run`, the short spellings
are recorded before ``pytest_configure``), gets its settings in
``pytest_configure`` and is registered there as the plugin ``eagle3-session``,
stored under :data:`RUN_KEY` in ``config.stash``.  Hooks and fixtures read the
run's state from it: settings, the short spellings another option had, what
collection read (installed SGLang, target facts), the tests left out, the
engines started, the logs shown, ``-n`` before plan mode switched xdist off,
the bisect verdict, and the run's plugin parts (bisect, report, figures, diagnosis).

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.plugin.resolve import resolve_settings
from pytest_eagle3.plugin.spellings import TakenSpelling
from pytest_eagle3.plugin.validate import check_tp_divides
from pytest_eagle3.settings import Settings
from pytest_eagle3.sglang_source import install as sglang_install
from pytest_eagle3.target.spec import resolve_target

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.target.spec import TargetFacts

#: Name the run object is registered under as a plugin.
RUN_PLUGIN = "eagle3-session"
SUMMARY_TITLE = "eagle3 engines"
LEFT_OUT_TITLE = "eagle3 left out (not generated: this run cannot execute them; -v lists them)"
LEFT_OUT_LINE = "{count} left out: {reason}"
SUMMARY_LINE = "{description}: ready in {seconds:.1f} s"
START_FAILURES_TITLE = "eagle3 engines that could not start"


@dataclass
class EngineRecord:
    """One engine start, for the run summary."""

    description: str
    start_seconds: float
    log_path: Path | None = None
    nodeid: str | None = None


@dataclass(eq=False)  # identity hash: pytest keeps registered plugins in sets and dicts
class Eagle3Run:
    """One pytest run of pytest-eagle3; registered as a plugin named ``eagle3-session``.

    Attributes:
        config: the run's pytest config.
        settings: resolved in ``pytest_configure`` (:func:`get_settings` resolves
            them unvalidated when asked earlier).
        taken: the short spellings another option already had (report header).
        engines: every engine that became ready, in order (terminal summary, JSON report).
        shown_logs: log path -> ``((size, mtime_ns), nodeid)`` of the last failure
            its tail was shown for.
        left_out: reason -> test ids left out at collection (this run cannot execute them).
        context: ``(installed SGLang, target facts)`` read for collection
            (:meth:`collect_context`); ``None`` until read.
        xdist_workers: ``-n`` as xdist resolved it, before plan mode switched xdist off.
        bisect_result: ``--eagle3-bisect``'s verdict ``{"verdict", "exit", "first"}``
            once the session finished (the JSON report's ``run.bisect``).
        bisect, report, figures, diagnosis: the run's plugin parts (``None`` when not registered).
        causes: capture-defect signature -> the test that reported it in full
            (``suite/outcome.py``: one root cause, one failure).
        tp1_accept_length: acceptance engine name -> its accept length at TP 1
            (the TP > 1 acceptance tests compare with it).
        pool: this process's engine pool once the ``eagle3_engine_pool`` fixture
            made it (its start failures by cause close the terminal summary).
        engine_names: ``(need name, case, group, tp)`` -> the engine it resolves to
            (the collection sort, :func:`pytest_eagle3.plugin.session.sort_by_engine`).
    """

    config: pytest.Config
    settings: Settings | None = None
    taken: tuple[TakenSpelling, ...] = ()
    engines: list[EngineRecord] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    shown_logs: dict[Path, tuple[tuple[int, int], str]] = field(default_factory=dict)
    left_out: dict[str, list[str]] = field(default_factory=dict)
    context: "tuple[SGLangInstall | None, TargetFacts | None] | None" = field(default=None, repr=False)
    xdist_workers: int | None = None
    bisect_result: dict[str, Any] | None = None
    bisect: Any = None
    report: Any = None
    figures: Any = None
    diagnosis: Any = None
    causes: dict[str, str] = field(default_factory=dict)
    tp1_accept_length: dict[str, float] = field(default_factory=dict)
    pool: Any = None
    engine_names: dict = field(default_factory=dict)

    def leave_out(self, test_id: str, reason: str) -> None:
        """Record a test not generated in this run, and why (terminal summary)."""
        self.left_out.setdefault(reason, []).append(test_id)

    def collect_context(self) -> "tuple[SGLangInstall | None, TargetFacts | None]":
        """The installed SGLang (cached ``--help`` probe) and the target's facts
        (its ``config.json``), read once per run for collection; ``None`` for
        what cannot be read (the tests then report that error themselves)."""
        if self.context is None:
            settings = get_settings(self.config)
            install = facts = None
            try:
                facts = resolve_target(settings.target).facts
            except Eagle3Error:
                pass

            # A bad target or --tp is reported once, after collection, before
            # anything (the probe's flag cache included) is written.
            if facts is not None and not check_tp_divides(settings.tp, facts.num_attention_heads):
                try:
                    install = sglang_install.probe(settings.cache_dir)
                except Eagle3Error:
                    pass
            self.context = (install, facts)
        return self.context

    def record_engine(
        self,
        description: str,
        start_seconds: float,
        log_path: Path | None = None,
        nodeid: str | None = None,
    ) -> EngineRecord:
        """Note an engine that became ready after ``start_seconds`` (wall seconds)."""
        record = EngineRecord(description, float(start_seconds), log_path, nodeid)
        self.engines.append(record)
        return record

    def summary_lines(self) -> list[str]:
        return [SUMMARY_LINE.format(description=e.description, seconds=e.start_seconds) for e in self.engines]

    def start_failure_lines(self) -> list[str]:
        """One line per cause of failed engine starts, with how many of the run's
        engine configurations it stopped (:mod:`pytest_eagle3.engine.start_failures`)."""
        if self.pool is None:
            return []
        return self.pool.start_failures.summary_lines(self.pool.configurations())

    def left_out_lines(self, verbose: bool = False) -> list[str]:
        """One line per reason (``N left out: reason``), each test id under it when ``verbose``."""
        lines = []
        for reason, ids in self.left_out.items():
            lines.append(LEFT_OUT_LINE.format(count=len(ids), reason=reason))
            if verbose:
                lines += [f"    {test_id}" for test_id in ids]
        return lines

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        lines = self.summary_lines()
        if lines:
            terminalreporter.section(SUMMARY_TITLE, sep="-")
            for line in lines:
                terminalreporter.line(line)
        failed = self.start_failure_lines()
        if failed:
            terminalreporter.section(START_FAILURES_TITLE, sep="-")
            for line in failed:
                terminalreporter.line(line)
        left = self.left_out_lines(verbose=self.config.get_verbosity() > 0)
        if left:
            terminalreporter.section(LEFT_OUT_TITLE, sep="-")
            for line in left:
                terminalreporter.line(line)


RUN_KEY = pytest.StashKey[Eagle3Run]()


def get_run(config: pytest.Config) -> Eagle3Run:
    """The run's :class:`Eagle3Run` (created on first use; registered as a plugin
    by :func:`register_run` in ``pytest_configure``)."""
    try:
        return config.stash[RUN_KEY]
    except KeyError:
        run = Eagle3Run(config)
        config.stash[RUN_KEY] = run
        return run


def register_run(config: pytest.Config) -> Eagle3Run:
    """:func:`get_run`, registered as the plugin :data:`RUN_PLUGIN` (its terminal summary)."""
    run = get_run(config)
    if not config.pluginmanager.is_registered(run):
        config.pluginmanager.register(run, RUN_PLUGIN)
    return run


def get_settings(config: pytest.Config) -> Settings:
    """The settings resolved in ``pytest_configure`` (resolved now, unvalidated, if absent)."""
    run = get_run(config)
    if run.settings is None:
        run.settings = resolve_settings(config, validate=False)
    return run.settings
