"""The run's settings as one frozen value, for every layer above.

:class:`Settings` is what a run was asked to do (device, TP size, target,
cache, gates, ...), resolved once by the pytest plugin
(:mod:`pytest_eagle3.plugin.resolve`) with the source of each value, or built
directly by a script or the CLI.  The engine, capture and planning layers read
it as it is.  :class:`GpuProbe` is what the GPU probe saw
(:func:`pytest_eagle3.engine.gpus.detect_gpus`); :func:`default_cache_dir` is
the per-user cache a run uses when none is named.

Nothing here imports pytest, torch, transformers or sglang.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

#: Tensor-parallel sizes the suite knows how to run.
TP_CHOICES: tuple[int, ...] = (1, 2, 4, 8)
DEVICE_CHOICES: tuple[str, ...] = ("cpu", "cuda")
#: Target preset used when none is given, per device (presets: ``fixtures/targets/<name>.json``).
DEFAULT_TARGETS: Mapping[str, str] = MappingProxyType({"cpu": "tiny-dsv3", "cuda": "gpu-dsv3"})
DEFAULT_STARTUP_TIMEOUT = 600.0
#: Environment variable naming the cache root (``--eagle3-cache`` wins over it).
CACHE_ENV = "PYTEST_EAGLE3_CACHE"
#: Default of ``--eagle3-cpu-norm`` (:data:`pytest_eagle3.sglang_source.norm_code.AUTO`).
CPU_NORM_DEFAULT = "auto"
#: Default of ``--eagle3-capture-method``.
CAPTURE_METHOD_DEFAULT = "auto"


def default_cache_dir(env: Mapping[str, str] | None = None) -> tuple[Path, str]:
    """Per-user cache directory and its source (``"env"`` or ``"default"``):
    ``$PYTEST_EAGLE3_CACHE``, else ``$XDG_CACHE_HOME/pytest-eagle3``, else
    ``~/.cache/pytest-eagle3``."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser(), "env"
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pytest-eagle3", "default"


@dataclass(frozen=True)
class GpuProbe:
    """What the torch-free GPU probe saw.

    Attributes:
        count: visible GPUs; ``0`` when none.
        how: a short human description of the evidence, e.g. ``"nvidia-smi -L: 2 GPUs"``.
    """

    count: int
    how: str


@dataclass(frozen=True)
class Settings:
    """The run's eagle3 settings, resolved once in ``pytest_configure``.

    Attributes:
        tp: tensor-parallel size of the run (one of :data:`TP_CHOICES`).
        pp: pipeline-parallel size of its engines (``--eagle3-pp``; SGLang's ``pp_size``,
            passed with the server arguments when above 1).
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
            and serves (``--eagle3-prefetch``; off by default: on 2 cores the overlapping
            starts measured slower, docs/benchmarks.md; :mod:`pytest_eagle3.engine.pool`).
        id_switch: on cpu, one capture-only engine per TP size serves every id list,
            switching ids between requests (``--eagle3-no-id-switch`` turns it off;
            :mod:`pytest_eagle3.worker.id_switch`).
        cpu_norm: ``--eagle3-cpu-norm`` (env ``PYTEST_EAGLE3_CPU_NORM_PATH``): ``auto`` (SGLang's
            in-place AMX norm branch where the installed layernorm.py has one), ``inplace``,
            ``native`` (:mod:`pytest_eagle3.sglang_source.norm_code`).
        cpu_allreduce_fusion: ``--eagle3-cpu-allreduce-fusion``: on cpu, every engine at TP > 1
            runs SGLang's fused all-reduce + residual add + RMSNorm path with a gloo stand-in for
            the fused op (:mod:`pytest_eagle3.worker.cpu.allreduce_fusion`).
    """

    tp: int = 1
    pp: int = 1
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
    capture_method: str = CAPTURE_METHOD_DEFAULT
    fault: str | None = None
    min_accept_length: float | None = None
    min_accept_rate: float | None = None
    prefetch: bool = False
    id_switch: bool = True
    prompts: Path | None = None
    cpu_norm: str = CPU_NORM_DEFAULT
    cpu_allreduce_fusion: bool = False

    def source(self, name: str) -> str:
        """Where ``name`` came from; ``"default"`` when unknown."""
        return self.sources.get(name, "default")
