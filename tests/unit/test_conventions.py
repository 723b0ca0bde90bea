"""SGLang's aux layer-id rule, per version (read from each wheel's deepseek_v2.py)."""

from __future__ import annotations

import pytest

from pytest_eagle3.conventions import ALWAYS_PLUS_ONE, PLUS_ONE_IF_FIRST_IS_ONE, predict, rule_for


@pytest.mark.parametrize("version, rule", [
    ("0.5.8", ALWAYS_PLUS_ONE), ("0.5.12", ALWAYS_PLUS_ONE),
    ("0.5.13", PLUS_ONE_IF_FIRST_IS_ONE), ("0.5.23", PLUS_ONE_IF_FIRST_IS_ONE),
    ("0.5.24.dev3+g1234", PLUS_ONE_IF_FIRST_IS_ONE), ("not-a-version", PLUS_ONE_IF_FIRST_IS_ONE),
])
def test_rule_by_version(version: str, rule: str) -> None:
    assert rule_for(version) == rule


def test_first_id_one_gets_plus_one_on_new_sglang() -> None:
    p = predict([1, 4, 6], 8, "0.5.23")
    assert p.layers_to_capture == (2, 5, 7) and p.snapshots == (2, 5, 7) and not p.fails_at_first_forward


def test_first_id_zero_is_the_embedding_on_new_sglang() -> None:
    assert predict([0, 4, 6], 8, "0.5.23").snapshots == (0, 4, 6)


def test_old_sglang_always_adds_one() -> None:
    assert predict([0, 4, 6], 8, "0.5.12").snapshots == (1, 5, 7)


def test_kimi_story_ids_on_old_sglang() -> None:
    """Kimi-K2.5 (61 layers): a draft declaring [2, 30, 58] got layers [3, 31, 59] (docs/design.md, "The problem")."""
    assert predict([2, 30, 58], 61, "0.5.12").layers_to_capture == (3, 31, 59)


def test_captures_come_out_in_layer_order() -> None:
    assert predict([6, 0, 4], 8, "0.5.23").snapshots == (0, 4, 6)


def test_default_ids() -> None:
    assert predict(None, 8, "0.5.23").layers_to_capture == (2, 4, 5)


def test_default_ids_collapse_on_six_layers() -> None:
    p = predict(None, 6, "0.5.23")
    assert p.layers_to_capture == (2, 3, 3) and p.fails_at_first_forward


def test_plus_one_past_the_last_layer_fails_at_first_forward() -> None:
    p = predict([1, 4, 7], 8, "0.5.23")
    assert p.missing == (8,) and p.fails_at_first_forward


@pytest.mark.parametrize("ids, version, fails", [
    ([0, 3, 5], "0.5.13", True),    # first-id rule, but layer 0 still raises (deepseek_v2.py:2453)
    ([0, 3, 5], "0.5.14", False),   # captured after prepare_attn sets the residual
    ([0, 3, 5], "0.5.23", False),
    ([-1, 2, 4], "0.5.9", True),    # +1 -> layers [0, 3, 5]: TypeError at the first forward (measured)
    ([0, 3, 5], "0.5.9", False),    # +1 -> layers [1, 4, 6]: serves, one layer late (measured)
])
def test_layer_zero_capture_fails_before_0_5_14(ids, version, fails):
    p = predict(ids, 8, version)
    assert p.fails_at_first_forward is fails
    assert p.embedding_fails is fails
