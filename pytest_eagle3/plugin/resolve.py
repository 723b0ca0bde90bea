"""Settings resolution: the ``eagle3`` options, environment variables and ini
keys of a run into one :class:`~pytest_eagle3.settings.Settings`.

Every value is resolved once, in ``pytest_configure``, with the source of each
value (``"cli"``, ``"env"``, ``"ini"`` or ``"default"``) kept for the report
header.  Precedence: command line > environment > ini file > default (the
pytest-django order), decided for every setting by :func:`option_with_source`.

Nothing here imports torch, transformers or sglang.  GPU presence is probed with
``CUDA_VISIBLE_DEVICES``, ``nvidia-smi -L`` and ``/dev/nvidia<N>``
(:func:`pytest_eagle3.engine.gpus.detect_gpus`).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from pytest_eagle3.engine.gpus import detect_gpus
from pytest_eagle3.plugin.options import (
    DEFAULT_PLAN_GPUS, ENV_CACHE, ENV_CPU_NORM, ENV_TARGET, INI_CACHE, INI_SGLANG_ARGS, INI_STARTUP_TIMEOUT,
    INI_TARGET,
)
from pytest_eagle3.plugin.parsers import join, parse_sglang_arg, parse_timeout
from pytest_eagle3.plugin.validate import validate_settings
from pytest_eagle3.settings import DEFAULT_STARTUP_TIMEOUT, DEFAULT_TARGETS, GpuProbe, Settings, default_cache_dir
from pytest_eagle3.sglang_source.norm_code import AUTO, NORM_PATHS
from pytest_eagle3.worker.env import FAULT_ENV
from pytest_eagle3.worker.faults import FaultError, read_fault

MSG_PLAN_GPUS_ALONE = "--eagle3-plan-gpus goes with --eagle3-plan (it only pretends GPUs for the plan)"
PLAN_GPU_PROBE = "--eagle3-plan: pretending {count} GPUs ({why})"
MSG_PP_DISAGREE = ("--eagle3-pp {pp} and the server argument pp_size={value!r} disagree: give the "
                   "pipeline-parallel size once (--eagle3-pp N)")


def option_with_source(config: pytest.Config, *, dest: str | None = None, env: str | None = None,
                       ini: str | None = None, default: Any = None) -> tuple[Any, str]:
    """The value of one setting and where it came from: the command-line option
    stored as ``dest``, else the environment variable ``env``, else the ini key
    ``ini``, else ``default`` (the first one set and not empty wins).

    Returns:
        ``(value, source)``, ``source`` one of ``"cli"``, ``"env"``, ``"ini"``,
        ``"default"``; the value as given (a string from env and ini).
    """
    value = getattr(config.option, dest, None) if dest else None
    if value:
        return value, "cli"
    if env and os.environ.get(env):
        return os.environ[env], "env"
    value = ini_value(config, ini) if ini else None
    if value:
        return value, "ini"
    return default, "default"


def requested_target(config: pytest.Config) -> str | None:
    """The ``--eagle3-target`` value asked for (CLI > env > ini), before any
    validation; ``None`` when the device default applies."""
    return option_with_source(config, dest="eagle3_target", env=ENV_TARGET, ini=INI_TARGET)[0] or None


#: The run's GPU probe (``nvidia-smi`` / ``/dev/nvidia<N>``), made once per pytest config:
#: ``-n auto``, ``--eagle3-list-variants`` and ``pytest_configure`` each resolve settings.
GPU_PROBE_KEY = pytest.StashKey[GpuProbe]()


def resolve_settings(config: pytest.Config, *, validate: bool = True) -> Settings:
    """Resolve every eagle3 value once (CLI > env > ini > default).

    Raises:
        pytest.UsageError: one line, when ``validate`` and the combination is
            unusable (``--device cuda`` with no GPU, too few GPUs for ``--tp``,
            an unwritable cache directory).
    """
    sources: dict[str, str] = {}
    opt = config.option

    tp, sources["tp"] = option_with_source(config, dest="eagle3_tp", default=1)
    pp, sources["pp"] = option_with_source(config, dest="eagle3_pp", default=1)

    gpu = config.stash.get(GPU_PROBE_KEY, None)
    if gpu is None:  # probed once per run, however many hooks resolve settings
        gpu = config.stash[GPU_PROBE_KEY] = detect_gpus(os.environ)
    plan = bool(getattr(opt, "eagle3_plan", False))
    plan_gpus = getattr(opt, "eagle3_plan_gpus", None)
    if plan_gpus is not None and validate and not plan:
        raise pytest.UsageError(MSG_PLAN_GPUS_ALONE)
    if plan and plan_gpus is not None:
        # A plan for a machine with N GPUs, whatever this one has.
        gpu = GpuProbe(plan_gpus, PLAN_GPU_PROBE.format(count=plan_gpus, why="--eagle3-plan-gpus"))
    device, sources["device"] = option_with_source(config, dest="eagle3_device",
                                                   default="cuda" if gpu.count > 0 else "cpu")
    if plan and device == "cuda" and gpu.count == 0:
        # Review a GPU run on a CPU machine: nothing starts, so no GPU is needed.
        gpu = GpuProbe(DEFAULT_PLAN_GPUS, PLAN_GPU_PROBE.format(count=DEFAULT_PLAN_GPUS, why=gpu.how))

    target, sources["target"] = option_with_source(config, dest="eagle3_target", env=ENV_TARGET, ini=INI_TARGET,
                                                   default=DEFAULT_TARGETS[device])

    cache, sources["cache_dir"] = option_with_source(config, dest="eagle3_cache", env=ENV_CACHE, ini=INI_CACHE)
    if sources["cache_dir"] == "default":
        cache_dir = default_cache_dir(os.environ)[0]
    else:
        cache_dir = Path(cache).expanduser()
        if sources["cache_dir"] == "ini" and not cache_dir.is_absolute():
            cache_dir = Path(config.rootpath) / cache_dir
    cache_dir = cache_dir.absolute()

    rebuild, sources["rebuild"] = option_with_source(config, dest="eagle3_rebuild", default=False)

    args: list[tuple[str, Any]] = []
    arg_sources: list[str] = []
    ini_lines = [line for line in (ini_value(config, INI_SGLANG_ARGS) or []) if line.strip()]
    if ini_lines:
        args += [parse_sglang_arg(line, flag=INI_SGLANG_ARGS) for line in ini_lines]
        arg_sources.append("ini")
    cli_args = getattr(opt, "eagle3_sglang_args", None)
    if cli_args:
        args += list(cli_args)
        arg_sources.append("cli")
    # --eagle3-pp is SGLang's --pp-size for every engine; a pp_size among the server
    # args is the same setting (the PP gate is read for it too), and the two must agree.
    given = [value for name, value in args if name.replace("-", "_") == "pp_size"]
    if given:
        try:
            arg_pp = int(given[-1])
        except (TypeError, ValueError):
            arg_pp = 0
        if arg_pp < 1 or (sources["pp"] != "default" and arg_pp != pp):
            if validate:
                raise pytest.UsageError(MSG_PP_DISAGREE.format(pp=pp, value=given[-1]))
        else:
            pp = arg_pp
    elif pp > 1:
        args.append(("pp_size", pp))
        if "cli" not in arg_sources:
            arg_sources.append("cli")
    sources["sglang_args"] = "+".join(arg_sources) or "default"

    timeout, sources["startup_timeout"] = option_with_source(config, dest="eagle3_startup_timeout",
                                                             ini=INI_STARTUP_TIMEOUT, default=DEFAULT_STARTUP_TIMEOUT)
    if sources["startup_timeout"] == "ini":
        timeout = parse_timeout(timeout, flag=INI_STARTUP_TIMEOUT)

    cpu_norm, sources["cpu_norm"] = option_with_source(config, dest="eagle3_cpu_norm", env=ENV_CPU_NORM, default=AUTO)
    if validate and sources["cpu_norm"] == "env" and cpu_norm not in NORM_PATHS:
        raise pytest.UsageError(f"{ENV_CPU_NORM}={cpu_norm!r}: expected {join(NORM_PATHS)}")

    draft = getattr(opt, "eagle3_draft", None)
    settings = Settings(
        tp=tp, pp=pp, device=device, target=str(target), cache_dir=cache_dir, rebuild=bool(rebuild),
        sglang_args=tuple(args), startup_timeout=float(timeout),
        sources=MappingProxyType(sources), gpu=gpu,
        draft=Path(draft).expanduser() if draft else None,
        stack=getattr(opt, "eagle3_stack", None),
        slow=bool(getattr(opt, "eagle3_slow", False)), plan=plan,
        bisect=bool(getattr(opt, "eagle3_bisect", False)),
        capture_method=str(getattr(opt, "eagle3_capture_method", "auto") or "auto"),
        fault=_resolve_fault(config, sources) if validate else getattr(opt, "eagle3_fault", None),
        min_accept_length=getattr(opt, "eagle3_min_accept_length", None),
        min_accept_rate=getattr(opt, "eagle3_min_accept_rate", None),
        prefetch=bool(getattr(opt, "eagle3_prefetch", False)),
        id_switch=bool(getattr(opt, "eagle3_id_switch", True)), cpu_norm=str(cpu_norm),
        cpu_allreduce_fusion=bool(getattr(opt, "eagle3_cpu_allreduce_fusion", False)),
        prompts=_prompts_path(getattr(opt, "eagle3_prompts", None), validate),
        report=Path(getattr(opt, "eagle3_report")).expanduser() if getattr(opt, "eagle3_report", None) else None,
    )
    if validate:
        validate_settings(settings)
    return settings


def _resolve_fault(config: pytest.Config, sources: dict[str, str]) -> str | None:
    """``--eagle3-fault`` (else env ``PYTEST_EAGLE3_FAULT``), checked against the catalog.

    Raises:
        pytest.UsageError: unknown kind or bad JSON (one line).
    """
    raw, source = option_with_source(config, dest="eagle3_fault", env=FAULT_ENV)
    if not raw:
        return None
    try:
        read_fault({FAULT_ENV: raw})
    except FaultError as exc:
        raise pytest.UsageError(f"--eagle3-fault: {exc}") from None
    sources["fault"] = source
    return raw


def _prompts_path(value: str | None, validate: bool) -> Path | None:
    """``--eagle3-prompts``: a path (``~`` expanded); an empty value is a usage error."""
    if value is None:
        return None
    if not value.strip():
        if validate:
            raise pytest.UsageError("--eagle3-prompts: expected a file of prompts, got an empty path")
        return None
    return Path(value).expanduser()


def ini_value(config: pytest.Config, name: str) -> Any:
    """``config.getini(name)``; ``None`` when the key is not registered (plugin options not added)."""
    try:
        return config.getini(name)
    except ValueError:  # key not registered (plugin options not added)
        return None
