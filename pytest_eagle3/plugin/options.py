"""Option registration: the ``eagle3`` option group, its ini keys, and the
names of the environment variables and ini keys the settings are read from.

``pytest --help`` lists the group as "EAGLE-3 aux hidden states (pytest-eagle3)".
The values are resolved once into :class:`~pytest_eagle3.settings.Settings` by
:mod:`pytest_eagle3.plugin.resolve` (precedence: command line > environment >
ini file > default, the pytest-django order) and checked by
:mod:`pytest_eagle3.plugin.validate`; the short spellings ``--tp``, ``--device``
and ``--sglang-arg`` are added by :mod:`pytest_eagle3.plugin.spellings`.

Nothing here imports torch, transformers or sglang: ``pytest --help`` must work
on a broken install.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest

from pytest_eagle3.contracts.stacks import STACKS
from pytest_eagle3.plugin.parsers import (
    parse_accept_length, parse_accept_rate, parse_device, parse_plan_gpus, parse_pp, parse_sglang_arg, parse_timeout,
    parse_tp,
)
from pytest_eagle3.settings import CACHE_ENV, DEFAULT_STARTUP_TIMEOUT, DEFAULT_TARGETS
from pytest_eagle3.sglang_source.norm_code import NORM_PATHS

#: ``--eagle3-capture-method`` values (``pytest_eagle3.capture.api`` method names).
CAPTURE_METHODS = ("auto", "capture-only", "eagle3-draft")
#: Env spelling of ``--eagle3-cpu-norm``.
ENV_CPU_NORM = "PYTEST_EAGLE3_CPU_NORM_PATH"
ENV_TARGET = "PYTEST_EAGLE3_TARGET"
ENV_CACHE = CACHE_ENV

INI_TARGET = "eagle3_target"
INI_CACHE = "eagle3_cache"
INI_STARTUP_TIMEOUT = "eagle3_startup_timeout"
INI_SGLANG_ARGS = "eagle3_sglang_args"

#: GPUs ``--eagle3-plan`` pretends on ``--device cuda`` when none are visible here.
DEFAULT_PLAN_GPUS = 8


#: ``addoption`` keywords of the options that also have a short spelling.
SPELLED_OPTIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "--eagle3-tp": MappingProxyType(dict(
        dest="eagle3_tp", metavar="N", type=parse_tp, default=None,
        help="tensor-parallel size of the run, one of 1, 2, 4, 8 (default 1); tests marked "
        "tp(n) with n above it are skipped")),
    "--eagle3-pp": MappingProxyType(dict(
        dest="eagle3_pp", metavar="N", type=parse_pp, default=None,
        help="pipeline-parallel size of the run's engines (SGLang --pp-size; default 1); where the "
        "installed SGLang refuses EAGLE-3 or its captures at PP, the run says so and starts none")),
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
    for name in ("--eagle3-tp", "--eagle3-pp", "--eagle3-device"):
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
        "--eagle3-no-id-switch", dest="eagle3_id_switch", action="store_false", default=True,
        help="on cpu, start one capture-only engine per aux layer id list, each given its ids as a "
        "server argument (default: one engine per TP size switches ids between requests through "
        "SGLang's own set_eagle3_layers_to_capture)",
    )
    group.addoption(
        "--eagle3-prefetch", dest="eagle3_prefetch", action="store_true", default=False,
        help="on cpu, start the run's next engine in the background while the current one serves, "
        "if memory allows (default: each engine starts when a test needs it; on 2 cores the "
        "overlapping starts measured slower, docs/benchmarks.md)",
    )
    group.addoption(
        "--eagle3-no-prefetch", dest="eagle3_prefetch", action="store_false", default=False,
        help="on cpu, start each engine only when a test needs it (the default; undoes --eagle3-prefetch)",
    )
    group.addoption(
        "--eagle3-draft", dest="eagle3_draft", metavar="PATH", default=None,
        help="your EAGLE-3 draft directory (config.json, fc weight): the contracts suite "
        "checks SGLang captures what it was trained on (needs --eagle3-stack)",
    )
    group.addoption(
        "--eagle3-stack", dest="eagle3_stack", metavar="NAME", default=None,
        help="training stack of --eagle3-draft: one of " + ", ".join(STACKS)
        + " (specforge: SpecForge 0.2; specforge-hf: older SpecForge)",
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
