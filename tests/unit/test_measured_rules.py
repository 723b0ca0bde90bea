"""The id rule, pinned against measured SGLang behaviour.

``tests/data/measured_id_rules.json`` holds what the packaged suite measured on
real SGLang releases and forks (``benchmarks/measured_rules.py`` collects it
from suite reports; docs/compatibility.md): for a draft's ids on an
``L``-layer target, the snapshot each captured slot held, or
``"fails-at-first-forward"``.

* an entry of the SGLang installed here is checked against the rule *read from
  its installed code* (``sglang_source/model_code.py``), and ``inspect`` with it;
* an entry of an upstream release that is not installed is checked against the
  version table (the prediction ``inspect --sglang-version`` makes);
* an entry of a fork (``distribution``) that is not installed cannot be
  predicted from its number: the test shows the version table would be wrong
  for it, which is why nothing reads a rule from a number.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_eagle3.cli.preflight import inspect_draft
from pytest_eagle3.conventions import predict
from pytest_eagle3.suite.support import write_draft_config

DATA = Path(__file__).parents[1] / "data" / "measured_id_rules.json"
MEASUREMENTS = json.loads(DATA.read_text())["measurements"]
FAILS = "fails-at-first-forward"


def _id(entry: dict) -> str:
    return f"{entry.get('distribution', 'sglang')}{entry['sglang']}-L{entry['num_layers']}-ids{entry['ids']}"


def _installed():
    """``(distribution, version, rule)`` of the SGLang installed here, or ``None``."""
    try:
        from pytest_eagle3.sglang_source.install import SGLangInstall, locate
        from pytest_eagle3.errors import Eagle3SGLangMissing

        version, location = locate()
    except Eagle3SGLangMissing:
        return None
    install = SGLangInstall(version, location, frozenset(), "")
    return (install.distribution or "sglang").lower(), version, install.id_rule()


INSTALLED = _installed()


def _is_installed(entry: dict) -> bool:
    return INSTALLED is not None and INSTALLED[:2] == (entry.get("distribution", "sglang").lower(), entry["sglang"])


def _predicted(p) -> object:
    return FAILS if p.fails_at_first_forward else list(p.snapshots)


def test_every_release_in_the_readme_matrix_was_measured():
    assert {"0.5.9", "0.5.12", "0.5.23"} <= {e["sglang"] for e in MEASUREMENTS if "distribution" not in e}
    assert {"sglang-kt"} <= {e.get("distribution") for e in MEASUREMENTS}


@pytest.mark.parametrize("entry", MEASUREMENTS, ids=_id)
def test_rule_matches_measurement(entry):
    if _is_installed(entry):
        rule = INSTALLED[2]
        assert rule.from_code
    elif "distribution" in entry:
        # A fork's number says nothing about its rule (test_a_fork_number_is_not_its_rule).
        pytest.skip(f"{entry['distribution']} {entry['sglang']} is not installed here")
    else:
        rule = entry["sglang"]  # the version table's prediction for an upstream release
    p = predict(entry["ids"], entry["num_layers"], rule)
    assert _predicted(p) == entry["measured"], (
        f"{_id(entry)}: measured {entry['measured']} ({entry['how']}, {entry['date']}); "
        f"the rule ({p.rule}, {p.source}) predicts {_predicted(p)}")


def test_a_fork_number_is_not_its_rule():
    """sglang-kt 0.7.2 measured the always +1 rule: the version table for '0.7.2'
    (an upstream number past PR #25454) would have predicted otherwise."""
    kt = [e for e in MEASUREMENTS if e.get("distribution") == "sglang-kt" and e["ids"] == [0, 3, 5]]
    assert kt and kt[0]["measured"] == [1, 4, 6]
    assert list(predict([0, 3, 5], kt[0]["num_layers"], kt[0]["sglang"]).snapshots) != kt[0]["measured"]


@pytest.mark.parametrize("entry", [e for e in MEASUREMENTS if e["ids"] is not None and min(e["ids"]) >= 0
                                   and ("distribution" not in e or _is_installed(e))], ids=_id)
def test_inspect_reports_the_measured_captures(entry, tmp_path):
    """``inspect`` reads the ids from a draft config (negative ids are refused there)."""
    draft = tmp_path / "draft"
    write_draft_config(draft, entry["ids"], 64)
    rule = INSTALLED[2] if _is_installed(entry) else None
    result = inspect_draft(draft, num_layers=entry["num_layers"], sglang_version=entry["sglang"], rule=rule,
                           contract_text="[" + ", ".join("embedding" if i == 0 else f"out(L{i - 1})"
                                                         for i in range(len(entry["ids"]))) + "]")
    if entry["measured"] == FAILS:
        assert result.prediction.fails_at_first_forward and result.verdict == "fails"
    else:
        assert list(result.prediction.snapshots) == entry["measured"]
