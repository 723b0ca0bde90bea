"""``--eagle3-plan``: the engines a run would start, printed without starting any.

After collection (and ``-m``/``-k`` deselection), every selected test is mapped
to the engine it would use, through the same path the fixtures take:
:func:`pytest_eagle3.capture.api.capture_server_args` for the test's id list, then
:func:`pytest_eagle3.engine.config.build_engine_config` with the installed
SGLang's flags (:func:`pytest_eagle3.sglang_source.install.probe`, cached), the run's
``--sglang-arg`` values and the model path the default ``eagle3_checkpoint``
fixture resolves (a preset's cache entry on this machine; a ``conftest.py``
that overrides the fixture is not seen).  Then pytest exits without running a
test, like ``--collect-only``; xdist is switched off (``-n`` is reported, not used).

How a test maps to an engine: a packaged test declares its engines once
(``@pytest.mark.eagle3_engines(...)``, :mod:`pytest_eagle3.planning.declare`)
and is generated with an ``eagle3_need`` parameter; the plan resolves that need
with :func:`~pytest_eagle3.planning.request.resolve` and builds its engine with
:func:`~pytest_eagle3.capture.api.engine_config`, exactly what the
``eagle3_engine_request`` and ``eagle3_capture`` fixtures do at run time, for
every engine of the test's engine set.  What the run
leaves out at collection is not in the plan; a test with a skip marker is
listed as skipped; a test that uses an engine fixture without a declaration,
or whose engine cannot be composed here, is listed under "engine determined at
run time" with the reason.

GPUs (``--device cuda``): each pytest process leases one block of ``--tp`` GPUs
for its session (:mod:`pytest_eagle3.engine.lease`); an engine gets
``CUDA_VISIBLE_DEVICES`` of that block and, where SGLang has ``--nccl-port``, a
port from the block's window.  Which block a test gets depends on the xdist
worker that runs it, so the plan names the blocks and the window of each.
On a machine without GPUs, ``--device cuda --eagle3-plan`` pretends
``--eagle3-plan-gpus`` GPUs (default 8, see :mod:`pytest_eagle3.plugin.resolve`).

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pytest

from pytest_eagle3.plugin import session as eagle3_session
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.plugin.run import get_run
from pytest_eagle3.settings import Settings
from pytest_eagle3.capture.api import cuda_recipe_for, engine_config
from pytest_eagle3.planning.declare import NeedContext
from pytest_eagle3.planning.request import resolve
from pytest_eagle3.engine.server import SGLangServer
from pytest_eagle3.engine import gpu_blocks, lease
from pytest_eagle3.plugin import gpu_workers
from pytest_eagle3.sglang_source import install as sglang_install
from pytest_eagle3.worker.cpu.spec_overlap import OVERLAP_ENV
from pytest_eagle3.worker.env import ID_SWITCH_ENV

if TYPE_CHECKING:
    from pytest_eagle3.engine.config import EngineConfig
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.target.spec import TargetFacts

#: Fixtures whose use means a test starts an engine.
ENGINE_FIXTURES = ("eagle3_capture", "eagle3_engine_pool")

TITLE = "eagle3 plan"
MSG_SUMMARY = (
    "nothing was started: {engines} engine(s) for {used} selected test(s); "
    "{skipped} skipped; {runtime} decided at run time; {free} without an engine"
)
MSG_RUN = "run: device {device}, --tp {tp}, target {target}, {sglang}"
MSG_MODEL = "model path: {path}"
MSG_CUDA_RECIPE = "cuda recipe: {recipe}"
MSG_CPU = "GPUs: none (--device cpu: no lease; each pytest process runs one engine at a time)"
MSG_GPUS = (
    "GPUs: {count} ({how}); blocks of {tp}: {blocks}; each pytest process (xdist worker) leases "
    "one block for its session (locks in {lock_dir})"
)
MSG_WORKERS = (
    "xdist: {n} (switched off for the plan; each worker starts the engines its own tests need); "
    "-n auto would run {auto} worker(s)"
)
MSG_ENGINE = "engine {n}: {name} (TP {tp}) for {count} test(s)"
MSG_ENGINE_IDS = "  ids, switched between requests (pytest_eagle3/worker/id_switch.py): {ids}"
MSG_ENGINE_DRAFTS = "  drafts: {what}, {steps} steps, top-k {topk}, {nodes} verified per request; {schedule}"
MSG_ENGINE_GPUS = (
    "  GPUs: CUDA_VISIBLE_DEVICES = the worker's block ({blocks}); TP {tp} uses the first {n} "
    "GPU(s) of it"
)
MSG_ENGINE_NCCL = "  nccl_port: from the block's window ({windows})"
MSG_NO_ENGINE_SECTION = "skipped, no engine starts for them ({count}):"
MSG_RUNTIME_SECTION = "engine determined at run time:"
MSG_NO_SGLANG = "SGLang: {error}"
RUNTIME_NO_CASE = "uses {fixture} but declares no engine (no eagle3_engines marker)"
PORT_PLACEHOLDER = "<free port>"
NCCL_PLACEHOLDER = "<port from the block window>"
BLOCK_PLACEHOLDER = "<the worker block>"


@dataclass
class PlannedEngine:
    """One engine and the tests that would use it."""

    config: "EngineConfig"
    tests: list[str] = field(default_factory=list)
    #: The aux layer id lists its tests capture (``None``: SGLang's default), in order.
    ids: list = field(default_factory=list)


@dataclass
class Plan:
    """What ``--eagle3-plan`` prints (see :func:`render`)."""

    settings: Settings
    engines: list[PlannedEngine] = field(default_factory=list)
    #: ``(nodeid, reason)`` of selected tests that will be skipped.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: ``(nodeid, why)`` of tests whose engine is only known at run time.
    runtime: list[tuple[str, str]] = field(default_factory=list)
    #: node ids of selected tests that use no engine.
    free: list[str] = field(default_factory=list)
    sglang: str = "sglang: not probed"
    model_path: str | None = None
    install: "SGLangInstall | None" = None
    #: ``-n`` as given (resolved by xdist), ``None`` without xdist.
    workers: int | None = None
    facts: "TargetFacts | None" = None

    def engine_for(self, config: "EngineConfig") -> PlannedEngine:
        for planned in self.engines:
            if planned.config == config:
                return planned
        planned = PlannedEngine(config)
        self.engines.append(planned)
        return planned


# --- building ---


def static_skip(item: pytest.Item) -> str | None:
    """The reason of a ``skip`` marker, or of a ``skipif`` whose conditions are plain
    booleans and true (string conditions are not evaluated: the test is planned)."""
    for mark in item.iter_markers(name="skip"):
        return str(mark.kwargs.get("reason", mark.args[0] if mark.args else "unconditional skip"))
    for mark in item.iter_markers(name="skipif"):
        conditions = tuple(mark.args)
        if not conditions and "condition" in mark.kwargs:
            conditions = (mark.kwargs["condition"],)
        if conditions and all(isinstance(c, bool) for c in conditions) and any(conditions):
            return str(mark.kwargs.get("reason", "skipif"))
    return None


def build_plan(items: Sequence[pytest.Item], settings: Settings, *,
               install: "SGLangInstall | None" = None, workers: int | None = None) -> Plan:
    """Map each selected test to the engine it would start (nothing is started).

    ``install`` defaults to the cached probe of the installed SGLang; a missing or
    broken SGLang is reported in the plan, not raised.
    """

    plan = Plan(settings, workers=workers)
    problem: str | None = None
    facts = None
    try:
        plan.model_path, facts = eagle3_session.target_model(settings)
        plan.facts = facts
    except Eagle3Error as exc:
        problem = f"target {settings.target}: {exc}"
    if install is None and problem is None:
        try:
            install = sglang_install.probe(settings.cache_dir)
        except Eagle3Error as exc:
            problem = MSG_NO_SGLANG.format(error=exc)
            plan.sglang = problem
    if install is not None:
        plan.install = install
        plan.sglang = install.describe()

    for item in items:
        nodeid = item.nodeid
        reason = static_skip(item)
        if reason is not None:
            plan.skipped.append((nodeid, reason))
            continue
        fixturenames = getattr(item, "fixturenames", ())
        engine_fixture = next((f for f in ENGINE_FIXTURES if f in fixturenames), None)
        if engine_fixture is None:
            plan.free.append(nodeid)
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        need = params.get(eagle3_session.NEED_ARGNAME)
        if need is None:
            plan.runtime.append((nodeid, RUNTIME_NO_CASE.format(fixture=engine_fixture)))
            continue
        if problem is not None or install is None or facts is None:
            plan.runtime.append((nodeid, problem or "SGLang not probed"))
            continue
        tp = eagle3_session.item_tp(item)
        try:
            configs = []
            for member in need.engine_set().values():  # the test's engine set, in order
                request = resolve(member, NeedContext(settings, tp, install, facts))
                configs.append((engine_config(install, settings, model_path=str(plan.model_path), tp=tp,
                                              ids=request.ids, extra_args=request.extra_args, facts=facts,
                                              draft=request.draft), request.ids))
        except Eagle3Error as exc:
            plan.runtime.append((nodeid, f"{type(exc).__name__}: {exc}"))
            continue
        for config, ids in configs:
            planned = plan.engine_for(config)
            planned.tests.append(nodeid)
            if ids not in planned.ids:
                planned.ids.append(ids)
    return plan


# --- rendering ---


def command_line(config: "EngineConfig", *, nccl_port: bool = False) -> str:
    """The ``launch_server`` command the engine would run (shell-quoted), with
    placeholders (unquoted, in angle brackets) for the ports chosen at each start."""

    argv = SGLangServer(config.name, config.args(), log_dir=Path(".")).argv()
    argv[0] = Path(sys.executable).name if argv[0] == sys.executable else argv[0]
    tail = f" --nccl-port {NCCL_PLACEHOLDER}" if nccl_port else ""
    return f"{shlex.join(argv)}{tail} --port {PORT_PLACEHOLDER}"


def _env_line(env: dict[str, str], placeholders: dict[str, str]) -> str:
    items = {k: shlex.quote(v) for k, v in env.items()}
    items.update(placeholders)
    return " ".join(f"{k}={v}" for k, v in sorted(items.items())) or "(none)"


def render(plan: Plan) -> list[str]:
    """The plan as terminal lines (see the module docstring for what each says)."""

    s = plan.settings
    # A test with an engine set is listed under each of its engines, counted once.
    used = len({nodeid for e in plan.engines for nodeid in e.tests})
    lines = [
        MSG_SUMMARY.format(engines=len(plan.engines), used=used, skipped=len(plan.skipped),
                           runtime=len(plan.runtime), free=len(plan.free)),
        MSG_RUN.format(device=s.device, tp=s.tp, target=s.target, sglang=plan.sglang),
    ]
    if plan.model_path:
        lines.append(MSG_MODEL.format(path=plan.model_path))
    if s.device == "cuda" and plan.install is not None:
        lines.append(MSG_CUDA_RECIPE.format(recipe=cuda_recipe_for(plan.install, s, plan.facts).describe()))
    blocks: list[gpu_blocks.GpuBlock] = []
    if s.device == "cuda":
        try:
            blocks = gpu_blocks.settings_blocks(s)
        except Eagle3Error as exc:
            lines.append(f"GPUs: {exc}")
        else:
            lines.append(MSG_GPUS.format(count=s.gpu.count, how=s.gpu.how, tp=s.tp * s.pp,
                                         blocks=gpu_blocks.describe_blocks(blocks), lock_dir=lease.default_lock_dir()))
    else:
        lines.append(MSG_CPU)
    if plan.workers:
        lines.append(MSG_WORKERS.format(n=f"-n {plan.workers}", auto=gpu_workers.auto_num_workers(s)))
    nccl = bool(blocks) and plan.install is not None and plan.install.has_arg("nccl_port")
    for n, planned in enumerate(plan.engines, 1):
        config = planned.config
        lines.append(MSG_ENGINE.format(n=n, name=config.name, tp=config.tp, count=len(planned.tests)))
        lines.append(f"  chosen: {config.describe()}")
        drafts = _drafts_line(config)
        if drafts:
            lines.append(drafts)
        if config.env_dict().get(ID_SWITCH_ENV) == "1":
            lines.append(MSG_ENGINE_IDS.format(ids="; ".join(
                str(list(i)) if i is not None else "SGLang's default" for i in planned.ids)))
        if blocks:
            pp = int(dict(config.server_args).get("pp_size") or 1)
            lines.append(MSG_ENGINE_GPUS.format(blocks=gpu_blocks.describe_blocks(blocks),
                                                tp=config.tp if pp == 1 else f"{config.tp} x PP {pp}",
                                                n=config.tp * pp))
            if nccl:
                windows = ", ".join(f"{b.ports.start}-{b.ports.stop - 1}" for b in blocks)
                lines.append(MSG_ENGINE_NCCL.format(windows=windows))
        env = config.env_dict()
        placeholders = {}
        if len(blocks) == 1:
            env["CUDA_VISIBLE_DEVICES"] = blocks[0].label
        elif blocks:
            placeholders["CUDA_VISIBLE_DEVICES"] = BLOCK_PLACEHOLDER
        lines.append("  env: " + _env_line(env, placeholders))
        lines.append(f"  command: {command_line(config, nccl_port=nccl)}")
        lines.append("  tests:")
        lines += [f"    {nodeid}" for nodeid in planned.tests]
    if plan.skipped:
        lines.append(MSG_NO_ENGINE_SECTION.format(count=len(plan.skipped)))
        by_reason: dict[str, list[str]] = {}
        for nodeid, reason in plan.skipped:
            by_reason.setdefault(reason, []).append(nodeid)
        for reason, nodeids in by_reason.items():
            lines.append(f"  {reason}:")
            lines += [f"    {nodeid}" for nodeid in nodeids]
    if plan.runtime:
        lines.append(MSG_RUNTIME_SECTION)
        lines += [f"  {nodeid}: {why}" for nodeid, why in plan.runtime]
    return lines


# --- pytest glue (called from plugin.py) ---


def switch_off_xdist(config: pytest.Config) -> None:
    """Plan mode runs in one process: remember ``-n`` for the report, then keep
    xdist from starting workers (its ``pytest_configure`` runs after ours)."""
    workers = getattr(config.option, "numprocesses", None)
    get_run(config).xdist_workers = workers if isinstance(workers, int) else None
    if getattr(config.option, "dist", "no") != "no":
        config.option.dist = "no"
    if getattr(config.option, "tx", None):
        config.option.tx = []


def write_plan(session: pytest.Session, settings: Settings) -> None:
    """Build the plan for ``session.items`` and write it to the terminal."""
    plan = build_plan(session.items, settings, workers=get_run(session.config).xdist_workers)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    reporter.write_sep("=", TITLE)
    for line in render(plan):
        reporter.write_line(line)


def _drafts_line(config: "EngineConfig") -> str | None:
    """Whether a speculative engine drafts a chain or a token tree, and its schedule
    (:mod:`pytest_eagle3.engine.spec_shapes`); ``None`` for an engine without a draft."""
    args = config.args()
    if not args.get("speculative_draft_model_path"):
        return None
    topk = int(args.get("speculative_eagle_topk") or 1)
    if config.env_dict().get(OVERLAP_ENV) == "1" or args.get("disable_overlap_schedule") is False:
        schedule = "SGLang's overlap schedule"
    elif args.get("disable_overlap_schedule") or config.device == "cpu":
        schedule = "no overlap schedule"
    else:
        schedule = "SGLang's default schedule (overlap)"
    return MSG_ENGINE_DRAFTS.format(what="a token tree" if topk > 1 else "a chain",
                                   steps=args.get("speculative_num_steps"), topk=topk,
                                   nodes=args.get("speculative_num_draft_tokens"), schedule=schedule)
