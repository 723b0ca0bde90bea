"""Run-level state and per-test diagnostics shared by the hooks and the fixtures.

* :class:`Eagle3Session`: one per pytest run, registered in ``pytest_configure``
  and stored under :data:`SESSION_KEY`; fixtures record the engines they start
  with :meth:`Eagle3Session.record_engine` and the terminal summary lists them.
* :data:`ENGINE_LOGS_KEY`: per-item list of ``(title, log path)``; fixtures call
  :func:`attach_log` and a failing test gets the last :data:`LOG_TAIL_LINES`
  lines of each log as a report section ``sglang log <title>``.
* The ``tp`` marker: :func:`tp_marker_values` and :func:`item_tp`.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import pytest

from pytest_eagle3.planning import declare
from pytest_eagle3.plugin.options import TP_CHOICES, check_tp_divides, get_settings
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.sglang_source import install as sglang_install
from pytest_eagle3.target.spec import resolve_target

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.target.spec import TargetFacts

#: Lines of an engine log attached to a failing test.
LOG_TAIL_LINES = 200
#: Bytes read from the end of a log at most (enough for 200 long lines).
LOG_TAIL_BYTES = 256 * 1024
#: Name a directly parametrized TP value is given (``tp(1, 2)`` marker).
TP_ARGNAME = "eagle3_tp"

MSG_SKIP_SLOW = "slow: starts an SGLang engine of its own (minutes on CPU); run with --eagle3-slow"
MSG_SKIP_TP = "needs --tp {needed}; this run has --tp {tp}"
MSG_BAD_TP_MARKER = "{nodeid}: tp marker takes TP sizes from {choices}, got {args}"
MSG_TP_PARAM_UNUSED = (
    "{nodeid}: tp({args}) runs the test at each TP size through the '" + TP_ARGNAME + "' "
    "argument; request the " + TP_ARGNAME + " fixture (or a fixture that uses it)"
)
LOG_SECTION = "sglang log {title}"
LOG_MISSING = "(log {path} is missing: {reason})"
#: Section body for a log that has not changed since it was shown for an earlier failure.
LOG_SHOWN_BEFORE = "(unchanged since its tail was shown for {nodeid})"
SUMMARY_TITLE = "eagle3 engines"
LEFT_OUT_TITLE = "eagle3 left out (not generated: this run cannot execute them; -v lists them)"
LEFT_OUT_LINE = "{count} left out: {reason}"
SUMMARY_LINE = "{description}: ready in {seconds:.1f} s"

ENGINE_LOGS_KEY = pytest.StashKey[list[tuple[str, Path]]]()


@dataclass
class EngineRecord:
    """One engine start, for the run summary."""

    description: str
    start_seconds: float
    log_path: Path | None = None
    nodeid: str | None = None


@dataclass(eq=False)  # identity hash: pytest keeps registered plugins in sets and dicts
class Eagle3Session:
    """Run-level registry; registered as a plugin named ``eagle3-session``."""

    config: pytest.Config
    engines: list[EngineRecord] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    #: log path -> ((size, mtime_ns), nodeid) of the last failure its tail was shown for.
    shown_logs: dict[Path, tuple[tuple[int, int], str]] = field(default_factory=dict)
    #: reason -> test ids left out at collection (this run cannot execute them).
    left_out: dict[str, list[str]] = field(default_factory=dict)
    _context: "tuple[Any, Any] | None" = field(default=None, repr=False)

    def leave_out(self, test_id: str, reason: str) -> None:
        """Record a test not generated in this run, and why (terminal summary)."""
        self.left_out.setdefault(reason, []).append(test_id)

    def collect_context(self) -> "tuple[SGLangInstall | None, TargetFacts | None]":
        """The installed SGLang (cached ``--help`` probe) and the target's facts
        (its ``config.json``), read once per run for collection; ``None`` for
        what cannot be read (the tests then report that error themselves)."""
        if self._context is None:
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
            self._context = (install, facts)
        return self._context

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
        left = self.left_out_lines(verbose=self.config.get_verbosity() > 0)
        if left:
            terminalreporter.section(LEFT_OUT_TITLE, sep="-")
            for line in left:
                terminalreporter.line(line)


SESSION_KEY = pytest.StashKey[Eagle3Session]()


def get_session(config: pytest.Config) -> Eagle3Session:
    """The run's :class:`Eagle3Session` (created and registered on first use)."""
    try:
        return config.stash[SESSION_KEY]
    except KeyError:
        session = Eagle3Session(config)
        config.stash[SESSION_KEY] = session
        if not config.pluginmanager.is_registered(session):
            config.pluginmanager.register(session, "eagle3-session")
        return session


