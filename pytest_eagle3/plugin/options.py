"""Command-line options of the ``eagle3`` group and the settings they resolve to.

Every value is resolved once, in ``pytest_configure``, into a frozen
:class:`Settings` stored under :data:`SETTINGS_KEY` in ``config.stash``, with
the source of each value (``"cli"``, ``"env"``, ``"ini"`` or ``"default"``) kept
for the report header.  Precedence: command line > environment > ini file >
default (the pytest-django order).

Nothing here imports torch, transformers or sglang: ``pytest --help`` must work
on a broken install.  GPU presence is probed with ``CUDA_VISIBLE_DEVICES``,
``nvidia-smi -L`` and ``/dev/nvidia<N>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from pytest_eagle3.target.checkpoint.cache import CACHE_ENV, default_cache_dir
from pytest_eagle3.engine.gpus import GpuProbe, detect_gpus
from pytest_eagle3.worker.env import FAULT_ENV
from pytest_eagle3.worker.faults import FaultError, read_fault
from pytest_eagle3.sglang_source.norm_code import AUTO, NORM_PATHS

#: Tensor-parallel sizes the suite knows how to run.
TP_CHOICES: tuple[int, ...] = (1, 2, 4, 8)
DEVICE_CHOICES: tuple[str, ...] = ("cpu", "cuda")
#: Target preset used when none is given, per device (presets: ``fixtures/targets/<name>.json``).
DEFAULT_TARGETS: Mapping[str, str] = MappingProxyType({"cpu": "tiny-dsv3", "cuda": "gpu-dsv3"})
DEFAULT_STARTUP_TIMEOUT = 600.0
#: ``--eagle3-capture-method`` values (``pytest_eagle3.capture.api`` method names).
CAPTURE_METHODS = ("auto", "capture-only", "eagle3-draft")
#: Env spelling of ``--eagle3-cpu-norm``.
ENV_CPU_NORM = "PYTEST_EAGLE3_CPU_NORM_PATH"
MSG_BAD_GATE = "{flag}: expected {what}, got {value!r}"


def _resolve_fault(value: str | None, sources: dict[str, str]) -> str | None:
    """``--eagle3-fault`` (else env ``PYTEST_EAGLE3_FAULT``), checked against the catalog.

    Raises:
        pytest.UsageError: unknown kind or bad JSON (one line).
    """

    raw, source = (value, "cli") if value else (os.environ.get(FAULT_ENV) or None, "env")
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


def parse_accept_length(value: str) -> float:
    """``--eagle3-min-accept-length``: a number >= 1 (tokens per verify; 1 = no draft token accepted)."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number >= 1.0 or number == float("inf"):
        raise pytest.UsageError(MSG_BAD_GATE.format(flag="--eagle3-min-accept-length",
                                                    what="a number of tokens >= 1 (e.g. 2.5)", value=value))
    return number


