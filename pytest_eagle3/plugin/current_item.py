"""The test running now, for plugin objects whose hooks are called without it.

``pytest_eagle3_verdict`` (a suite test handing over a verdict) names no item;
the plugins that record it on the running test's ``user_properties`` (the JSON
report, the figures, the run-level diagnosis) read :attr:`TracksCurrentItem.item`.
"""

from __future__ import annotations

from typing import Any, Generator

import pytest


class TracksCurrentItem:
    """Mixin for a registered plugin object: :attr:`item` is the test whose
    ``pytest_runtest_protocol`` is running, ``None`` between tests."""

    item: pytest.Item | None = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        self.item = item
        try:
            return (yield)
        finally:
            self.item = None
