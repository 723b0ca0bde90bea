"""The suite's checks as values (pytest_eagle3/verdicts/*: order, contract, embedding,
paths, acceptance) and the one place the suite turns them into outcomes
(pytest_eagle3/suite/outcome.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from pytest_eagle3.suite.outcome import conclude
from pytest_eagle3.verdicts import acceptance, contract, order, paths
from pytest_eagle3.verdicts.embedding import SHARDS_UNCOVERED, check_embedding_slot, check_shards_covered
from pytest_eagle3.verdicts.outcome import FAILED, PASSED, REPORTED, SKIPPED, XFAILED, Verdict

GATES = SimpleNamespace(min_accept_length=1.5, min_accept_rate=0.1, source="d/quality.json")


def slot(slot: int, best: int, matched: bool = True) -> SimpleNamespace:
    return SimpleNamespace(slot=slot, best=best, matched=matched)


def slot_report(best, ok: bool, expected=(0, 3, 5), matched=True) -> SimpleNamespace:
    slots = [slot(i, b, matched) for i, b in enumerate(best)]
    verdict = "aux hidden states: 3 of 3 slots wrong"
    return SimpleNamespace(ok=ok, problem=None, slots=slots, wrong=[] if ok else slots, expected=expected,
                           diagnosis=None, message=lambda verbose=False: verdict + "\nslot 0: x",
                           verdict=lambda: verdict)


def test_gate_passes_fails_and_xfails() -> None:
    assert acceptance.check_gate(length=2.0, rate=0.5, gates=GATES, draft="d", tp=1, per={}).ok
    low = acceptance.check_gate(length=1.2, rate=None, gates=GATES, draft="d", tp=2, per={"a": 1.2},
                                causes=["test_capture_order[tp2-x]"])
    assert low.outcome == FAILED
    assert low.text == (acceptance.CAPTURES_WRONG.format(tests="test_capture_order[tp2-x]") + "\n"
                        + acceptance.GATE_FAILED.format(length=1.2, rate=math.nan, draft="d", tp=2, gate_length=1.5,
                                                        gate_rate=0.1, source="d/quality.json", per={"a": 1.2}))
    assert acceptance.check_gate(length=2.0, rate=0.05, gates=GATES, draft="d", tp=1, per={}).outcome == FAILED
    collapsed = acceptance.check_gate(length=1.0, rate=0.0, gates=GATES, draft="d", tp=1, per={}, xfail_reason="r")
    assert collapsed.outcome == XFAILED and collapsed.text.startswith("r; measured at TP 1")
    held = acceptance.check_gate(length=2.0, rate=0.5, gates=GATES, draft="d", tp=1, per={}, xfail_reason="r")
    assert held.outcome == FAILED and "clears the gate 1.5" in held.text


def test_relative_gate_and_output() -> None:
    assert acceptance.check_relative(length=1.0, tp=1, base=None).ok
    assert acceptance.check_relative(length=1.9, tp=2, base=2.0).ok
    low = acceptance.check_relative(length=1.8, tp=2, base=2.0)
    assert low.text == "accept length 1.800 at TP 2 is below 0.95 x the TP 1 run's 2.000"
    out = acceptance.check_output(["a", "b"], [[1, 2, 3], [4, 5, 9]], [[1, 2], [4, 5, 6]])
    assert out.text.startswith("b: speculative output leaves the greedy continuation at token 2 (9 != 6)")


def test_power_names_the_miswirings_that_hold() -> None:
    q = lambda x: SimpleNamespace(accept_length=x)  # noqa: E731
    on_sglang = {"correct": q(2.0), "swap": q(1.6), "benign": q(2.0)}
    on_reference = {"correct": q(2.1), "swap": q(1.0), "benign": q(2.0)}
    verdict = acceptance.check_power(on_sglang, on_reference, GATES, correct="correct", miswirings={"swap"})
    assert verdict.outcome == FAILED
    assert verdict.text == acceptance.LOST_POWER.format(names="swap", got="1.60", gate=1.5)
    on_sglang["swap"] = q(1.0)
    assert acceptance.check_power(on_sglang, on_reference, GATES, correct="correct", miswirings={"swap"}).ok
    on_sglang["correct"] = q(1.0)
    xfail = acceptance.check_power(on_sglang, on_reference, GATES, correct="correct", miswirings={"swap"},
                                   xfail_reason="r")
    assert xfail.outcome == XFAILED and xfail.text.startswith("r; offline, the draft reaches accept length 1.00")


def test_capture_order_against_a_known_and_an_unknown_rule() -> None:
    known = SimpleNamespace(known=True, source="model.py:10", kind="adds one")
    unknown = SimpleNamespace(known=False, source="unreadable", kind="?")
    good = slot_report((0, 3, 5), ok=True)
    v = order.check_capture_order(good, rule=known, ids=[0, 3, 5], predicted=(0, 3, 5), num_layers=6)
    assert v.outcome == REPORTED
    shifted = slot_report((1, 4, 6), ok=False)
    v = order.check_capture_order(shifted, rule=known, ids=[0, 3, 5], predicted=(0, 3, 5), num_layers=6)
    assert v.outcome == FAILED
    assert v.text.startswith(
        "aux hidden states: 3 of 3 slots differ from the id rule read from model.py:10 (adds one): "
        "for ids [0, 3, 5] SGLang captured [hs[1], hs[4], hs[6]], the rule says [hs[0], hs[3], hs[5]]")
    assert v.text.endswith("\naux hidden states: 3 of 3 slots wrong\nslot 0: x")
    assert order.check_capture_order(shifted, rule=unknown, ids=None, predicted=(), num_layers=6).ok
    broken = slot_report((1, 4, 6), ok=False, matched=False)
    v = order.check_capture_order(broken, rule=unknown, ids=None, predicted=(), num_layers=6)
    assert v.text == order.UNKNOWN_UNMATCHED.format(ids=None, source="unreadable", slots=[0, 1, 2])
    assert order.check_width(192, slots=3, hidden_size=64, ids=[1], sglang="s").ok
    assert order.check_width(128, slots=3, hidden_size=64, ids=[1], sglang="s").text == (
        "ids [1]: s returned 128 columns = 2 slots of hidden 64; its rule gives 3 slots (192 columns)")


def test_contract_outcomes() -> None:
    good, bad = slot_report((0, 3, 5), ok=True), slot_report((1, 4, 6), ok=False)
    assert contract.check_contract(good, good).outcome == REPORTED
    assert contract.check_contract(good, follows="f").outcome == PASSED
    xfail = contract.check_contract(bad, follows="f")
    assert xfail.outcome == XFAILED and xfail.text.startswith("f; aux hidden states: 3 of 3 slots wrong; slot 0: x")
    assert xfail.text.endswith(contract.NO_EMBEDDING_SLOT)
    user = contract.check_contract(bad, follows="f", user_draft=True, note="n")
    assert user.outcome == REPORTED and user.cause == "n"
    assert contract.check_contract(bad, good, xfail_reason="r").outcome == XFAILED
    assert contract.check_contract(bad, bad, xfail_reason="r").outcome == REPORTED


def test_embedding_rows_and_paths() -> None:
    assert check_shards_covered([[0, 600]], vocab_size=1000, tp=2).ok
    assert check_shards_covered([[0, 1]], vocab_size=1000, tp=2).text == SHARDS_UNCOVERED.format(missing=[1], tp=2)
    skip = check_embedding_slot(slot_report((1, 4, 6), ok=False), ids=[0, 3, 5], predicted=(0, 3, 5), rule_source="m")
    assert skip.outcome == SKIPPED
    assert skip.text.endswith("this test follows the measurement; no slot holds the embedding")
    assert check_embedding_slot(slot_report((0, 4, 6), ok=False), ids=None, predicted=(0,), rule_source="m").ok
    rows = paths.check_rows(variant="v", i=0, tokens=5, prefill=3, decode=0, want_prefill=5, want_decode=0,
                            settings=paths.row_settings({"page_size": 1}))
    assert rows.text == ("v: prompt 0 (5 tokens) returned 3 prefill rows and 0 decode rows; expected 5 prefill rows "
                         "and 0 decode rows (SGLang's /server_info: chunked_prefill_size=None, "
                         "disable_radix_cache=None, page_size=1)")
    agree = SimpleNamespace(ok=lambda rel_tol: True, describe=lambda: "")
    differ = SimpleNamespace(ok=lambda rel_tol: False, describe=lambda: "slot 1 off")
    assert paths.check_methods_agree([agree, differ], rel_tol=1e-4).text == (
        "prompt 1: the two capture methods disagree: slot 1 off")


@pytest.mark.parametrize(("verdict", "outcome"), [
    (Verdict.failed("boom"), pytest.fail.Exception),
    (Verdict.xfailed("known"), pytest.xfail.Exception),
    (Verdict.skipped("absent"), pytest.skip.Exception),
])
def test_conclude_stops_the_test_with_the_message(verdict: Verdict, outcome: type) -> None:
    with pytest.raises(outcome, match=verdict.text):
        conclude(verdict)


def test_conclude_lets_a_passing_verdict_through() -> None:
    ok = Verdict.reported(SimpleNamespace(ok=True, message=lambda verbose=False: "fine"))
    assert conclude(Verdict.passed()).ok and conclude(ok) is ok
    bad = Verdict.reported(SimpleNamespace(ok=False, message=lambda verbose=False: "wrong"), cause="why")
    assert bad.message() == "why\nwrong"
    with pytest.raises(pytest.fail.Exception, match="why\nwrong"):
        conclude(bad)


# --- pairs that must agree, and the per-rank verify guards -------------------


def _caps(prefill, decode=None, outputs=(1, 2)):
    import torch

    from pytest_eagle3.capture.response import Captures

    prefill = torch.as_tensor(prefill, dtype=torch.float32)
    decode = torch.zeros(0, prefill.shape[1]) if decode is None else torch.as_tensor(decode, dtype=torch.float32)
    return Captures(prompt=list(range(4)), prefill=prefill, decode=decode, output_ids=list(outputs))


def test_a_pair_is_compared_at_the_positions_both_returned() -> None:
    pytest.importorskip("torch")
    from pytest_eagle3.verdicts.paths import check_pair, compare_captures

    full = _caps([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    tail = _caps([[5.0, 6.0], [7.0, 8.0]])  # the last chunk / the uncached rows of the same prompt
    agreement = compare_captures(tail, full)
    assert agreement.aligned == 2 and agreement.prefill_rel == 0.0 and agreement.ok(rel_tol=0.0)
    assert check_pair([agreement], what="radix-cache-hit", a_name="hit", b_name="fresh", rel_tol=0.0).outcome == PASSED

    wrong = _caps([[5.0, 6.0], [7.0, 9.0]])
    verdict = check_pair([compare_captures(wrong, full)], what="radix-cache-hit", a_name="the repeat",
                         b_name="the fresh send", rel_tol=1e-4)
    assert verdict.outcome == FAILED and verdict.text.startswith("radix-cache-hit: prompt 0: the fresh send and the repeat")
    other_tokens = _caps([[5.0, 6.0], [7.0, 8.0]], outputs=(1, 3))
    assert not compare_captures(other_tokens, full).ok(rel_tol=1.0)


def test_two_id_lists_are_compared_on_the_snapshots_they_share() -> None:
    """A draft's ``[1, 3, 4]`` (hs[2], hs[4], hs[5]) against the wide case's
    ``[0, 3, 5]`` (hs[1], hs[4], hs[6]) under always +1: slot 1 against slot 1;
    a slot past the captured width is an error, never an empty comparison."""
    pytest.importorskip("torch")
    from pytest_eagle3.verdicts.paths import common_slots, compare_captures, select_slots

    assert common_slots([2, 4, 5], [1, 4, 6]) == [(1, 1)]
    assert common_slots([0, 3, 5], [5, 0]) == [(0, 1), (2, 0)]
    assert common_slots([2], [3]) == []
    draft = _caps([[9.0, 9.0, 1.0, 2.0, 8.0, 8.0]])
    wide = _caps([[7.0, 7.0, 1.0, 2.0, 6.0, 6.0]])
    assert compare_captures(select_slots(draft, [1], 2), select_slots(wide, [1], 2)).ok(rel_tol=0.0)
    assert not compare_captures(draft, wide).ok(rel_tol=1e-4)
    with pytest.raises(ValueError, match="do not fit"):
        select_slots(draft, [3], 2)


def test_verify_guards_fire_when_nothing_was_checked() -> None:
    from pytest_eagle3.verdicts.rankcheck import check_request_count, check_verify_recorded

    assert check_verify_recorded(3, draft="d").outcome == check_request_count(["a", "b"], 2).outcome == PASSED
    assert "no TARGET_VERIFY forward" in check_verify_recorded(0, draft="d").text
    assert "3 request ids" in check_request_count(["a", "b", "c"], 2).text


def test_rows_of_a_batch_under_chunked_prefill_are_any_tail() -> None:
    from pytest_eagle3.verdicts.paths import check_rows

    assert check_rows(variant="batch", i=0, tokens=23, prefill=7, decode=2, want_prefill=None, want_decode=2,
                      settings="").outcome == PASSED
    for rows in (0, 24):
        assert check_rows(variant="batch", i=0, tokens=23, prefill=rows, decode=2, want_prefill=None,
                          want_decode=2, settings="").outcome == FAILED


def test_verified_rows_stop_at_the_first_rejected_draft_token() -> None:
    torch = pytest.importorskip("torch")
    from pytest_eagle3.engine.recordings import Record, verified_rows

    rec = Record(0, 1, "TARGET_VERIFY", torch.zeros(4, 2), torch.tensor([7, 8, 5, 9]), torch.tensor([3, 4, 5, 6]),
                 None, ("r",), (4,))
    assert verified_rows(rec, [0, 1, 2, 7, 8, 9, 9]) == [0, 1]  # position 5 holds 9, the draft said 5