def parse_accept_rate(value: str) -> float:
    """``--eagle3-min-accept-rate``: a fraction in [0, 1]."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0.0 <= number <= 1.0:
        raise pytest.UsageError(MSG_BAD_GATE.format(flag="--eagle3-min-accept-rate",
                                                    what="a fraction between 0 and 1 (e.g. 0.6)", value=value))
    return number

ENV_TARGET = "PYTEST_EAGLE3_TARGET"
ENV_CACHE = CACHE_ENV

INI_TARGET = "eagle3_target"
INI_CACHE = "eagle3_cache"
INI_STARTUP_TIMEOUT = "eagle3_startup_timeout"
INI_SGLANG_ARGS = "eagle3_sglang_args"

# Messages (tests import these).
MSG_BAD_TP = "--eagle3-tp/--tp: expected one of {choices} (tensor-parallel ranks), got {value!r}"
MSG_BAD_DEVICE = "--eagle3-device/--device: expected one of {choices}, got {value!r}"
MSG_BAD_SGLANG_ARG = (
    "--sglang-arg: expected KEY=VALUE (VALUE is JSON when it parses, else a string), got {value!r}"
)
MSG_BAD_TIMEOUT = "{flag}: expected a positive number of seconds, got {value!r}"
MSG_DRAFT_NEEDS_STACK = (
    "--eagle3-draft and --eagle3-stack go together: name the draft directory and the "
    "stack that trained it (speculators, specforge, specforge-hf, specforge-sglang, eagle, vllm, raw)"
)
MSG_NO_GPU = (
    "--device cuda: no GPU is visible ({probe}); run with --device cpu, or fix CUDA_VISIBLE_DEVICES"
)
MSG_TOO_FEW_GPUS = (
    "--tp {tp} needs {tp} GPUs on --device cuda but {count} are visible ({probe}); "
    "lower --tp or make more GPUs visible"
)
MSG_PLAN_GPUS_ALONE = "--eagle3-plan-gpus goes with --eagle3-plan (it only pretends GPUs for the plan)"
MSG_BAD_PLAN_GPUS = "--eagle3-plan-gpus: expected a positive number of GPUs, got {value!r}"
#: GPUs ``--eagle3-plan`` pretends on ``--device cuda`` when none are visible here.
DEFAULT_PLAN_GPUS = 8
PLAN_GPU_PROBE = "--eagle3-plan: pretending {count} GPUs ({why})"
MSG_CACHE_NOT_WRITABLE = (
    "eagle3 cache {path} (from {source}) is not writable: {reason}; "
    "pass --eagle3-cache DIR or set " + ENV_CACHE + " to a writable directory"
)
MSG_TP_HEADS = (
    "--tp {tp} does not divide the target's {heads} attention heads; use --tp {valid}"
)


@dataclass(frozen=True)
class Settings:
    """The run's eagle3 settings, resolved once in ``pytest_configure``.

    Attributes:
        tp: tensor-parallel size of the run (one of :data:`TP_CHOICES`).
        device: ``"cpu"`` or ``"cuda"``.
        target: a preset name (``fixtures/targets/<name>.json``) or a path to a checkpoint directory.
        cache_dir: per-user cache of checkpoints and references (may not exist yet).
        rebuild: rebuild cached checkpoints and references instead of reusing them.
        sglang_args: extra SGLang server arguments as ``(key, value)`` pairs, in order
            (ini entries first, then ``--sglang-arg``; later pairs win).
        startup_timeout: seconds an engine may take to become ready.
        sources: value name -> ``"cli" | "env" | "ini" | "default"``.
        gpu: what the GPU probe saw (the reason an ``auto`` device resolved as it did).
        draft: the user's EAGLE-3 draft directory (``--eagle3-draft``), checked
            against its training contract by the contracts suite.
        stack: the training stack that produced ``draft`` (``--eagle3-stack``).
        slow: run tests marked ``slow`` (``--eagle3-slow``); they are skipped otherwise.
        plan: ``--eagle3-plan``: print the engines the selected tests would start,
            start nothing, run no test (:mod:`pytest_eagle3.plugin.plan`).
        bisect: ``--eagle3-bisect``: exit 0 / 1 / 125 for ``git bisect run``
            (:mod:`pytest_eagle3.plugin.bisect`).
        report: ``--eagle3-report FILE``: the JSON report (:mod:`pytest_eagle3.plugin.report`).
        capture_method: ``--eagle3-capture-method``: ``auto``, ``capture-only`` or ``eagle3-draft``.
        fault: ``--eagle3-fault`` (or env ``PYTEST_EAGLE3_FAULT``): a fault to inject into every
            engine (:mod:`pytest_eagle3.worker.faults`), as the env value; ``None``: none.
        min_accept_length, min_accept_rate: the acceptance gates (``None``: the draft's own).
        prompts: ``--eagle3-prompts FILE``: the prompts every engine is sent instead of the
            packaged ones (token ids or text: :mod:`pytest_eagle3.target.prompts`).
        prefetch: on cpu, start the run's next engine while the current one starts
            and serves (``--eagle3-no-prefetch`` turns it off; :mod:`pytest_eagle3.engine.pool`).
        cpu_norm: ``--eagle3-cpu-norm`` (env ``PYTEST_EAGLE3_CPU_NORM_PATH``): ``auto`` (SGLang's
            in-place AMX norm branch where the installed layernorm.py has one), ``inplace``,
            ``native`` (:mod:`pytest_eagle3.sglang_source.norm_code`).
        cpu_allreduce_fusion: ``--eagle3-cpu-allreduce-fusion``: on cpu, every engine at TP > 1
            runs SGLang's fused all-reduce + residual add + RMSNorm path with a gloo stand-in for
            the fused op (:mod:`pytest_eagle3.worker.cpu.allreduce_fusion`).
    """

    tp: int = 1
    device: str = "cpu"
    target: str = DEFAULT_TARGETS["cpu"]
    cache_dir: Path = field(default_factory=lambda: default_cache_dir()[0])
    rebuild: bool = False
    sglang_args: tuple[tuple[str, Any], ...] = ()
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    gpu: GpuProbe = GpuProbe(0, "not probed")
    draft: Path | None = None
    stack: str | None = None
    slow: bool = False
    plan: bool = False
    bisect: bool = False
    report: Path | None = None
    capture_method: str = "auto"
    fault: str | None = None
    min_accept_length: float | None = None
    min_accept_rate: float | None = None
    prefetch: bool = True
    prompts: Path | None = None
    cpu_norm: str = AUTO
    cpu_allreduce_fusion: bool = False

    def source(self, name: str) -> str:
        """Where ``name`` came from; ``"default"`` when unknown."""
        return self.sources.get(name, "default")

    def sglang_kwargs(self) -> dict[str, Any]:
        """``sglang_args`` as a dict (later pairs win)."""
        return dict(self.sglang_args)


SETTINGS_KEY = pytest.StashKey[Settings]()


# --- type= parsers: raise UsageError so pytest prints one line naming the flag ---


def parse_tp(value: str) -> int:
    """``--tp`` parser: one of :data:`TP_CHOICES`."""
    try:
        tp = int(value)
    except ValueError:
        tp = -1
    if tp not in TP_CHOICES:
        raise pytest.UsageError(MSG_BAD_TP.format(choices=_join(TP_CHOICES), value=value))
    return tp


def parse_device(value: str) -> str | None:
    """``--device`` parser: ``cpu`` or ``cuda``; ``auto`` (the default) -> ``None``."""
    device = value.strip().lower()
    if device == "auto":
        return None
    if device not in DEVICE_CHOICES:
        raise pytest.UsageError(MSG_BAD_DEVICE.format(choices="|".join((*DEVICE_CHOICES, "auto")), value=value))
    return device


def parse_sglang_arg(value: str, *, flag: str = "--sglang-arg") -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(key, value)``; dashes in KEY become underscores
    (``disable-cuda-graph=true`` -> ``("disable_cuda_graph", True)``).

    VALUE is decoded as JSON when it parses (``true``, ``0.5``, ``[3, 31]``), else
    kept as the string.
    """
    key, sep, raw = value.partition("=")
    key = key.strip().lstrip("-").replace("-", "_")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key):
        msg = MSG_BAD_SGLANG_ARG.format(value=value)
        raise pytest.UsageError(msg.replace("--sglang-arg", flag, 1))
    try:
        decoded: Any = json.loads(raw)
    except ValueError:
        decoded = raw
    return key, decoded


