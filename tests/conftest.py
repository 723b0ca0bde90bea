from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

#: Tests that start real SGLang engines live here, and only here, marked ``e2e``.
E2E_DIR = Path(__file__).parent / "e2e"
MSG_MARK_AND_FOLDER = (
    "{nodeid}: {problem}; tests that start SGLang engines live in tests/e2e and carry the e2e mark, "
    "the others live in tests/unit"
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``e2e`` marker and the folder agree (checked before ``-m`` deselects)."""
    for item in items:
        in_e2e = E2E_DIR in Path(item.path).parents
        marked = item.get_closest_marker("e2e") is not None
        if in_e2e != marked:
            problem = "in tests/e2e without the e2e mark" if in_e2e else "marked e2e outside tests/e2e"
            raise pytest.UsageError(MSG_MARK_AND_FOLDER.format(nodeid=item.nodeid, problem=problem))
    # One meaning of slow: the plugin's marker and option (``--eagle3-slow``), for
    # the project's own tests too.  The plugin skips its own slow items; these are the rest.
    if not config.getoption("eagle3_slow"):
        for item in items:
            slow = item.get_closest_marker("slow")
            if slow is not None and not any(name.startswith("eagle3_") for name in getattr(item, "fixturenames", ())):
                why = slow.kwargs.get("reason", "")
                item.add_marker(pytest.mark.skip(reason=f"slow ({why}): run with --eagle3-slow"))


@pytest.fixture
def clean_eagle3_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs see no eagle3 settings from the outer environment, and
    no GPU (so ``--device`` resolves to cpu on any machine)."""
    # CI / BUILD_NUMBER make pytest print untruncated summary lines, which
    # changes the inner runs' output that tests count lines in.
    for name in ("PYTEST_EAGLE3_TARGET", "PYTEST_EAGLE3_CACHE", "PYTEST_EAGLE3_UPSTREAM_FIX", "XDG_CACHE_HOME",
                 "PYTEST_ADDOPTS", "CI", "BUILD_NUMBER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pytest-eagle3 project tests")
    group.addoption("--interrupts", type=int, default=10, metavar="N",
                    help="interrupts sent by tests/e2e/test_interrupts.py (default 10)")
    group.addoption("--interrupt-seed", type=int, default=None, metavar="SEED",
                    help="seed of its random moments (default: a new one, printed)")
