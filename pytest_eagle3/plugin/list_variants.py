"""``pytest --eagle3-list-variants``: the path matrix of the installed SGLang
for this run's device and TP (:mod:`pytest_eagle3.engine.variant_matrix`),
printed before any test is collected.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

import pytest

from pytest_eagle3.engine.gpus import detect_gpu_arch
from pytest_eagle3.engine.variant_matrix import format_matrix
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.engine.variants import VARIANTS
from pytest_eagle3.planning.collect import collect_reason
from pytest_eagle3.planning.declare import NeedContext, variant_needs
from pytest_eagle3.sglang_source import install as sglang_install
from pytest_eagle3.target.spec import resolve_target

if TYPE_CHECKING:
    from pytest_eagle3.engine.variants import Variant
    from pytest_eagle3.settings import Settings


def list_variants(settings: "Settings", *, out: TextIO | None = None) -> int:
    """``--eagle3-list-variants``: write
    :func:`~pytest_eagle3.engine.variant_matrix.format_matrix` for the run's
    device and TP to ``out`` (stdout) and return exit code 0.

    Needs the SGLang flag probe (cached per install in the eagle3 cache).

    Raises:
        pytest.UsageError: SGLang is missing or its ``--help`` fails (one line).
    """
    try:
        install = sglang_install.probe(settings.cache_dir)
    except Eagle3Error as exc:
        raise pytest.UsageError(f"--eagle3-list-variants: {exc}") from None
    arch = detect_gpu_arch() if settings.device == "cuda" else None
    try:
        facts = resolve_target(settings.target).facts
    except Eagle3Error:
        facts = None
    needs = {need.name: need for need in variant_needs(VARIANTS)}

    def left_out(variant: "Variant") -> str | None:
        # What collection decides for the run's TP size (collect_reason), e.g. an
        # engine of its own on cpu without --eagle3-slow.
        return collect_reason(needs[variant.name], NeedContext(settings, settings.tp, install, facts))

    (out or sys.stdout).write(format_matrix(install, settings.device, settings.tp, arch, left_out=left_out))
    return 0
