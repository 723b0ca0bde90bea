"""The CPU tier's environment and server arguments (docs/design.md, "SGLang on a plain x86 CPU").

Measured on sglang 0.5.23, torch 2.14.1, 2 x86 cores without AMX: real SGLang
serves the reduced DeepSeek-V3 at TP 1, 2, 4 and 8 with all-reduce through gloo.
Nothing here patches SGLang's code under test; the two in-process fixes live in
:mod:`pytest_eagle3.worker.cpu.patches` and are switched on through
:data:`pytest_eagle3.worker.sglang_hooks.HOOKS_ENV`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from pytest_eagle3.worker.env import AMX_ATTENTION_ENV, FUSION_ENV, HOOKS_ENV, NORM_PATH_ENV
from pytest_eagle3.worker.cpu import SHIM_DIR


#: A path that does not exist: PyNCCL fails softly and SGLang all-reduces with gloo.
MISSING_NCCL = "/nonexistent/pytest-eagle3/libnccl.so.2"


def omp_binding(tp: int, cores: int | None = None) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` value: one core per rank, cores may repeat.

    >>> omp_binding(4, cores=2)
    '0|1|0|1'
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, int(cores or 1))
    return "|".join(str(rank % cores) for rank in range(tp))


#: Attention backend of the CPU tier without speculative decoding.
PLAIN_ATTENTION = "torch_native"
#: Attention backend for EAGLE/EAGLE-3 on CPU: they refuse ``torch_native``
#: (no multi-step draft backend), ``intel_amx`` has one.  Its kernels come from
#: the stand-in ``sgl_kernel`` (plain torch) and the platform fact ``has_amx``
#: is forced on for attention only (:func:`pytest_eagle3.worker.cpu.patches.amx_attention_platform`).
SPECULATIVE_ATTENTION = "intel_amx"
#: SGLang's switch between its speculative workers (``srt/environ.py``); set to
#: ``False`` on releases whose v2 overlap path has no CPU branch
#: (:attr:`pytest_eagle3.sglang_source.install.SGLangInstall.spec_v2_cpu_gap`).
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"


#: Files where SGLang asserts an architecture's attention backends (0.5.23:
#: ``srt/arg_groups/model_hook.py``; earlier releases: ``srt/server_args.py``).
_BACKEND_CHECK_FILES = ("srt/arg_groups/model_hook.py", "srt/server_args.py")


def refuses_plain_attention(location: str | Path, architecture: str) -> str | None:
    """Where the installed SGLang refuses :data:`PLAIN_ATTENTION` for ``architecture``.

    SGLang asserts a list of attention backends for some architectures at
    server-argument resolution (0.5.23 ``srt/arg_groups/model_hook.py``:
    ``"GptOssForCausalLM requires one of [...] attention backend"``; torch_native
    has neither sliding windows nor attention sinks), so their CPU engines run
    :data:`SPECULATIVE_ATTENTION` (the stand-in kernels implement both).  Read
    from the installed files, never from a version number.

    Returns:
        ``"srt/arg_groups/model_hook.py:538"``-style location of the assertion,
        or ``None`` when the architecture may run ``torch_native``.
    """
    found = _first_line_with(location, _BACKEND_CHECK_FILES, f"{architecture} requires one of")
    if found is not None:
        return found
    for rel in _BACKEND_CHECK_FILES:
        line = _backend_list_assert(Path(location) / rel, architecture)
        if line:
            return f"{rel}:{line}"
    return None


def _first_line_with(location: str | Path, files: tuple[str, ...], needle: str) -> str | None:
    """``"file:line"`` of ``needle``'s first occurrence in the first of ``files``
    (relative to the installed ``sglang`` package at ``location``) that holds it;
    ``None`` where none does or none can be read."""
    for rel in files:
        try:
            text = (Path(location) / rel).read_text(encoding="utf-8")
        except OSError:
            continue
        at = text.find(needle)
        if at >= 0:
            return f"{rel}:{text.count(chr(10), 0, at) + 1}"
    return None


def _backend_list_assert(path: Path, architecture: str) -> int:
    """Line of an ``assert`` inside ``if/elif model_arch in (..., architecture, ...)``
    whose branch lists accepted attention backends with ``intel_amx`` and without
    ``torch_native`` (0.5.23 ``model_hook.py`` for Gemma 4: "Gemma4 only supports
    ... intel_amx ..."); 0 when there is none or the file cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return 0
    return _backend_assert_line(text, architecture)


@functools.lru_cache(maxsize=32)
def _backend_assert_line(text: str, architecture: str) -> int:
    """:func:`_backend_list_assert` on the file's text (cached: every engine's
    configuration asks it of the same files)."""
    import ast

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return 0
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.In)
                and isinstance(node.test.comparators[0], (ast.Tuple, ast.List, ast.Set))):
            continue
        archs = {e.value for e in node.test.comparators[0].elts if isinstance(e, ast.Constant)}
        if architecture not in archs:
            continue
        branch = ast.Module(body=node.body, type_ignores=[])
        names = {n.value for n in ast.walk(branch) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        asserts = [n for n in ast.walk(branch) if isinstance(n, ast.Assert)]
        if asserts and SPECULATIVE_ATTENTION in names and PLAIN_ATTENTION not in names:
            return asserts[0].lineno
    return 0


def cpu_env(tp: int, *, pythonpath: str | None = None, amx_attention: bool = False,
            norm_path: str = "native", allreduce_fusion: bool = False) -> dict[str, str]:
    """Environment for an SGLang server on CPU with ``tp`` ranks.

    The stand-in ``sgl_kernel`` goes first on ``PYTHONPATH`` (before any
    existing entries) so every TP worker imports it instead of the CUDA-only one.
    ``amx_attention``: the engine runs the ``intel_amx`` attention backend
    (speculative decoding); the CPU hooks then keep SGLang from replacing it
    by ``torch_native``.  ``norm_path="inplace"``: SGLang's norms take their AMX
    branch with the stand-in in-place kernels (:mod:`pytest_eagle3.worker.cpu.norms`).
    ``allreduce_fusion``: SGLang defers its all-reduces into the next norm and
    calls the fused op, served by a gloo stand-in
    (:mod:`pytest_eagle3.worker.cpu.allreduce_fusion`); meaningful at ``tp > 1``.
    """
    existing = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    path = str(SHIM_DIR) + (os.pathsep + existing if existing else "")
    env = {
        "SGLANG_USE_CPU_ENGINE": "1",
        # torch.compile on CPU: first request 30 s -> 0.2 s without it.
        "TORCHDYNAMO_DISABLE": "1",
        "SGLANG_CPU_OMP_THREADS_BIND": omp_binding(tp),
        # One OpenMP thread per rank (a user's own setting wins): the tiny targets'
        # ops are too small to split, and a second thread per rank spins between
        # them, so a TP 2 engine kept four threads busy on 2 cores.  Measured
        # (sglang 0.5.23, 2 cores): the main job (--tp 2) 385 s -> 234 s.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or "1",
        "SGLANG_NCCL_SO_PATH": MISSING_NCCL,
        "PYTHONPATH": path,
        HOOKS_ENV: "cpu",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if amx_attention:
        env[AMX_ATTENTION_ENV] = "1"
    # Always explicit: a worker never inherits another run's choice.
    env[NORM_PATH_ENV] = norm_path
    if allreduce_fusion:
        env[FUSION_ENV] = "1"
    return env


def cpu_server_args(*, speculative: bool = False, amx_attention: bool = False) -> dict[str, Any]:
    """Server arguments every CPU-tier engine gets (user ``--sglang-arg`` wins).

    ``speculative``: the engine loads an EAGLE/EAGLE-3 draft, so attention runs
    on :data:`SPECULATIVE_ATTENTION` (pair it with ``cpu_env(amx_attention=True)``);
    so does ``amx_attention`` (an architecture SGLang refuses on torch_native,
    :func:`refuses_plain_attention`).
    """
    return {
        "device": "cpu",
        "attention_backend": SPECULATIVE_ATTENTION if (speculative or amx_attention) else PLAIN_ATTENTION,
        "dtype": "float32",
        "disable_custom_all_reduce": True,
        "disable_cuda_graph": True,
        "mem_fraction_static": 0.05,
        "max_total_tokens": 4096,
        "skip_server_warmup": True,
        # An idle scheduler otherwise polls its sockets at full speed: one core
        # each for the engine waiting between tests and the prefetched one
        # (engine/pool.py), on a 2-core machine.  Dropped where a fork lacks it.
        "sleep_on_idle": True,
    }


#: SGLang's refusal of the mamba radix cache's ``extra_buffer`` strategy off
#: CUDA, MUSA, NPU, HIP and XPU (0.5.23 ``srt/arg_groups/mamba_hook.py:120``).
_EXTRA_BUFFER_REFUSAL = "extra_buffer requires platform support"
_MAMBA_HOOK_FILES = ("srt/arg_groups/mamba_hook.py", "srt/server_args.py")


def has_linear_attention(config: dict[str, Any]) -> bool:
    """Whether a ``config.json`` dict (or its ``text_config``) declares
    linear-attention layers (``layer_types`` with ``"linear_attention"``: the
    gated delta-net layers of Qwen3-Next and Qwen3.5), whose state SGLang keeps
    in its mamba pool."""
    for cfg in (config, config.get("text_config") or {}):
        if "linear_attention" in (cfg.get("layer_types") or ()):
            return True
    return False


#: SGLang's dtype of a linear-attention layer's conv window (``srt/environ.py``,
#: default ``"bfloat16"``, read by ``srt/configs/mamba_utils.py`` ``mamba2_state_dtype``).
MAMBA_CONV_DTYPE_ENV = "SGLANG_MAMBA_CONV_DTYPE"


def linear_attention_env(config: dict[str, Any]) -> dict[str, str]:
    """Environment for a float32 CPU engine of ``config``: the conv window of its
    linear-attention layers in float32 too.

    SGLang keeps that window (the last ``W-1`` inputs of each delta-net conv,
    carried from one prefill chunk to the next and into decode) in bfloat16
    unless :data:`MAMBA_CONV_DTYPE_ENV` says otherwise, whatever ``--dtype``
    is; a float32 engine's later chunks then differ from one unchunked forward
    by a bfloat16 round trip of the window (measured on tiny-qwen3-next:
    rel. error 1.7e-3 at hs[2], against 0 for prompts within one chunk).
    Empty without linear-attention layers; a value already in the
    environment wins."""
    if not has_linear_attention(config) or MAMBA_CONV_DTYPE_ENV in os.environ:
        return {}
    return {MAMBA_CONV_DTYPE_ENV: "float32"}


def refuses_mamba_overlap(location: str | Path, config: dict[str, Any]) -> str | None:
    """Where the installed SGLang refuses a CPU engine of ``config`` with the
    radix cache on and its overlap schedule.

    With the radix cache on, SGLang keeps a hybrid model's mamba state in its
    radix cache and resolves the strategy ``auto`` to ``extra_buffer`` while
    the overlap schedule is on (0.5.23 ``srt/arg_groups/overrides.py``,
    ``_mamba_radix_cache_resolution``), then asserts that strategy's platform
    support, which lists no CPU; with the overlap schedule off ``auto`` is
    ``no_buffer``, which runs on CPU.  A CPU user passes
    ``--disable-overlap-schedule``, as the CPU tier does for these engines.

    Returns:
        ``"srt/arg_groups/mamba_hook.py:120"``-style location of the refusal,
        or ``None`` (no linear-attention layers, or no such refusal installed).
    """
    if not has_linear_attention(config):
        return None
    return _first_line_with(location, _MAMBA_HOOK_FILES, _EXTRA_BUFFER_REFUSAL)