def parse_timeout(value: str, *, flag: str = "--eagle3-startup-timeout") -> float:
    """Positive seconds."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise pytest.UsageError(MSG_BAD_TIMEOUT.format(flag=flag, value=value))
    return seconds


def parse_plan_gpus(value: str) -> int:
    """``--eagle3-plan-gpus`` parser: a positive integer."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise pytest.UsageError(MSG_BAD_PLAN_GPUS.format(value=value))
    return count


#: ``addoption`` keywords of the options that also have a short spelling.
SPELLED_OPTIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "--eagle3-tp": MappingProxyType(dict(
        dest="eagle3_tp", metavar="N", type=parse_tp, default=None,
        help="tensor-parallel size of the run, one of 1, 2, 4, 8 (default 1); tests marked "
        "tp(n) with n above it are skipped")),
    "--eagle3-device": MappingProxyType(dict(
        dest="eagle3_device", metavar="cpu|cuda", type=parse_device, default=None,
        help="where SGLang runs (default auto: cuda when a GPU is visible, else cpu)")),
    "--eagle3-sglang-arg": MappingProxyType(dict(
        dest="eagle3_sglang_args", metavar="KEY=VALUE", action="append", type=parse_sglang_arg, default=None,
        help="extra SGLang server argument, repeatable; VALUE is JSON when it parses "
        "(e.g. --eagle3-sglang-arg attention_backend=triton --eagle3-sglang-arg disable_cuda_graph=true)")),
})


