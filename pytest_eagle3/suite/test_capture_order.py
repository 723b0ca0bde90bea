"""SGLang captures the layers its own rule says, in layer order, ``len(ids)``
slots of ``hidden`` columns each, for every id list in the contract fixtures.

The rule (:mod:`pytest_eagle3.conventions`) is a prediction from SGLang's
source; this test measures the running engine, so a fork that changed the rule
fails here with the snapshot each slot really holds.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.compare import compare_slots, fail_if_bad
from pytest_eagle3.conventions import predict
from pytest_eagle3.suite import cases
from pytest_eagle3.suite.support import tolerance

COLLAPSES = (
    "ids {ids} on {L} layers make {sglang} capture layers {layers}: it fails at the "
    "first forward (pytest-eagle3 inspect reports this before any engine starts)"
)
WRONG_COUNT = (
    "ids {ids}: {sglang} returned {width} columns = {slots:g} slots of hidden {H}; "
    "its rule gives {n} slots ({want} columns)"
)


@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.parametrize("eagle3_case", cases.case_names())
def test_capture_order(eagle3_case, eagle3_tp, eagle3_capture, eagle3_reference, eagle3_model_config,
                       eagle3_sglang, eagle3_settings, record_property):
    reason = cases.skip_reason(eagle3_case, eagle3_tp)
    if reason:
        pytest.skip(reason)
    facts = eagle3_model_config
    L, H = facts.num_layers, facts.hidden_size
    case = cases.resolve(eagle3_case, L, H, eagle3_sglang.version)
    ids = list(case.ids) if case.ids is not None else None
    prediction = predict(ids, L, eagle3_sglang.version)
    if prediction.fails_at_first_forward:
        pytest.skip(COLLAPSES.format(ids=ids, L=L, sglang=eagle3_sglang.describe(),
                                     layers=list(prediction.layers_to_capture)))
    record_property("eagle3_layers_to_capture", list(prediction.layers_to_capture))

    captures = eagle3_capture(ids)
    n = len(prediction.snapshots)
    for cap, ref in zip(captures, eagle3_reference):
        if cap.width != n * H:
            pytest.fail(WRONG_COUNT.format(ids=ids, sglang=eagle3_sglang.describe(), width=cap.width,
                                           slots=cap.width / H, H=H, n=n, want=n * H), pytrace=False)
        report = compare_slots(cap.prefill, ref, expected=list(prediction.snapshots),
                               num_layers=L, hidden_size=H, tol=tolerance(eagle3_settings),
                               side_names=("SGLang", f"{eagle3_sglang.version} rule"))
        fail_if_bad(report, config=eagle3_capture.request.config)
