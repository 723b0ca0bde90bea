"""Captures come from the layers, in the order, that the installed SGLang's rule
says for each id list, and there are ``len(ids)`` of them, ``hidden`` wide each.

The rule (:mod:`pytest_eagle3.conventions`) is a prediction from SGLang's
source; this test measures the running engine.  A failure names, per slot, the
snapshot it really holds.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.compare import compare_slots, fail_if_bad
from pytest_eagle3.conventions import predict
from pytest_eagle3.suite.cases import CAPTURE_ORDER_CASES, DEFAULT_IDS
from pytest_eagle3.suite.support import tolerance

COLLAPSES = (
    "ids {ids} on {L} layers make {sglang} capture layers {layers}: "
    "it fails at the first forward (covered by the contracts suite)"
)
DEFAULT_AT_TP1 = (
    "SGLang's default ids are checked at TP 1 only: which layers it picks does "
    "not depend on TP, and each id list costs an engine start"
)
WRONG_COUNT = (
    "ids {ids}: {sglang} returned {width} columns = {slots} slots of hidden {H}; "
    "{n} ids need {n} slots ({want} columns)"
)


@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.parametrize("eagle3_case", CAPTURE_ORDER_CASES, ids=lambda c: c.name)
def test_capture_order(eagle3_case, eagle3_tp, eagle3_capture, eagle3_reference, eagle3_model_config,
                       eagle3_sglang, eagle3_settings, record_property):
    if eagle3_case is DEFAULT_IDS and eagle3_tp > 1:
        pytest.skip(DEFAULT_AT_TP1)
    facts = eagle3_model_config
    L, H = facts.num_layers, facts.hidden_size
    ids = eagle3_case.ids(L)
    prediction = predict(ids, L, eagle3_sglang.version)
    if prediction.fails_at_first_forward:
        pytest.skip(COLLAPSES.format(ids=ids, L=L, sglang=eagle3_sglang.describe(),
                                     layers=list(prediction.layers_to_capture)))
    record_property("eagle3_layers_to_capture", list(prediction.layers_to_capture))

    captures = eagle3_capture(ids)
    n = len(prediction.layers_to_capture)
    for cap, ref in zip(captures, eagle3_reference):
        if cap.width != n * H:
            pytest.fail(WRONG_COUNT.format(ids=ids, sglang=eagle3_sglang.describe(), width=cap.width,
                                           slots=cap.width / H, H=H, n=n, want=n * H), pytrace=False)
        report = compare_slots(cap.prefill, ref, expected=list(prediction.snapshots),
                               num_layers=L, hidden_size=H, tol=tolerance(eagle3_settings))
        fail_if_bad(report, config=eagle3_capture.request.config)
