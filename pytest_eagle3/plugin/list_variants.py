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
from pytest_eagle3.sglang_source import install as sglang_install

if TYPE_CHECKING:
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
    (out or sys.stdout).write(format_matrix(install, settings.device, settings.tp, arch))
    return 0
