"""pytest entry point (``pytest11: eagle3``): hooks only.

Options and settings live in :mod:`pytest_eagle3.plugin.options`, run state and log
attachment in :mod:`pytest_eagle3.plugin.session`, fixtures in
:mod:`pytest_eagle3.plugin.fixtures` (imported in ``pytest_configure``).  An
:class:`~pytest_eagle3.errors.Eagle3Error` raised while a test is set up or run
becomes a failure/error showing its one-line message, without a traceback.  A bad
target or a ``--tp`` that does not divide its heads is one usage error after
collection (:func:`check_target`), only when a selected test uses the target.  Nothing here
imports torch, transformers or sglang: ``pytest --help`` works on a broken install.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Generator
from pathlib import Path
from typing import NoReturn

import pytest

from pytest_eagle3.plugin import options
from pytest_eagle3.plugin import session
from pytest_eagle3.plugin import session as eagle3_session
from pytest_eagle3.planning import declare
from pytest_eagle3.engine import lease
from pytest_eagle3.plugin import workers
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.plugin import families, hookspec, plan
from pytest_eagle3.engine.variants import list_variants
from pytest_eagle3.libversions import module_version
from pytest_eagle3.contracts.draft import NO_DIR_MSG
from pytest_eagle3.draft.validate import read_config
from pytest_eagle3.target.spec import LocalTarget, resolve_target
from pytest_eagle3.sglang_source.install import SGLangInstall, sglang_location_and_version
from pytest_eagle3.plugin.bisect import BisectPlugin, mark_untestable
from pytest_eagle3.plugin.report import ReportWriter
from pytest_eagle3.plugin.figures import Figures
from pytest_eagle3.worker.faults import describe, read_fault
from pytest_eagle3.sglang_source.norm_code import norm_code_at, resolve_norm_path
from pytest_eagle3.sglang_source.fusion_code import fusion_code_at
from pytest_eagle3.target.prompts import load_prompts

FIXTURES_MODULE = "pytest_eagle3.plugin.fixtures"
BISECT_PLUGIN = "eagle3-bisect"
REPORT_PLUGIN = "eagle3-report"
FIGURES_PLUGIN = "eagle3-figures"

MARKERS = (
    "gpu: the GPU integration suite (pytest-eagle3): `pytest -m gpu --tp 8` runs it on CUDA; with --device cpu "
    "the same tests run on the CPU tier",
    "tp(*sizes): needs that many tensor-parallel ranks; tp(4) runs at TP 4, tp(1, 2, 4) "
    "runs at each size (parameter eagle3_tp); sizes above --tp are skipped",
    "slow: starts an engine of its own or a TP 8 engine on cpu (minutes); skipped unless --eagle3-slow",
    "eagle3_engines(*needs): the engines a pytest-eagle3 test needs (pytest_eagle3.planning.declare.EngineNeed); "
    "the test is generated only for the TP sizes and needs this run can execute",
)
#: Internal mark of a declared test for which nothing applies in this run (dropped after collection).
LEFT_OUT_MARK = "eagle3_left_out"

HEADER_SGLANG = "eagle3: sglang {version} at {location}"
HEADER_NO_SGLANG = "eagle3: sglang not importable (install pytest-eagle3[cpu] or your SGLang fork)"
HEADER_LIBS = "eagle3: torch {torch}, transformers {transformers}"
HEADER_NORM = "eagle3: norm path {why}"
HEADER_FUSION = "eagle3: all-reduce fusion at TP > 1 (--eagle3-cpu-allreduce-fusion): {what}"
HEADER_HOOKS = "eagle3: hooks reach SGLang's processes via the {loader}"
HEADER_RULE = "eagle3: aux layer-id rule of {arch}: {rule}"
HEADER_NO_EAGLE3 = "eagle3: {arch} has no EAGLE-3 aux capture in this SGLang: {why}"
HEADER_LAYER0 = "eagle3: layer 0 (embedding) {state}: {why} [{source}]"
HEADER_RUN = "eagle3: device {device}, tp {tp}, target {target}"
HEADER_CACHE = "eagle3: cache {cache}{rebuild}, startup timeout {timeout:g} s"
HEADER_SGLANG_ARGS = "eagle3: sglang args {args}"
HEADER_FAULT = "eagle3: FAULT INJECTION ON (self-test; the suite must fail): {fault}"
HEADER_GPU_BLOCKS = "eagle3: gpu blocks of {tp}: {blocks} (one leased per pytest process; locks in {lock_dir})"

MSG_GPU_NONE = (
    "-m gpu selects the GPU suite, but no GPU is visible ({how}); run it on the CPU tier "
    "with --device cpu, or on a machine with GPUs"
)
#: Fixture whose use makes a test an eagle3 test for the collection-time checks.
TARGET_FIXTURE = "eagle3_target"
#: A target error whose value did not come from the command line names where it did.
MSG_FROM_SOURCE = "{message} (target from {where})"
TARGET_SOURCES = {"env": f"env {options.ENV_TARGET}", "ini": f"ini {options.INI_TARGET}"}


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


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
        early_config.stash[options.TAKEN_KEY] = options.add_short_spellings(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if (options.requested_target(config) == families.FAMILIES and not hasattr(config, "workerinput")
            and not (getattr(config.option, "help", False) or getattr(config.option, "version", False))):
        # --eagle3-target families: this pytest runs one child pytest per family preset.
        report = getattr(config.option, "eagle3_report", None)
        return families.run_families(config, Path(report).expanduser() if report else None)
    # --eagle3-list-variants: print the path matrix and exit 0 before any
    # collection, as --markers/--fixtures do (pytest's own cmdline_main hooks).
    if not getattr(config.option, "eagle3_list_variants", False):
        return None

    return list_variants(options.resolve_settings(config, validate=False))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.addinivalue_line("markers", f"{LEFT_OUT_MARK}: internal to pytest-eagle3")
    # `pytest --help` / `--version` must work whatever the machine looks like.
    validate = not (getattr(config.option, "help", False) or getattr(config.option, "version", False))
    config.stash[options.SETTINGS_KEY] = settings = options.resolve_settings(config, validate=validate)
    if validate and settings.draft is not None:
        check_user_draft(settings)
    session.get_session(config)
    if settings.plan:
        plan.switch_off_xdist(config)
    elif not hasattr(config, "workerinput"):
        warning = lease.oversubscription(settings, getattr(config.option, "numprocesses", None))
        if warning:
            config.issue_config_time_warning(pytest.PytestConfigWarning(warning), stacklevel=2)
    if settings.bisect and not config.pluginmanager.has_plugin(BISECT_PLUGIN):
        config.pluginmanager.register(BisectPlugin(config), BISECT_PLUGIN)
    if settings.report is not None and not config.pluginmanager.has_plugin(REPORT_PLUGIN):
        config.pluginmanager.register(ReportWriter(config, settings.report), REPORT_PLUGIN)
    if not config.pluginmanager.has_plugin(FIGURES_PLUGIN):
        config.pluginmanager.register(Figures(), FIGURES_PLUGIN)
    if importlib.util.find_spec(FIXTURES_MODULE) is not None:
        config.pluginmanager.import_plugin(FIXTURES_MODULE)


def pytest_report_header(config: pytest.Config) -> list[str]:
    settings = options.get_settings(config)

    lines = [taken.header() for taken in config.stash.get(options.TAKEN_KEY, ())]
    lines += [_sglang_line(), HEADER_LIBS.format(torch=module_version("torch"),
                                                transformers=module_version("transformers"))]
    hooks = _hooks_line()
    if hooks is not None:
        lines.append(hooks)
    norm = _norm_line(settings) if settings.device == "cpu" else None
    if norm is not None:
        lines.append(norm)
    location, _version = sglang_location_and_version()
    if settings.device == "cpu" and settings.cpu_allreduce_fusion and location is not None:
        lines.append(HEADER_FUSION.format(what=fusion_code_at(location).describe()))
    device = settings.device + _src(settings, "device")
    if settings.source("device") == "default":
        device = f"{settings.device} (auto: {settings.gpu.how})"
    lines.append(
        HEADER_RUN.format(
            device=device,
            tp=f"{settings.tp}{_src(settings, 'tp')}",
            target=f"{settings.target}{_src(settings, 'target')}",
        )
    )
    lines.append(
        HEADER_CACHE.format(
            cache=f"{settings.cache_dir}{_src(settings, 'cache_dir')}",
            rebuild=" (rebuild)" if settings.rebuild else "",
            timeout=settings.startup_timeout,
        )
    )
    if settings.fault:
        fault = read_fault({"PYTEST_EAGLE3_FAULT": settings.fault})
        if fault is not None:
            lines.append(HEADER_FAULT.format(fault=describe(fault)) + _src(settings, "fault"))
    if settings.prompts is not None:
        lines.append(f"eagle3: prompts {settings.prompts} (--eagle3-prompts)")
    if not settings.prefetch:
        lines.append("eagle3: engine prefetch off (--eagle3-no-prefetch)")
    if settings.sglang_args:
        args = " ".join(f"{k}={v!r}" for k, v in settings.sglang_args)
        lines.append(HEADER_SGLANG_ARGS.format(args=args) + _src(settings, "sglang_args"))
    if settings.device == "cuda":
        try:
            blocks = lease.describe_blocks(lease.settings_blocks(settings))
        except Eagle3Error as exc:
            blocks = str(exc)
        lines.append(HEADER_GPU_BLOCKS.format(tp=settings.tp, blocks=blocks, lock_dir=lease.default_lock_dir()))
    return lines


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    # ``-n auto``: one worker per block of --tp GPUs on cuda, one on cpu
    # (lease.auto_num_workers says why).  Runs before pytest_configure, so the
    # settings are resolved here unvalidated.  None (xdist's own default) when
    # PYTEST_XDIST_AUTO_NUM_WORKERS is set or the run is not about eagle3 at all.
    if os.environ.get(workers.ENV_XDIST_AUTO) or not workers.is_eagle3_run(config):
        return None
    return lease.auto_num_workers(options.resolve_settings(config, validate=False))


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    # --eagle3-plan: print the engines, run nothing (as --collect-only does).
    settings = options.get_settings(session.config)
    if not settings.plan:
        return None

    plan.write_plan(session, settings)
    return True


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Only this plugin's own tests (they use an eagle3_* fixture): another
    # project's ``tp`` marker keeps that project's meaning.
    if not session.uses_eagle3(metafunc.fixturenames):
        return
    marker = metafunc.definition.get_closest_marker("tp")
    nodeid = metafunc.definition.nodeid
    sizes = session.tp_marker_values(marker, nodeid) if marker is not None else None
    engines = metafunc.definition.get_closest_marker(declare.MARKER)
    run = session.get_session(metafunc.config)
    if engines is not None:
        _generate_declared(metafunc, run, sizes, list(engines.args))
        return
    if sizes is None or len(sizes) < 2:
        return
    if session.TP_ARGNAME not in metafunc.fixturenames:
        pytest.fail(
            session.MSG_TP_PARAM_UNUSED.format(nodeid=nodeid, args=", ".join(map(str, sizes))),
            pytrace=False,
        )
    settings = options.get_settings(metafunc.config)
    kept = [s for s in sizes if s <= settings.tp]
    for s in sizes:
        if s > settings.tp:
            run.leave_out(f"{nodeid}[tp{s}]", declare.TP_ABOVE.format(needed=s, tp=settings.tp))
    metafunc.parametrize(session.TP_ARGNAME, kept, ids=[f"tp{s}" for s in kept])


def _generate_declared(metafunc: pytest.Metafunc, run: session.Eagle3Session, sizes: tuple[int, ...] | None,
                       needs: list[declare.EngineNeed]) -> None:
    """Generate ``(eagle3_tp, eagle3_need)`` for the pairs this run can execute
    (:func:`pytest_eagle3.planning.declare.collect_reason`); record the rest."""
    settings = options.get_settings(metafunc.config)
    nodeid = metafunc.definition.nodeid
    install, facts = run.collect_context()
    pairs, ids = [], []
    for tp in sizes or (settings.tp,):
        for need in needs:
            reason = declare.collect_reason(need, declare.NeedContext(settings, tp, install, facts))
            test_id = f"tp{tp}-{need.name}" if sizes else need.name
            if reason:
                run.leave_out(f"{nodeid}[{test_id}]", reason)
                continue
            pairs.append((tp, need) if sizes else (need,))
            ids.append(test_id)
    argnames = [session.TP_ARGNAME, declare.NEED_ARGNAME] if sizes else [declare.NEED_ARGNAME]
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
    settings = options.get_settings(config)
    own = [i for i, item in enumerate(items) if session.uses_eagle3(getattr(item, "fixturenames", ()))]
    if not own:
        return
    kept = []
    for i in own:
        item = items[i]
        if item.get_closest_marker(LEFT_OUT_MARK) is not None:
            continue  # nothing applies; summarised as left out (pytest_generate_tests)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.get_closest_marker("tp") is not None or session.TP_ARGNAME in params:
            needed = session.item_tp(item)
            if needed > settings.tp:
                item.add_marker(pytest.mark.skip(reason=session.MSG_SKIP_TP.format(needed=needed, tp=settings.tp)))
        if not settings.slow and item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.skip(reason=session.MSG_SKIP_SLOW))
        kept.append(item)
    # Tests sharing an engine run back to back, so each engine starts once.
    # The sorted own items fill the places own items had; others do not move.
    kept.sort(key=session.engine_group)
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
    own = [item for item in session.items if eagle3_session.uses_eagle3(getattr(item, "fixturenames", ()))]
    settings = options.get_settings(session.config)
    if own:
        check_gpu_selection(session.config, settings)
    if any(TARGET_FIXTURE in getattr(item, "fixturenames", ()) for item in own):
        check_target(settings)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """Where this run's id rule comes from (only for runs that collected declared
    eagle3 tests: the rule is read from the installed model file, well under a second)."""
    run = eagle3_session.get_session(config)
    if run._context is None:
        return []
    install, facts = run._context
    if install is None or facts is None:
        return []
    rule = install.id_rule(facts.architecture)
    if not rule.supported:
        return [HEADER_NO_EAGLE3.format(arch=facts.architecture, why=rule.source)]
    state = {True: "can be captured", False: "cannot be captured", None: "unknown (measured)"}
    return [HEADER_RULE.format(arch=facts.architecture, rule=rule.describe()),
            HEADER_LAYER0.format(state=state[rule.embedding.capturable], why=rule.embedding.why,
                                 source=rule.embedding.source)]


def check_gpu_selection(config: pytest.Config, settings: options.Settings) -> None:
    """``-m gpu`` selects the GPU suite: on a machine where no GPU is visible and
    ``--device`` was not given, stop with one line instead of running it on cpu
    unasked (``--device cpu`` runs the same tests on the CPU tier).

    Raises:
        pytest.UsageError: :data:`MSG_GPU_NONE`.
    """
    markexpr = getattr(config.option, "markexpr", "") or ""
    if re.search(r"\bgpu\b", markexpr) and settings.device == "cpu" and settings.source("device") == "default":
        raise pytest.UsageError(MSG_GPU_NONE.format(how=settings.gpu.how))


def check_user_draft(settings: options.Settings) -> None:
    """``--eagle3-draft PATH`` must be a directory with a readable ``config.json``
    (JSON only: collection reads its ids; the full check against the target,
    weights included, runs before its engine starts).

    Raises:
        pytest.UsageError: one line naming the problem.
    """

    if not settings.draft.is_dir():
        raise pytest.UsageError(f"--eagle3-draft: {NO_DIR_MSG.format(path=settings.draft)}")
    try:
        read_config(settings.draft)
    except Eagle3Error as exc:
        raise pytest.UsageError(f"--eagle3-draft: {exc}") from None


def check_target(settings: options.Settings) -> None:
    """Resolve the target (JSON only, no torch), check ``--tp`` against its heads
    and ``--eagle3-prompts`` against its vocabulary (and tokenizer, for text).

    Raises:
        pytest.UsageError: one line: unknown preset, directory without
            ``config.json``, bad spec, ``--tp`` not dividing the heads, a bad
            prompts file, or an unwritable default cache.
    """

    try:
        target = resolve_target(settings.target)
    except Eagle3Error as exc:
        raise pytest.UsageError(_with_target_source(str(exc), settings)) from None
    problem = options.check_tp_divides(settings.tp, target.facts.num_attention_heads)
    if problem:
        raise pytest.UsageError(problem)
    if settings.prompts is not None:
        try:
            load_prompts(settings.prompts, vocab_size=target.facts.vocab_size,
                         tokenizer_dir=target.path if isinstance(target, LocalTarget) else None)
        except Eagle3Error as exc:
            raise pytest.UsageError(f"--eagle3-prompts: {exc}") from None
    options.check_cache(settings)


def _with_target_source(message: str, settings: options.Settings) -> str:
    where = TARGET_SOURCES.get(settings.source("target"))
    return MSG_FROM_SOURCE.format(message=message, where=where) if where else message


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
    if item is not None and options.get_settings(item.config).bisect:
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
        and item.stash.get(session.ENGINE_LOGS_KEY, None)
    ):
        for title, tail in session.log_sections(item):
            item.add_report_section(call.when, title, tail)
    return (yield)


# --- header helpers ---


def _src(settings: options.Settings, name: str) -> str:
    source = settings.source(name)
    return "" if source == "default" else f" (from {source})"


def _sglang_line() -> str:
    """Version and location of the importable ``sglang`` package, without importing it."""

    location, version = sglang_location_and_version()
    if location is None:
        return HEADER_NO_SGLANG
    return HEADER_SGLANG.format(version=version, location=location)


def _norm_line(settings: options.Settings) -> str | None:
    """Which norm path the CPU engines run (read from the installed layernorm.py)."""

    location, _version = sglang_location_and_version()
    if location is None:
        return None
    path, why = resolve_norm_path(settings.cpu_norm, norm_code_at(location))
    return HEADER_NORM.format(why=why) + _src(settings, "cpu_norm")


def _hooks_line() -> str | None:
    """How pytest-eagle3's hooks reach the installed SGLang's processes (detected from its files)."""

    location, version = sglang_location_and_version()
    if location is None:
        return None
    return HEADER_HOOKS.format(loader=SGLangInstall(str(version), str(location), frozenset(), "").hook_loader)
