"""Hooks pytest-eagle3 adds (registered in ``pytest_addhooks``), for plugins and
conftests that want what the packaged tests measure as it is measured.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_eagle3_verdict(config: pytest.Config, report: Any) -> None:
    """Called with every verdict report a packaged test checks, pass or fail,
    before the test fails on it.

    Args:
        config: the run's config.
        report: a :class:`~pytest_eagle3.verdicts.compare.SlotReport`,
            :class:`~pytest_eagle3.verdicts.embedding.EmbeddingReport` or
            :class:`~pytest_eagle3.verdicts.rankcheck.RankReport` (``ok``,
            ``message()``; slot reports also ``slots``, ``tol``).

    Implemented by the JSON report (:mod:`pytest_eagle3.plugin.report`) and the
    terminal figures (:mod:`pytest_eagle3.plugin.figures`).
    """
