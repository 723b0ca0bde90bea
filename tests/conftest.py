from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture
def clean_eagle3_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs see no eagle3 settings from the outer environment, and
    no GPU (so ``--device`` resolves to cpu on any machine)."""
    # CI / BUILD_NUMBER make pytest print untruncated summary lines, which
    # changes the inner runs' output that tests count lines in.
    for name in ("PYTEST_EAGLE3_TARGET", "PYTEST_EAGLE3_CACHE", "XDG_CACHE_HOME", "PYTEST_ADDOPTS",
                 "CI", "BUILD_NUMBER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
