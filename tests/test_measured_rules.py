"""``conventions.predict`` and ``pytest-eagle3 inspect`` pinned against measured SGLang behaviour.

``tests/data/measured_id_rules.json`` holds what the packaged suite measured on
real SGLang releases (``benchmarks/measured_rules.py`` collects it from suite
reports; README, "Compatibility"): for a draft's ids on an ``L``-layer target,
the snapshot each captured slot held, or ``"fails-at-first-forward"``.  A rule
change in ``conventions.py`` that contradicts a measurement fails here, naming
both sides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_eagle3.cli.preflight import inspect_draft
from pytest_eagle3.suite.support import write_draft_config
from pytest_eagle3.verdicts.conventions import predict

DATA = Path(__file__).parent / "data" / "measured_id_rules.json"
MEASUREMENTS = json.loads(DATA.read_text())["measurements"]
FAILS = "fails-at-first-forward"


def _id(entry: dict) -> str:
    return f"sglang{entry['sglang']}-L{entry['num_layers']}-ids{entry['ids']}"


def test_every_release_in_the_readme_matrix_was_measured():
    assert {"0.5.9", "0.5.23"} <= {e["sglang"] for e in MEASUREMENTS}


@pytest.mark.parametrize("entry", MEASUREMENTS, ids=_id)
def test_rule_prediction_matches_measurement(entry):
    p = predict(entry["ids"], entry["num_layers"], entry["sglang"])
    predicted = FAILS if p.fails_at_first_forward else list(p.snapshots)
    assert predicted == entry["measured"], (
        f"sglang {entry['sglang']}, ids {entry['ids']}, L={entry['num_layers']}: measured {entry['measured']} "
        f"({entry['how']}, {entry['date']}); conventions.py predicts {predicted} ({p.rule})")


@pytest.mark.parametrize("entry", [e for e in MEASUREMENTS if e["ids"] is not None and min(e["ids"]) >= 0],
                         ids=_id)
def test_inspect_reports_the_measured_captures(entry, tmp_path):
    """``inspect`` reads the ids from a draft config (negative ids are refused there)."""
    draft = tmp_path / "draft"
    write_draft_config(draft, entry["ids"], 64)
    result = inspect_draft(draft, num_layers=entry["num_layers"], sglang_version=entry["sglang"],
                           contract_text="[" + ", ".join("embedding" if i == 0 else f"out(L{i - 1})"
                                                         for i in range(len(entry["ids"]))) + "]")
    if entry["measured"] == FAILS:
        assert result.prediction.fails_at_first_forward and result.verdict == "fails"
    else:
        assert list(result.prediction.snapshots) == entry["measured"]