def add_options(parser: pytest.Parser) -> None:
    """Register the ``eagle3`` option group and its ini keys."""
    group = parser.getgroup("eagle3", "EAGLE-3 aux hidden states (pytest-eagle3)")
    for name in ("--eagle3-tp", "--eagle3-device"):
        group.addoption(name, **SPELLED_OPTIONS[name])
    group.addoption(
        "--eagle3-target", dest="eagle3_target", metavar="PRESET|PATH", default=None,
        help=f"target model preset or checkpoint directory (default {DEFAULT_TARGETS['cpu']} "
        f"on cpu; 'families': one run per model-family preset; env {ENV_TARGET}, ini {INI_TARGET})",
    )
    group.addoption(
        "--eagle3-cache", dest="eagle3_cache", metavar="DIR", default=None,
        help=f"cache of built checkpoints and references (default ${ENV_CACHE}, else "
        "$XDG_CACHE_HOME/pytest-eagle3, else ~/.cache/pytest-eagle3)",
    )
    group.addoption(
        "--eagle3-rebuild", dest="eagle3_rebuild", action="store_true", default=False,
        help="rebuild cached checkpoints and references instead of reusing them",
    )
    group.addoption("--eagle3-sglang-arg", **SPELLED_OPTIONS["--eagle3-sglang-arg"])
    group.addoption(
        "--eagle3-startup-timeout", dest="eagle3_startup_timeout", metavar="SECONDS",
        type=parse_timeout, default=None,
        help=f"seconds an SGLang engine may take to become ready (default {DEFAULT_STARTUP_TIMEOUT:g})",
    )
    group.addoption(
        "--eagle3-slow", dest="eagle3_slow", action="store_true", default=False,
        help="also run tests marked slow (path variants with an engine of their own, TP 8 on cpu)",
    )
    group.addoption(
        "--eagle3-prompts", dest="eagle3_prompts", metavar="FILE", default=None,
        help="prompts to send instead of the packaged ones: JSON {\"prompts\": [[ids...] | \"text\", ...]} "
        "or a text file, one prompt per line (text needs the target's tokenizer); used by the capture "
        "tests and by the acceptance test of a draft without continuations.json",
    )
    group.addoption(
        "--eagle3-no-prefetch", dest="eagle3_prefetch", action="store_false", default=True,
        help="on cpu, start each engine only when a test needs it (default: the next engine of "
        "the run starts in the background while the current one serves, if memory allows)",
    )
    group.addoption(
        "--eagle3-draft", dest="eagle3_draft", metavar="PATH", default=None,
        help="your EAGLE-3 draft directory (config.json, fc weight): the contracts suite "
        "checks SGLang captures what it was trained on (needs --eagle3-stack)",
    )
    group.addoption(
        "--eagle3-stack", dest="eagle3_stack", metavar="NAME", default=None,
        help="training stack of --eagle3-draft: speculators, specforge (0.2), specforge-hf (older SpecForge), "
        "specforge-sglang, eagle, vllm or raw",
    )
    group.addoption(
        "--eagle3-list-variants", dest="eagle3_list_variants", action="store_true", default=False,
        help="print the path matrix (server-arg variants of the capture tests) with what runs "
        "here for this --device/--tp and why the rest is skipped, then exit without running tests",
    )
    group.addoption(
        "--eagle3-plan", dest="eagle3_plan", action="store_true", default=False,
        help="print every SGLang engine the selected tests would start (server args, env, "
        "GPUs, TP) and exit without starting any or running tests; -n is ignored",
    )
    group.addoption(
        "--eagle3-plan-gpus", dest="eagle3_plan_gpus", metavar="N", type=parse_plan_gpus, default=None,
        help=f"with --eagle3-plan: plan as if N GPUs were visible (default: the GPUs visible "
        f"here, else {DEFAULT_PLAN_GPUS} on --device cuda)",
    )
    group.addoption(
        "--eagle3-capture-method", dest="eagle3_capture_method", default="auto",
        choices=CAPTURE_METHODS,
        help="how the capture tests read SGLang's aux hidden states: capture-only "
        "(--enable-return-aux-hidden-states, SGLang 0.5.23+), eagle3-draft (an EAGLE-3 draft "
        "loaded, --enable-return-hidden-states: any SGLang serving DeepSeek EAGLE-3), or auto "
        "(capture-only where the installed SGLang has it)",
    )
    group.addoption(
        "--eagle3-min-accept-length", dest="eagle3_min_accept_length", metavar="TOKENS",
        type=parse_accept_length, default=None,
        help="acceptance gate: minimum mean accept length (tokens per verify, 1..steps+1); "
        "default: the shipped draft's gate (fixtures/drafts/<preset>/quality.json)",
    )
    group.addoption(
        "--eagle3-min-accept-rate", dest="eagle3_min_accept_rate", metavar="RATE",
        type=parse_accept_rate, default=None,
        help="acceptance gate: minimum accept rate (accepted / proposed drafts, 0..1); default: the draft's gate",
    )
    group.addoption(
        "--eagle3-fault", dest="eagle3_fault", metavar="KIND|JSON", default=None,
        help="self-test: inject a wiring fault into SGLang's own computation in every engine of "
        "this run (pytest_eagle3/worker/faults.py CATALOG); the suite must then fail and name it. "
        "Env PYTEST_EAGLE3_FAULT",
    )
    group.addoption(
        "--eagle3-cpu-norm", dest="eagle3_cpu_norm", choices=NORM_PATHS, default=None,
        help="on cpu, the norm path SGLang runs: inplace (its AMX branch, fused_add_rmsnorm_cpu "
        "overwriting x and residual, as on Xeon AMX servers and like CUDA), native (forward_native, "
        f"out of place) or auto (inplace where the installed layernorm.py has the branch; the default). "
        f"Env {ENV_CPU_NORM}",
    )
    group.addoption(
        "--eagle3-cpu-allreduce-fusion", dest="eagle3_cpu_allreduce_fusion", action="store_true",
        default=False,
        help="on cpu, every engine at TP > 1 runs SGLang's all-reduce fusion path (the MLP and "
        "attention all-reduces deferred into the next layer's fused all-reduce + add + RMSNorm, as "
        "on Hopper/Blackwell), the fused op served by a gloo stand-in; docs/cpu-tier.md",
    )
    group.addoption(
        "--eagle3-bisect", dest="eagle3_bisect", action="store_true", default=False,
        help="git bisect run mode: run the smallest set of tests that decides (the wide case's "
        "engine at the smallest TP) and exit 0 (wiring good), 1 (a wiring assertion failed) or "
        "125 (this commit cannot be tested: SGLang does not import, the engine does not start, "
        "a feature is missing)",
    )
    group.addoption(
        "--eagle3-report", dest="eagle3_report", metavar="FILE", default=None,
        help="write a JSON report of every pytest-eagle3 test (SGLang version and commit, "
        "server args, contract, per-slot best match and error, per-rank results); schema in docs/report.md",
    )
    parser.addini(INI_TARGET, "eagle3 target preset or checkpoint path (see --eagle3-target)")
    parser.addini(INI_CACHE, "eagle3 cache directory (see --eagle3-cache)")
    parser.addini(INI_STARTUP_TIMEOUT, "seconds an SGLang engine may take to start")
    parser.addini(INI_SGLANG_ARGS, "extra SGLang server arguments, one KEY=VALUE a line", type="linelist")