def attach_log(item: pytest.Item, title: str, path: Path | str) -> None:
    """Attach a log file to ``item``: if the test fails (setup or call), its
    last :data:`LOG_TAIL_LINES` lines become the report section ``sglang log <title>``.

    Fixtures call it with ``request.node`` for every engine the test uses.
    """
    logs = item.stash.setdefault(ENGINE_LOGS_KEY, [])
    entry = (title, Path(path))
    if entry not in logs:
        logs.append(entry)


def tail_lines(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``lines`` lines of a text file (decoded leniently), or a note
    saying why it could not be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError as exc:
        return LOG_MISSING.format(path=path, reason=exc.strerror or exc)
    text = data.decode("utf-8", errors="replace")
    kept = text.splitlines()
    if size > max_bytes and kept:
        kept = kept[1:]  # first line is probably cut
    return "\n".join(kept[-lines:])


def log_sections(item: pytest.Item, lines: int = LOG_TAIL_LINES) -> list[tuple[str, str]]:
    """``(section title, tail)`` for every log attached to ``item``.

    A log unchanged since its tail was shown for an earlier failure in this run
    (an engine that failed to start, reused by the next tests) gets the one-line
    :data:`LOG_SHOWN_BEFORE` instead of the same tail again.
    """
    shown = get_session(item.config).shown_logs
    sections = []
    for title, path in item.stash.get(ENGINE_LOGS_KEY, []):
        stamp = _stamp(path)
        earlier = shown.get(path)
        if stamp is not None and earlier is not None and earlier[0] == stamp:
            sections.append((LOG_SECTION.format(title=title), LOG_SHOWN_BEFORE.format(nodeid=earlier[1])))
            continue
        if stamp is not None:
            shown[path] = (stamp, item.nodeid)
        sections.append((LOG_SECTION.format(title=title), tail_lines(path, lines)))
    return sections


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


# --- the tp marker ---


def tp_marker_values(marker: pytest.Mark, nodeid: str) -> tuple[int, ...]:
    """TP sizes named by a ``tp(...)`` marker.

    Raises:
        pytest.fail.Exception: a value outside 1, 2, 4, 8 (or no value).
    """

    values = marker.args
    ok = bool(values) and all(isinstance(v, int) and not isinstance(v, bool) and v in TP_CHOICES for v in values)
    if not ok:
        pytest.fail(
            MSG_BAD_TP_MARKER.format(nodeid=nodeid, choices=TP_CHOICES, args=values), pytrace=False
        )
    return tuple(dict.fromkeys(values))


#: Parameter naming the capture case; tests with equal (tp, case) share an engine.
CASE_ARGNAME = "eagle3_case"
#: Parameter holding a declared :class:`~pytest_eagle3.planning.declare.EngineNeed`.
NEED_ARGNAME = declare.NEED_ARGNAME


def uses_eagle3(fixturenames: Iterable[str]) -> bool:
    """Whether a test is this plugin's: it uses one of its ``eagle3_*`` fixtures.

    Everything the plugin does to items (generating TP sizes, skips, ordering)
    is limited to these, so another project's tests keep their outcomes.
    """
    return any(name.startswith("eagle3_") for name in fixturenames)


def engine_group(item: pytest.Item) -> tuple[int, int, str, int, int, str]:
    """Sort key grouping tests that use the same engine: engine-free tests first,
    then by TP size, then by engine need (or capture case) name.

    An acceptance need sorts just before the capture-only engine of its case
    (the draft's ids): a test that uses both (draft path vs capture-only) then
    sits between the two groups, and with one engine alive at a time each
    engine starts once.  Draft variants of the same case (the MLA drafts) come
    first, each group together."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if not ({TP_ARGNAME, CASE_ARGNAME, NEED_ARGNAME} & set(params)) and item.get_closest_marker("tp") is None:
        return (0, 0, "", 0, 0, "")
    need = params.get(NEED_ARGNAME)
    if need is not None and need.acceptance:
        return (1, item_tp(item), str(need.case), 0, 0 if need.draft_variant else 1, str(need.engine_group))
    if need is not None:
        return (1, item_tp(item), str(need.engine_group), 1, 0, "")
    case = params.get(CASE_ARGNAME)
    return (1, item_tp(item), str(getattr(case, "name", case or "")), 1, 0, "")


def item_tp(item: pytest.Item) -> int:
    """The TP size ``item`` runs at: the ``eagle3_tp`` parameter of a
    ``tp(a, b)`` test, else the single value of ``tp(n)``, else the run's ``--tp``."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and TP_ARGNAME in callspec.params:
        return int(callspec.params[TP_ARGNAME])
    marker = item.get_closest_marker("tp")
    if marker is not None:
        return max(tp_marker_values(marker, item.nodeid))

    return get_settings(item.config).tp
