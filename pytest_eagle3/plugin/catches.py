"""A pytest plugin that writes every collected test's ``eagle3_catches`` markers
as JSON (``-p pytest_eagle3.plugin.catches``, with ``--eagle3-catches-out FILE``).

:func:`pytest_eagle3.planning.selftest.suite_catches` runs the packaged suite's
collection in a child pytest with it, so the self-test plan holds what pytest
itself sees: markers on the function, its class and its module (``pytestmark``)
alike.  Each test function is written once (its first collected item: a test
left out of the run still has its placeholder item).

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

MARK = "eagle3_catches"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--eagle3-catches-out", dest="eagle3_catches_out", metavar="FILE", default=None,
                     help="(internal) write the collected eagle3_catches markers to FILE as JSON")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    out = config.getoption("eagle3_catches_out")
    if not out:
        return
    seen: dict[str, list[dict]] = {}
    for item in items:
        name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
        if name in seen:
            continue
        seen[name] = [{"kinds": [str(k) for k in mark.args], "need": mark.kwargs.get("need"),
                       "tp": mark.kwargs.get("tp"), "contrast": bool(mark.kwargs.get("contrast", False))}
                      for mark in reversed(list(item.iter_markers(MARK)))]
    Path(out).write_text(json.dumps(seen))