#: The short spellings pytest-eagle3 is known by -> the option each stands for.
SHORT_SPELLINGS: Mapping[str, str] = MappingProxyType({
    "--tp": "--eagle3-tp", "--device": "--eagle3-device", "--sglang-arg": "--eagle3-sglang-arg",
})
HEADER_SPELLING_TAKEN = "eagle3: {short} belongs to {owner} here; pytest-eagle3's is {long}"
ANONYMOUS_OWNER = "custom options (a conftest's parser.addoption)"


def parser_groups(parser: pytest.Parser) -> list[tuple[str, Any]]:
    """``(title, group)`` of the parser's named option groups (pytest 8 keeps the
    title as ``description``, pytest 9 on the argparse group)."""
    named = []
    for group in parser._groups:
        if group is parser._anonymous:
            continue
        title = getattr(group, "description", None) or getattr(getattr(group, "_arggroup", None), "title", None)
        named.append((f"option group {title or group.name!r}", group))
    return named


@dataclass(frozen=True)
class TakenSpelling:
    """A short spelling another option already had when pytest-eagle3 looked.

    Attributes:
        short: e.g. ``"--device"``.
        long: pytest-eagle3's own name for it, e.g. ``"--eagle3-device"``.
        owner: the option group that holds it, e.g. ``"custom options"`` (a conftest's
            ``parser.addoption``) or another plugin's group title.
    """

    short: str
    long: str
    owner: str

    def header(self) -> str:
        return HEADER_SPELLING_TAKEN.format(short=self.short, owner=self.owner, long=self.long)


