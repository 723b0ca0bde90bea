"""Validation: whether the resolved settings can run, each problem as one line.

* :func:`validate_settings`, in ``pytest_configure``: combinations no run can
  use (``--device cuda`` without GPUs, too few GPUs for ``--tp``, a draft without
  its stack, a configured cache that cannot be written);
* :func:`check_user_draft`, in ``pytest_configure``: ``--eagle3-draft`` is a
  readable draft directory;
* :func:`check_gpu_selection` and :func:`check_target`, after collection and
  only when a selected test is pytest-eagle3's: ``-m gpu`` on a machine without
  GPUs, the target, ``--tp`` against its heads, ``--eagle3-prompts``, the
  default cache.

Every problem is a :class:`pytest.UsageError` with one line.  Nothing here
imports torch, transformers or sglang.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_eagle3.contracts.draft import NO_DIR_MSG
from pytest_eagle3.draft.validate import read_config
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.contracts.stacks import STACKS
from pytest_eagle3.plugin.options import ENV_CACHE, ENV_TARGET, INI_TARGET
from pytest_eagle3.plugin.parsers import MSG_BAD_TP, join
from pytest_eagle3.settings import TP_CHOICES, Settings
from pytest_eagle3.sglang_source import install as sglang_install
from pytest_eagle3.target.prompts import load_prompts
from pytest_eagle3.target.spec import LocalTarget, resolve_target

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall

MSG_DRAFT_NEEDS_STACK = (
    "--eagle3-draft and --eagle3-stack go together: name the draft directory and the "
    "stack that trained it (" + ", ".join(STACKS) + ")"
)
MSG_NO_GPU = (
    "--device cuda: no GPU is visible ({probe}); run with --device cpu, or fix CUDA_VISIBLE_DEVICES"
)
MSG_TOO_FEW_GPUS = (
    "--tp {tp} needs {n} GPUs on --device cuda but {count} are visible ({probe}); "
    "lower {lower} or make more GPUs visible"
)
MSG_CACHE_NOT_WRITABLE = (
    "eagle3 cache {path} (from {source}) is not writable: {reason}; "
    "pass --eagle3-cache DIR or set " + ENV_CACHE + " to a writable directory"
)
MSG_TP_HEADS = (
    "--tp {tp} does not divide the target's {heads} attention heads; use --tp {valid}"
)
MSG_PP_LAYERS = (
    "--eagle3-pp {pp} is more pipeline stages than the target's {layers} layers: use --eagle3-pp {layers} or fewer"
)
#: On cpu every rank of every stage is a process on this machine (TP 8 is the most the CPU tier runs).
MSG_PP_CPU_PROCESSES = (
    "--tp {tp} x --eagle3-pp {pp} is {n} SGLang processes: the CPU tier runs at most 8; lower --tp or --eagle3-pp"
)
MSG_PP_NO_FLAG = "--eagle3-pp {pp}: {sglang} has no --pp-size (no pipeline parallelism to test)"
MSG_GPU_NONE = (
    "-m gpu selects the GPU suite, but no GPU is visible ({how}); run it on the CPU tier "
    "with --device cpu, or on a machine with GPUs"
)
#: A target error whose value did not come from the command line names where it did.
MSG_FROM_SOURCE = "{message} (target from {where})"
TARGET_SOURCES = {"env": f"env {ENV_TARGET}", "ini": f"ini {INI_TARGET}"}


def validate_settings(settings: Settings) -> None:
    """Reject unusable combinations with a one-line :class:`pytest.UsageError`
    (a cache directory only when it was configured, see :func:`check_cache`)."""
    if (settings.draft is None) != (settings.stack is None):
        raise pytest.UsageError(MSG_DRAFT_NEEDS_STACK)
    if settings.tp not in TP_CHOICES:
        raise pytest.UsageError(MSG_BAD_TP.format(choices=join(TP_CHOICES), value=str(settings.tp)))
    ranks = settings.tp * settings.pp
    if settings.device == "cpu" and ranks > max(TP_CHOICES):
        raise pytest.UsageError(MSG_PP_CPU_PROCESSES.format(tp=settings.tp, pp=settings.pp, n=ranks))
    if settings.device == "cuda":
        if settings.gpu.count == 0:
            raise pytest.UsageError(MSG_NO_GPU.format(probe=settings.gpu.how))
        if settings.gpu.count < ranks:
            tp = str(settings.tp) if settings.pp == 1 else f"{settings.tp} x --eagle3-pp {settings.pp}"
            raise pytest.UsageError(
                MSG_TOO_FEW_GPUS.format(tp=tp, n=ranks, count=settings.gpu.count, probe=settings.gpu.how,
                                        lower="--tp" if settings.pp == 1 else "--tp or --eagle3-pp")
            )
    # The default cache is checked only when a test uses it (check_target, below):
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
    return MSG_TP_HEADS.format(tp=tp, heads=num_attention_heads, valid=join(valid, last="or"))


def check_gpu_selection(config: pytest.Config, settings: Settings) -> None:
    """``-m gpu`` selects the GPU suite: on a machine where no GPU is visible and
    ``--device`` was not given, stop with one line instead of running it on cpu
    unasked (``--device cpu`` runs the same tests on the CPU tier).

    Raises:
        pytest.UsageError: :data:`MSG_GPU_NONE`.
    """
    markexpr = getattr(config.option, "markexpr", "") or ""
    if re.search(r"\bgpu\b", markexpr) and settings.device == "cpu" and settings.source("device") == "default":
        raise pytest.UsageError(MSG_GPU_NONE.format(how=settings.gpu.how))


def check_user_draft(settings: Settings) -> None:
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


def check_target(settings: Settings) -> None:
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
    problem = check_tp_divides(settings.tp, target.facts.num_attention_heads)
    if problem:
        raise pytest.UsageError(problem)
    if settings.prompts is not None:
        try:
            load_prompts(settings.prompts, vocab_size=target.facts.vocab_size,
                         tokenizer_dir=target.path if isinstance(target, LocalTarget) else None)
        except Eagle3Error as exc:
            raise pytest.UsageError(f"--eagle3-prompts: {exc}") from None
    check_cache(settings)


def check_pp(settings: Settings) -> None:
    """``--eagle3-pp`` > 1 against the target's layers and the installed SGLang's flags
    (asked for PP, the run checks it even where collection left every test out).

    Raises:
        pytest.UsageError: :data:`MSG_PP_LAYERS` or :data:`MSG_PP_NO_FLAG` (a bad target
            is :func:`check_target`'s to report).
    """
    if settings.pp < 2:
        return
    try:
        layers = resolve_target(settings.target).facts.num_layers
    except Eagle3Error:
        return
    if settings.pp > layers:
        raise pytest.UsageError(MSG_PP_LAYERS.format(pp=settings.pp, layers=layers))
    try:
        install = sglang_install.probe(settings.cache_dir)
    except Eagle3Error:
        return  # no SGLang: each test reports that itself
    problem = check_pp_flag(settings.pp, install)
    if problem:
        raise pytest.UsageError(problem)


def check_pp_flag(pp: int, install: "SGLangInstall | None") -> str | None:
    """Error line when ``--eagle3-pp`` > 1 meets an SGLang without ``--pp-size``, else ``None``."""
    if pp > 1 and install is not None and install.flags and not install.has_arg("pp_size"):
        return MSG_PP_NO_FLAG.format(pp=pp, sglang=install.describe())
    return None


def _with_target_source(message: str, settings: Settings) -> str:
    where = TARGET_SOURCES.get(settings.source("target"))
    return MSG_FROM_SOURCE.format(message=message, where=where) if where else message
