"""Regenerating the shipped draft (minutes): ``python -m pytest_eagle3.draft.build``
with the stored settings reaches the stored quality (``tests/unit/test_draft.py``
checks the shipped files themselves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_draft import (  # noqa: F401  (draft_dir, quality: the shipped draft's fixtures)
    CORRECT, MISWIRINGS, POWER_RATIO, PRESET, PROBES, QUALITY_FILE, draft_dir, quality,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow(reason="trains a draft, about 4 min")]

def test_regenerated_draft_reaches_stored_quality(tmp_path: Path, quality: dict, record_property) -> None:
    """``python -m pytest_eagle3.draft.build`` with the stored settings reaches the stored quality."""
    pytest.importorskip("torch")
    from importlib import metadata

    from pytest_eagle3.draft.build import build_draft
    from pytest_eagle3.draft.train import TrainSettings

    settings = TrainSettings(**quality["settings"])
    out = build_draft(PRESET, tmp_path / "draft", settings=settings)
    new = json.loads((out / QUALITY_FILE).read_text())
    record_property("regenerated", {n: q["accept_length"] for n, q in new["quality"].items()})
    record_property("training_cpu_seconds", new["training_cpu_seconds"])
    same_bytes = new["weights_sha256"] == quality["weights_sha256"]
    record_property("same_bytes", same_bytes)
    if quality["versions"]["torch"] == metadata.version("torch"):
        # same torch: same continuations; bytes may still differ across CPU kernels
        assert new["rows"] == quality["rows"]
    gates = quality["gates"]
    assert new["quality"][CORRECT]["accept_length"] >= quality["quality"][CORRECT]["accept_length"] - 0.05
    assert new["quality"][CORRECT]["accept_length"] >= gates["min_accept_length"]
    for name in (*MISWIRINGS, *PROBES):
        assert new["quality"][name]["accept_length"] < gates["min_accept_length"], name
    assert new["gates"]["power_ratio"] >= POWER_RATIO