TAKEN_KEY = pytest.StashKey[tuple[TakenSpelling, ...]]()


def add_short_spellings(parser: pytest.Parser) -> tuple[TakenSpelling, ...]:
    """Add ``--tp``, ``--device`` and ``--sglang-arg`` as second names of the
    ``--eagle3-*`` options, each only where no other option has it yet.

    Called once the initial conftests are loaded (their ``pytest_addoption`` has
    run) and before pytest parses the command line for good, so a project's own
    ``--device`` wins and pytest-eagle3 keeps its ``--eagle3-device``.  Reads the
    parser's option groups (pytest's ``Parser._groups`` / ``_anonymous``, present
    in every pytest this plugin supports); when they cannot be read, nothing is
    added and the ``--eagle3-*`` names still work.

    Returns:
        the short spellings another option already had.
    """
    owners: dict[str, str] = {}
    try:
        groups = [(ANONYMOUS_OWNER, parser._anonymous), *parser_groups(parser)]
        for title, group in groups:
            for argument in group.options:
                for name in argument.names():
                    owners.setdefault(name, title)
        group = parser.getgroup("eagle3")
    except (AttributeError, TypeError):
        return ()
    taken = []
    for short, long in SHORT_SPELLINGS.items():
        if short in owners:
            taken.append(TakenSpelling(short, long, owners[short]))
            continue
        if long not in owners:
            continue  # pytest-eagle3's own option is not there (options not added)
        attrs = dict(SPELLED_OPTIONS[long], help=f"short for {long}, where no other option is called {short}")
        try:
            group.addoption(short, **attrs)
        except (argparse.ArgumentError, ValueError):
            # Known to argparse but not to pytest's groups (added some other way).
            taken.append(TakenSpelling(short, long, "another option"))
    return tuple(taken)


# --- resolution ---


def requested_target(config: pytest.Config) -> str | None:
    """The ``--eagle3-target`` value asked for (CLI > env > ini), before any
    validation; ``None`` when the device default applies."""
    opt = config.option
    return (getattr(opt, "eagle3_target", None) or os.environ.get(ENV_TARGET)
            or _ini(config, INI_TARGET) or None)


