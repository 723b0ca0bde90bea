"""pytest entry point (``pytest11: eagle3``): hooks only.

Options are registered in :mod:`pytest_eagle3.plugin.options`, resolved in
:mod:`pytest_eagle3.plugin.resolve` and checked in
:mod:`pytest_eagle3.plugin.validate`; the run's state is one
:class:`~pytest_eagle3.plugin.run.Eagle3Run` (:mod:`pytest_eagle3.plugin.run`),
log attachment and the ``tp`` marker live in :mod:`pytest_eagle3.plugin.session`,
the report header in :mod:`pytest_eagle3.plugin.header`, fixtures in
:mod:`pytest_eagle3.plugin.fixtures` (imported in ``pytest_configure``).  An
:class:`~pytest_eagle3.errors.Eagle3Error` raised while a test is set up or run
becomes a failure/error showing its one-line message, without a traceback.  A bad
target or a ``--tp`` that does not divide its heads is one usage error after
collection (:func:`~pytest_eagle3.plugin.validate.check_target`), only when a
selected test uses the target.  Nothing here imports torch, transformers or
sglang: ``pytest --help`` works on a broken install.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Generator
from pathlib import Path
from typing import NoReturn

import pytest

from pytest_eagle3.plugin import families, hookspec, plan, resolve, workers
from pytest_eagle3.plugin import gpu_workers
from pytest_eagle3.planning import collect, declare
from pytest_eagle3.errors import Eagle3Error, Eagle3StartCauseSeen
from pytest_eagle3.plugin.bisect import BisectPlugin, mark_untestable
from pytest_eagle3.plugin.figures import Figures
from pytest_eagle3.plugin.header import collection_lines, header_lines
from pytest_eagle3.plugin.list_variants import list_variants
from pytest_eagle3.plugin.options import add_options
from pytest_eagle3.plugin.diagnosis import PLUGIN_NAME as DIAGNOSIS_PLUGIN, DiagnosisPlugin
from pytest_eagle3.plugin.report import ReportWriter
from pytest_eagle3.plugin.run import Eagle3Run, get_run, get_settings, register_run
from pytest_eagle3.plugin import session as eagle3_session
from pytest_eagle3.plugin.session import ENGINE_LOGS_KEY, log_sections, uses_eagle3
from pytest_eagle3.plugin.spellings import add_short_spellings
from pytest_eagle3.plugin.validate import check_gpu_selection, check_pp, check_target, check_user_draft

FIXTURES_MODULE = "pytest_eagle3.plugin.fixtures"
BISECT_PLUGIN = "eagle3-bisect"
REPORT_PLUGIN = "eagle3-report"
FIGURES_PLUGIN = "eagle3-figures"

MARKERS = (
    "gpu: the GPU integration suite (pytest-eagle3): `pytest -m gpu --tp 8` runs it on CUDA; with --device cpu "
    "the same tests run on the CPU tier",
    "tp(*sizes): needs that many tensor-parallel ranks; tp(4) runs at TP 4, tp(1, 2, 4) "
    "runs at each size (parameter eagle3_tp); sizes above --tp are skipped",
    "slow: minutes on cpu (an SGLang engine of its own, a TP 8 engine, a long end-to-end test); skipped unless "
    "--eagle3-slow",
    "eagle3_engines(*needs): the engines a pytest-eagle3 test needs (pytest_eagle3.planning.declare.EngineNeed); "
    "the test is generated only for the TP sizes and needs this run can execute",
    "eagle3_catches(*kinds, need, tp=None): the injected fault kinds this pytest-eagle3 test must fail naming, "
    "on its engine need `need` (pytest_eagle3.planning.selftest reads it for `pytest-eagle3 self-test`)",
)
#: Internal mark of a declared test for which nothing applies in this run (dropped after collection).
LEFT_OUT_MARK = "eagle3_left_out"

#: Fixture whose use makes a test an eagle3 test for the collection-time checks.
TARGET_FIXTURE = "eagle3_target"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> Generator[None, None, None]:
    # The short spellings (--tp, --device, --sglang-arg) are added only after
    # the project's conftests declared their options, and only where free: a
    # project's own --device wins, pytest-eagle3 keeps --eagle3-device.
    try:
        return (yield)
    finally:
        get_run(early_config).taken = add_short_spellings(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if (resolve.requested_target(config) == families.FAMILIES and not hasattr(config, "workerinput")
            and not (getattr(config.option, "help", False) or getattr(config.option, "version", False))):
        # --eagle3-target families: this pytest runs one child pytest per family preset.
        report = getattr(config.option, "eagle3_report", None)
        return families.run_families(config, Path(report).expanduser() if report else None)
    # --eagle3-list-variants: print the path matrix and exit 0 before any
    # collection, as --markers/--fixtures do (pytest's own cmdline_main hooks).
    if not getattr(config.option, "eagle3_list_variants", False):
        return None

    return list_variants(resolve.resolve_settings(config, validate=False))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.addinivalue_line("markers", f"{LEFT_OUT_MARK}: internal to pytest-eagle3")
    # `pytest --help` / `--version` must work whatever the machine looks like.
    validate = not (getattr(config.option, "help", False) or getattr(config.option, "version", False))
    run = get_run(config)
    run.settings = settings = resolve.resolve_settings(config, validate=validate)
    if validate and settings.draft is not None:
        check_user_draft(settings)
    register_run(config)
    if settings.plan:
        plan.switch_off_xdist(config)
    elif not hasattr(config, "workerinput"):
        warning = gpu_workers.oversubscription(settings, getattr(config.option, "numprocesses", None))
        if warning:
            config.issue_config_time_warning(pytest.PytestConfigWarning(warning), stacklevel=2)
    if settings.bisect and not config.pluginmanager.has_plugin(BISECT_PLUGIN):
        run.bisect = BisectPlugin(config)
        config.pluginmanager.register(run.bisect, BISECT_PLUGIN)
    if settings.report is not None and not config.pluginmanager.has_plugin(REPORT_PLUGIN):
        run.report = ReportWriter(config, settings.report)
        config.pluginmanager.register(run.report, REPORT_PLUGIN)
    if not config.pluginmanager.has_plugin(FIGURES_PLUGIN):
        run.figures = Figures()
        config.pluginmanager.register(run.figures, FIGURES_PLUGIN)
    if not config.pluginmanager.has_plugin(DIAGNOSIS_PLUGIN):
        run.diagnosis = DiagnosisPlugin(config)
        config.pluginmanager.register(run.diagnosis, DIAGNOSIS_PLUGIN)
    if importlib.util.find_spec(FIXTURES_MODULE) is not None:
        config.pluginmanager.import_plugin(FIXTURES_MODULE)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return header_lines(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    # ``-n auto``: one worker per block of --tp GPUs on cuda, one on cpu
    # (gpu_workers.auto_num_workers says why).  Runs before pytest_configure, so the
    # settings are resolved here unvalidated.  None (xdist's own default) when
    # PYTEST_XDIST_AUTO_NUM_WORKERS is set or the run is not about eagle3 at all.
    if os.environ.get(workers.ENV_XDIST_AUTO) or not workers.is_eagle3_run(config):
        return None
    return gpu_workers.auto_num_workers(resolve.resolve_settings(config, validate=False))


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    # --eagle3-plan: print the engines, run nothing (as --collect-only does).
    settings = get_settings(session.config)
    if not settings.plan:
        return None

    plan.write_plan(session, settings)
    return True


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Only this plugin's own tests (they use an eagle3_* fixture): another
    # project's ``tp`` marker keeps that project's meaning.
    if not uses_eagle3(metafunc.fixturenames):
        return
    marker = metafunc.definition.get_closest_marker("tp")
    nodeid = metafunc.definition.nodeid
    sizes = eagle3_session.tp_marker_values(marker, nodeid) if marker is not None else None
    engines = metafunc.definition.get_closest_marker(declare.MARKER)
    run = get_run(metafunc.config)
    if engines is not None:
        _generate_declared(metafunc, run, sizes, list(engines.args))
        return
    if sizes is None or len(sizes) < 2:
        return
    if eagle3_session.TP_ARGNAME not in metafunc.fixturenames:
        pytest.fail(
            eagle3_session.MSG_TP_PARAM_UNUSED.format(nodeid=nodeid, args=", ".join(map(str, sizes))),
            pytrace=False,
        )
    settings = get_settings(metafunc.config)
    kept = [s for s in sizes if s <= settings.tp]
    for s in sizes:
        if s > settings.tp:
            run.leave_out(f"{nodeid}[tp{s}]", collect.TP_ABOVE.format(needed=s, tp=settings.tp))
    metafunc.parametrize(eagle3_session.TP_ARGNAME, kept, ids=[f"tp{s}" for s in kept])


def _generate_declared(metafunc: pytest.Metafunc, run: Eagle3Run, sizes: tuple[int, ...] | None,
                       needs: list[declare.EngineNeed]) -> None:
    """Generate ``(eagle3_tp, eagle3_need)`` for the pairs this run can execute
    (:func:`pytest_eagle3.planning.collect.collect_reason`); record the rest."""
    settings = get_settings(metafunc.config)
    nodeid = metafunc.definition.nodeid
    install, facts = run.collect_context()
    pairs, ids = [], []
    for tp in sizes or (settings.tp,):
        for need in needs:
            reason = collect.collect_reason(need, declare.NeedContext(settings, tp, install, facts))
            test_id = f"tp{tp}-{need.name}" if sizes else need.name
            if reason:
                run.leave_out(f"{nodeid}[{test_id}]", reason)
                continue
            pairs.append((tp, need) if sizes else (need,))
            ids.append(test_id)
    argnames = [eagle3_session.TP_ARGNAME, declare.NEED_ARGNAME] if sizes else [declare.NEED_ARGNAME]
    if not pairs:
        # Nothing applies: an empty parametrization makes pytest report one
        # skip; instead the test is left out and summarised like the rest.
        metafunc.parametrize(argnames, [pytest.param(*([None] * len(argnames)),
                                                     marks=getattr(pytest.mark, LEFT_OUT_MARK))], ids=["none"])
        return
    metafunc.parametrize(argnames, pairs, ids=ids)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only this plugin's own items: skips, markers and order of every other
    # project's tests stay exactly as that project wrote them.
    settings = get_settings(config)
    own = [i for i, item in enumerate(items) if uses_eagle3(getattr(item, "fixturenames", ()))]
    if not own:
        return
    kept = []
    for i in own:
        item = items[i]
        if item.get_closest_marker(LEFT_OUT_MARK) is not None:
            continue  # nothing applies; summarised as left out (pytest_generate_tests)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.get_closest_marker("tp") is not None or eagle3_session.TP_ARGNAME in params:
            needed = eagle3_session.item_tp(item)
            if needed > settings.tp:
                item.add_marker(pytest.mark.skip(reason=eagle3_session.MSG_SKIP_TP.format(needed=needed, tp=settings.tp)))
        if not settings.slow and item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.skip(reason=eagle3_session.MSG_SKIP_SLOW))
        kept.append(item)
    # Tests sharing an engine run back to back, so each engine starts once.
    # The sorted own items fill the places own items had; others do not move.
    eagle3_session.sort_by_engine(kept)
    own_places = set(own)
    sorted_own = iter(kept)
    merged = []
    for j, item in enumerate(items):
        if j not in own_places:
            merged.append(item)
        elif (nxt := next(sorted_own, None)) is not None:
            merged.append(nxt)
    items[:] = merged


def pytest_collection_finish(session: pytest.Session) -> None:
    # A bad target, a --tp that does not divide its heads or an unwritable
    # default cache would otherwise fail every test's setup with the same
    # error.  Checked once, as a usage error, and only when a selected test
    # uses the target: unrelated runs in an environment with the plugin
    # installed neither pay for it nor fail on it.  Not in an xdist worker: a
    # usage error there is an INTERNALERROR wall in the controller (which
    # collects nothing itself), so under -n the fixtures report the same line
    # as each test's setup error.
    if hasattr(session.config, "workerinput"):
        return
    own = [item for item in session.items if uses_eagle3(getattr(item, "fixturenames", ()))]
    settings = get_settings(session.config)
    # Asked for PP (--eagle3-pp or a pp_size server argument), the run checks it even where
    # collection left every eagle3 test out for SGLang's PP gate.
    check_pp(settings)
    if own:
        check_gpu_selection(session.config, settings)
    if any(TARGET_FIXTURE in getattr(item, "fixturenames", ()) for item in own):
        check_target(settings)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """Where this run's id rule comes from (only for runs that collected declared
    eagle3 tests: the rule is read from the installed model file, well under a second)."""
    return collection_lines(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except Eagle3Error as exc:
        error = exc
    _fail_without_traceback(error, item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except Eagle3Error as exc:
        error = exc
    _fail_without_traceback(error, item)


def _fail_without_traceback(exc: Eagle3Error, item: pytest.Item | None = None) -> NoReturn:
    # Our own errors carry a one-line, actionable message (errors.py); a
    # traceback into the library would only bury it.  Called outside the
    # ``except`` block: raised inside it, the failure would chain to ``exc`` and
    # pytest would print both ("During handling of the above exception ...").
    __tracebackhide__ = True
    if item is not None and isinstance(exc, Eagle3StartCauseSeen):
        # One root cause, one failure: the test that reported this start failure
        # in full carries the log tail; this one says so in one line.
        item.stash[ENGINE_LOGS_KEY] = []
    if item is not None and get_settings(item.config).bisect:
        mark_untestable(item, type(exc).__name__, str(exc))
    pytest.fail(f"{type(exc).__name__}: {exc}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Sections must be on the item before the report is built from it.
    excinfo = call.excinfo
    if (
        excinfo is not None
        and call.when in ("setup", "call")
        and not excinfo.errisinstance(pytest.skip.Exception)
        and item.stash.get(ENGINE_LOGS_KEY, None)
    ):
        for title, tail in log_sections(item):
            item.add_report_section(call.when, title, tail)
    return (yield)
