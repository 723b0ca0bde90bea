"""Per-test diagnostics and the ``tp`` marker, shared by the hooks and the fixtures.

The run-level state is the run object (:mod:`pytest_eagle3.plugin.run`).

* :data:`ENGINE_LOGS_KEY`: per-item list of ``(title, log path)``; fixtures call
  :func:`attach_log` and a failing test gets the last :data:`LOG_TAIL_LINES`
  lines of each log as a report section ``sglang log <title>``.
* The ``tp`` marker: :func:`tp_marker_values` and :func:`item_tp`.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import pytest

from pytest_eagle3.capture.api import engine_config
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.planning import declare
from pytest_eagle3.planning.request import resolve
from pytest_eagle3.target.checkpoint.cache import entry_dir
from pytest_eagle3.target.spec import LocalTarget, resolve_target
from pytest_eagle3.plugin.run import get_run, get_settings
from pytest_eagle3.settings import TP_CHOICES

if TYPE_CHECKING:
    from pytest_eagle3.settings import Settings
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

ENGINE_LOGS_KEY = pytest.StashKey[list[tuple[str, Path]]]()


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
    shown = get_run(item.config).shown_logs
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


#: Parameter holding a declared :class:`~pytest_eagle3.planning.declare.EngineNeed`.
NEED_ARGNAME = declare.NEED_ARGNAME


def uses_eagle3(fixturenames: Iterable[str]) -> bool:
    """Whether a test is this plugin's: it uses one of its ``eagle3_*`` fixtures.

    Everything the plugin does to items (generating TP sizes, skips, ordering)
    is limited to these, so another project's tests keep their outcomes.
    """
    return any(name.startswith("eagle3_") for name in fixturenames)


#: Sort name of tests that declare no engines: after every engine name.
UNDECLARED = "\uffff"


def sort_by_engine(items: list[pytest.Item]) -> None:
    """Sort ``items`` (this plugin's own) so tests sharing an engine run back to back
    and, with one engine alive at a time, each engine starts once.

    Engine-free tests first, then by TP size, then by the engine a declared need
    resolves to (its :class:`~pytest_eagle3.engine.config.EngineConfig` name, as
    ``--eagle3-plan`` resolves it: needs sharing an engine, e.g. every id list of
    a switching capture engine, sort together); a test that declares no engines
    sorts last within its TP size.  An engine one of whose tests has an engine
    set (:meth:`~pytest_eagle3.planning.declare.EngineNeed.engine_set`: the
    acceptance engine with the capture engine, a variant with its pair) sorts
    just before the set's other engine, its set tests last: they then run
    between the two groups.  An acceptance engine sorts before the capture
    engine of its case at every TP size, so the capture engine, which the
    undeclared tests after it use too, runs last."""
    main: dict[int, str] = {}
    partner: dict[tuple[int, str], str] = {}
    anchor: dict[tuple[int, str], str] = {}
    for item in items:
        need = getattr(getattr(item, "callspec", None), "params", {}).get(NEED_ARGNAME)
        if need is None:
            continue
        tp = item_tp(item)
        main[id(item)] = name = _engine_name(item, need, tp)
        for _, member in need.also:
            other = _engine_name(item, member, tp)
            if other != name:
                partner.setdefault((tp, name), other)
        if need.acceptance and (tp, name) not in anchor:
            capture = _engine_name(item, declare.EngineNeed(need.case, need.case, every_tp=True), tp)
            if capture != name:
                anchor[(tp, name)] = capture
    for key, other in partner.items():
        anchor[key] = other  # a set's other engine wins
    items.sort(key=lambda item: _sort_key(item, main, anchor, partner))


def _sort_key(item: pytest.Item, main: dict[int, str], anchor: dict[tuple[int, str], str],
              partner: dict[tuple[int, str], str]) -> tuple[int, int, str, int, int, str, int]:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if not ({TP_ARGNAME, NEED_ARGNAME} & set(params)) and item.get_closest_marker("tp") is None:
        return (0, 0, "", 0, 0, "", 0)
    tp = item_tp(item)
    name = main.get(id(item))
    if name is None:
        # An undeclared test: its engines are known only when it runs; after the
        # declared groups of its TP size, so it never splits one.
        return (1, tp, UNDECLARED, 1, 0, "", 0)
    sets = int(bool(params[NEED_ARGNAME].also))
    target = anchor.get((tp, name))
    if target is None:
        return (1, tp, name, 1, 0, name, sets)
    # Before the target engine's own tests; an engine with set tests last among those anchored there.
    return (1, tp, target, 0, int((tp, name) in partner), name, sets)


def target_model(settings: "Settings") -> "tuple[str, TargetFacts]":
    """``(model path, facts)`` of the run's target, from JSON only (the path the
    default ``eagle3_checkpoint`` fixture resolves); ``--eagle3-plan`` and the
    collection sort use it.

    Raises:
        Eagle3ConfigError: unknown preset, or a directory without ``config.json``.
    """
    target = resolve_target(settings.target)
    if isinstance(target, LocalTarget):
        return str(target.path), target.facts
    return str(entry_dir(target, settings.cache_dir)), target.facts


def _engine_name(item: pytest.Item, need: "declare.EngineNeed", tp: int) -> str:
    """The name of the engine ``need`` resolves to at ``tp`` in this run (cached per
    run), or the need's group where it cannot be resolved here (no SGLang, a bad
    target, a need whose request fails: those tests report it themselves)."""
    run = get_run(item.config)
    key = (need.name, need.case, need.engine_group, tp)
    cache = run.engine_names
    if key not in cache:
        cache[key] = str(need.engine_group)
        install, facts = run.collect_context()
        if install is not None and facts is not None:
            settings = get_settings(item.config)
            try:
                model, _ = target_model(settings)
                request = resolve(need, declare.NeedContext(settings, tp, install, facts))
                cache[key] = engine_config(install, settings, model_path=model, tp=tp, ids=request.ids,
                                           extra_args=request.extra_args, facts=facts, draft=request.draft).name
            except (Eagle3Error, ValueError):
                pass
    return cache[key]


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