def resolve_settings(config: pytest.Config, *, validate: bool = True) -> Settings:
    """Resolve every eagle3 value once (CLI > env > ini > default).

    Raises:
        pytest.UsageError: one line, when ``validate`` and the combination is
            unusable (``--device cuda`` with no GPU, too few GPUs for ``--tp``,
            an unwritable cache directory).
    """
    sources: dict[str, str] = {}
    opt = config.option
    env = os.environ

    tp = getattr(opt, "eagle3_tp", None)
    sources["tp"] = "cli" if tp is not None else "default"
    tp = tp if tp is not None else 1

    gpu = detect_gpus(env)
    plan = bool(getattr(opt, "eagle3_plan", False))
    plan_gpus = getattr(opt, "eagle3_plan_gpus", None)
    if plan_gpus is not None and validate and not plan:
        raise pytest.UsageError(MSG_PLAN_GPUS_ALONE)
    if plan and plan_gpus is not None:
        # A plan for a machine with N GPUs, whatever this one has.
        gpu = GpuProbe(plan_gpus, PLAN_GPU_PROBE.format(count=plan_gpus, why="--eagle3-plan-gpus"))
    device = getattr(opt, "eagle3_device", None)
    if device is not None:
        sources["device"] = "cli"
    else:
        device = "cuda" if gpu.count > 0 else "cpu"
        sources["device"] = "default"
    if plan and device == "cuda" and gpu.count == 0:
        # Review a GPU run on a CPU machine: nothing starts, so no GPU is needed.
        gpu = GpuProbe(DEFAULT_PLAN_GPUS, PLAN_GPU_PROBE.format(count=DEFAULT_PLAN_GPUS, why=gpu.how))

    target = getattr(opt, "eagle3_target", None)
    if target:
        sources["target"] = "cli"
    elif env.get(ENV_TARGET):
        target, sources["target"] = env[ENV_TARGET], "env"
    elif _ini(config, INI_TARGET):
        target, sources["target"] = _ini(config, INI_TARGET), "ini"
    else:
        target, sources["target"] = DEFAULT_TARGETS[device], "default"

    cache = getattr(opt, "eagle3_cache", None)
    if cache:
        cache_dir, sources["cache_dir"] = Path(cache).expanduser(), "cli"
    elif env.get(ENV_CACHE):
        cache_dir, sources["cache_dir"] = default_cache_dir(env)
    elif _ini(config, INI_CACHE):
        ini_cache = Path(_ini(config, INI_CACHE)).expanduser()
        if not ini_cache.is_absolute():
            ini_cache = Path(config.rootpath) / ini_cache
        cache_dir, sources["cache_dir"] = ini_cache, "ini"
    else:
        cache_dir, sources["cache_dir"] = default_cache_dir(env)
    cache_dir = cache_dir.absolute()

    rebuild = bool(getattr(opt, "eagle3_rebuild", False))
    sources["rebuild"] = "cli" if rebuild else "default"

    args: list[tuple[str, Any]] = []
    arg_sources: list[str] = []
    ini_lines = [line for line in (_ini(config, INI_SGLANG_ARGS) or []) if line.strip()]
    if ini_lines:
        args += [parse_sglang_arg(line, flag=INI_SGLANG_ARGS) for line in ini_lines]
        arg_sources.append("ini")
    cli_args = getattr(opt, "eagle3_sglang_args", None)
    if cli_args:
        args += list(cli_args)
        arg_sources.append("cli")
    sources["sglang_args"] = "+".join(arg_sources) or "default"

    timeout = getattr(opt, "eagle3_startup_timeout", None)
    if timeout is not None:
        sources["startup_timeout"] = "cli"
    elif _ini(config, INI_STARTUP_TIMEOUT):
        timeout = parse_timeout(_ini(config, INI_STARTUP_TIMEOUT), flag=INI_STARTUP_TIMEOUT)
        sources["startup_timeout"] = "ini"
    else:
        timeout, sources["startup_timeout"] = DEFAULT_STARTUP_TIMEOUT, "default"

    cpu_norm = getattr(opt, "eagle3_cpu_norm", None)
    if cpu_norm:
        sources["cpu_norm"] = "cli"
    elif env.get(ENV_CPU_NORM):
        cpu_norm, sources["cpu_norm"] = env[ENV_CPU_NORM], "env"
        if validate and cpu_norm not in NORM_PATHS:
            raise pytest.UsageError(f"{ENV_CPU_NORM}={cpu_norm!r}: expected {_join(NORM_PATHS)}")
    else:
        cpu_norm, sources["cpu_norm"] = AUTO, "default"

    draft = getattr(opt, "eagle3_draft", None)
    settings = Settings(
        tp=tp, device=device, target=str(target), cache_dir=cache_dir, rebuild=rebuild,
        sglang_args=tuple(args), startup_timeout=float(timeout),
        sources=MappingProxyType(sources), gpu=gpu,
        draft=Path(draft).expanduser() if draft else None,
        stack=getattr(opt, "eagle3_stack", None),
        slow=bool(getattr(opt, "eagle3_slow", False)), plan=plan,
        bisect=bool(getattr(opt, "eagle3_bisect", False)),
        capture_method=str(getattr(opt, "eagle3_capture_method", "auto") or "auto"),
        fault=_resolve_fault(getattr(opt, "eagle3_fault", None), sources) if validate else getattr(opt, "eagle3_fault", None),
        min_accept_length=getattr(opt, "eagle3_min_accept_length", None),
        min_accept_rate=getattr(opt, "eagle3_min_accept_rate", None),
        prefetch=bool(getattr(opt, "eagle3_prefetch", True)), cpu_norm=str(cpu_norm),
        cpu_allreduce_fusion=bool(getattr(opt, "eagle3_cpu_allreduce_fusion", False)),
        prompts=_prompts_path(getattr(opt, "eagle3_prompts", None), validate),
        report=Path(getattr(opt, "eagle3_report")).expanduser() if getattr(opt, "eagle3_report", None) else None,
    )
    if validate:
        validate_settings(settings)
    return settings


