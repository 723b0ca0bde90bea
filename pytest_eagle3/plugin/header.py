"""The ``eagle3:`` lines of the report header: the installed SGLang and libraries,
how hooks reach SGLang's processes, the CPU norm and fusion paths, the run's
settings with the source of each value that is not a default (``(from cli)``,
``(from env)``, ``(from ini)``), the fault, the upstream fix the engines run with, the GPU blocks.

Read from the installed files, without importing torch, transformers or sglang.
"""

from __future__ import annotations

import pytest

import os

from pytest_eagle3.engine import gpu_blocks, lease
from pytest_eagle3.engine.inherited_env import describe_removed
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.libversions import module_version
from pytest_eagle3.plugin.run import get_run, get_settings
from pytest_eagle3.settings import Settings
from pytest_eagle3.sglang_source.fusion_code import fusion_code_at
from pytest_eagle3.sglang_source.install import SGLangInstall, sglang_location_and_version
from pytest_eagle3.sglang_source.norm_code import norm_code_at, resolve_norm_path
from pytest_eagle3.worker.faults import describe, read_fault
from pytest_eagle3.worker.upstream_fixes import CATALOG as FIXES
from pytest_eagle3.worker.upstream_fixes import UpstreamFixError, read_fix

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
HEADER_FIX = ("eagle3: UPSTREAM FIX ON (PYTEST_EAGLE3_UPSTREAM_FIX={fix}; every engine runs it, "
              "verdicts are about SGLang with the fix): {what} [{source}]")
HEADER_SIMULATED = ("eagle3: {found} set here: removed from every engine's environment (SGLang would "
                    "simulate the accept length, srt/speculative/spec_utils.py); accept lengths here are measured")
HEADER_GPU_BLOCKS = "eagle3: gpu blocks of {tp}: {blocks} (one leased per pytest process; locks in {lock_dir})"


def header_lines(config: pytest.Config) -> list[str]:
    """The ``eagle3:`` lines of the report header (``pytest_report_header``)."""
    run = get_run(config)
    settings = get_settings(config)

    lines = [taken.header() for taken in run.taken]
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
    simulated = describe_removed(os.environ)
    if simulated is not None:
        lines.append(HEADER_SIMULATED.format(found=simulated))
    fix = _fix_line()
    if fix is not None:
        lines.append(fix)
    if settings.prompts is not None:
        lines.append(f"eagle3: prompts {settings.prompts} (--eagle3-prompts)")
    if settings.prefetch:
        lines.append("eagle3: engine prefetch on (--eagle3-prefetch): the run's next engine starts while the current one serves")
    if settings.sglang_args:
        args = " ".join(f"{k}={v!r}" for k, v in settings.sglang_args)
        lines.append(HEADER_SGLANG_ARGS.format(args=args) + _src(settings, "sglang_args"))
    if settings.device == "cuda":
        try:
            blocks = gpu_blocks.describe_blocks(gpu_blocks.settings_blocks(settings))
        except Eagle3Error as exc:
            blocks = str(exc)
        lines.append(HEADER_GPU_BLOCKS.format(tp=settings.tp * settings.pp, blocks=blocks, lock_dir=lease.default_lock_dir()))
    return lines


def _src(settings: Settings, name: str) -> str:
    source = settings.source(name)
    return "" if source == "default" else f" (from {source})"


def _sglang_line() -> str:
    """Version and location of the importable ``sglang`` package, without importing it."""

    location, version = sglang_location_and_version()
    if location is None:
        return HEADER_NO_SGLANG
    return HEADER_SGLANG.format(version=version, location=location)


def _norm_line(settings: Settings) -> str | None:
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


def collection_lines(config: pytest.Config) -> list[str]:
    """Where this run's id rule comes from (only for runs that collected declared
    eagle3 tests: the rule is read from the installed model file, well under a second)."""
    context = get_run(config).context
    if context is None:
        return []
    install, facts = context
    if install is None or facts is None:
        return []
    rule = install.id_rule(facts.architecture)
    if not rule.supported:
        return [HEADER_NO_EAGLE3.format(arch=facts.architecture, why=rule.source)]
    state = {True: "can be captured", False: "cannot be captured", None: "unknown (measured)"}
    return [HEADER_RULE.format(arch=facts.architecture, rule=rule.describe()),
            HEADER_LAYER0.format(state=state[rule.embedding.capturable], why=rule.embedding.why,
                                 source=rule.embedding.source)]


def _fix_line() -> str | None:
    """:data:`HEADER_FIX` where the environment names an upstream fix the engines inherit."""
    try:
        fix = read_fix()
    except UpstreamFixError as exc:
        return f"eagle3: {exc}"
    if fix is None:
        return None
    what, source = FIXES[fix]
    return HEADER_FIX.format(fix=fix, what=what, source=source)
