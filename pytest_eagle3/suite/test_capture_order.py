"""SGLang captures the layers its own rule says, in layer order, ``len(ids)``
slots of ``hidden`` columns each, for every id list in the contract fixtures.

The rule (:mod:`pytest_eagle3.verdicts.conventions`) is a prediction from
SGLang's source; this test measures the running engine, so a fork that changed
the rule fails here with the snapshot each slot really holds.  Id lists the
rule predicts to fail at the first forward are left out at collection
(:func:`pytest_eagle3.capture.declare.collect_reason`).
"""

from __future__ import annotations

import pytest

from pytest_eagle3.capture.declare import case_needs
from pytest_eagle3.suite.support import evidence, tolerance
from pytest_eagle3.verdicts.compare import compare_slots, fail_if_bad

WRONG_COUNT = (
    "ids {ids}: {sglang} returned {width} columns = {slots:g} slots of hidden {H}; "
    "its rule gives {n} slots ({want} columns)"
)


@pytest.mark.gpu
@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.eagle3_engines(*case_needs())
def test_capture_order(eagle3_engine_request, eagle3_capture, eagle3_reference, eagle3_model_config,
                       eagle3_sglang, eagle3_settings, eagle3_checkpoint, eagle3_tp, record_property):
    req = eagle3_engine_request
    L, H = eagle3_model_config.num_layers, eagle3_model_config.hidden_size
    record_property("eagle3_predicted_snapshots", list(req.predicted))
    captures = eagle3_capture.run(req)
    n = len(req.predicted)
    candidates = evidence(eagle3_checkpoint, eagle3_capture.prompts, eagle3_model_config, eagle3_tp)
    for cap, ref, ev in zip(captures, eagle3_reference, candidates):
        if cap.width != n * H:
            pytest.fail(WRONG_COUNT.format(ids=list(req.ids) if req.ids is not None else None,
                                           sglang=eagle3_sglang.describe(), width=cap.width,
                                           slots=cap.width / H, H=H, n=n, want=n * H), pytrace=False)
        report = compare_slots(cap.prefill, ref, expected=list(req.predicted), num_layers=L, hidden_size=H,
                               tol=tolerance(eagle3_settings),
                               side_names=("SGLang", f"{eagle3_sglang.version} rule"), evidence=ev)
        # The measured id rule (tests/data/measured_id_rules.json pins
        # conventions.py and `inspect` against these): the snapshot each slot holds.
        record_property("eagle3_measured_rule", {
            "sglang": eagle3_sglang.version, "num_layers": L,
            "ids": list(req.ids) if req.ids is not None else None,
            "measured": [v.best if v.matched else None for v in report.slots],
            "predicted": list(req.predicted)})
        fail_if_bad(report, config=eagle3_capture.request.config)