def validate_settings(settings: Settings) -> None:
    """Reject unusable combinations with a one-line :class:`pytest.UsageError`
    (a cache directory only when it was configured, see :func:`check_cache`)."""
    if (settings.draft is None) != (settings.stack is None):
        raise pytest.UsageError(MSG_DRAFT_NEEDS_STACK)
    if settings.tp not in TP_CHOICES:
        raise pytest.UsageError(MSG_BAD_TP.format(choices=_join(TP_CHOICES), value=str(settings.tp)))
    if settings.device == "cuda":
        if settings.gpu.count == 0:
            raise pytest.UsageError(MSG_NO_GPU.format(probe=settings.gpu.how))
        if settings.gpu.count < settings.tp:
            raise pytest.UsageError(
                MSG_TOO_FEW_GPUS.format(tp=settings.tp, count=settings.gpu.count, probe=settings.gpu.how)
            )
    # The default cache is checked only when a test uses it (plugin.check_target):
    # a read-only HOME must not break unrelated runs where the plugin is installed.
    if settings.source("cache_dir") != "default":
        check_cache(settings)


def check_cache(settings: Settings) -> None:
    """Raise a one-line :class:`pytest.UsageError` if the cache directory cannot be used."""
    reason = cache_problem(settings.cache_dir)
    if reason:
        raise pytest.UsageError(
            MSG_CACHE_NOT_WRITABLE.format(
                path=settings.cache_dir, source=settings.source("cache_dir"), reason=reason
            )
        )


def cache_problem(path: Path) -> str | None:
    """Why ``path`` cannot be used as a cache directory, or ``None``.

    Does not create anything: an absent directory is fine when its nearest
    existing ancestor is a writable directory.
    """
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return "no existing ancestor"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return "permission denied" if probe == path else f"{probe} is not writable"
    return None


def check_tp_divides(tp: int, num_attention_heads: int) -> str | None:
    """Error line when ``tp`` does not divide the target's attention heads, else ``None``."""
    if num_attention_heads % tp == 0:
        return None
    valid = [t for t in TP_CHOICES if num_attention_heads % t == 0]
    return MSG_TP_HEADS.format(tp=tp, heads=num_attention_heads, valid=_join(valid, last="or"))


def get_settings(config: pytest.Config) -> Settings:
    """The settings resolved in ``pytest_configure`` (resolved now, unvalidated, if absent)."""
    try:
        return config.stash[SETTINGS_KEY]
    except KeyError:
        settings = resolve_settings(config, validate=False)
        config.stash[SETTINGS_KEY] = settings
        return settings


def _ini(config: pytest.Config, name: str) -> Any:
    try:
        return config.getini(name)
    except ValueError:  # key not registered (plugin options not added)
        return None


def _join(values: Any, last: str = "or") -> str:
    items = [str(v) for v in values]
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {last} {items[-1]}"
