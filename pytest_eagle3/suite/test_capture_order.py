"""SGLang captures the layers its own rule says, in layer order, ``len(ids)``
slots of ``hidden`` columns each, for every id list in the contract fixtures.

The rule is read from the installed SGLang's model file for the target's
architecture (:mod:`pytest_eagle3.sglang_source.model_code`: SGLang's own
``set_eagle3_layers_to_capture`` run on a stand-in); this test measures the
running engine.  When the two disagree this is the one test that fails for it,
naming both and the file:line; the other tests of the run follow what was
measured (:func:`pytest_eagle3.verdicts.order.measured_snapshots`; the check:
:func:`pytest_eagle3.verdicts.order.check_capture_order`).  Where the
rule could not be read it is measured and recorded, never guessed.  Id lists
the rule says fail at setup or at the first forward are left out at
collection (:func:`pytest_eagle3.planning.collect.collect_reason`).
"""

from __future__ import annotations

import pytest

from pytest_eagle3.planning import cases
from pytest_eagle3.planning.declare import case_needs
from pytest_eagle3.suite.outcome import conclude, conclude_each
from pytest_eagle3.suite.support import evidence, first_position, returned_rows, tolerance, where
from pytest_eagle3.verdicts.compare import compare_slots
from pytest_eagle3.verdicts.order import check_capture_order, check_width


@pytest.mark.gpu
@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.eagle3_engines(*case_needs(measures_rule=True))
@pytest.mark.eagle3_catches("offset-twice", "ids-ignored", "reversed-order", "normalized-input", "no-residual",
                            "unreduced-embedding", "partial-sum", "dp-gather-scaled", "aliased-capture",
                            "before-fused-allreduce", "half-precision-copy", need=cases.WIDE_CASE)
# The first requests of an engine that goes stale, and the captures a served
# draft consumes wrongly: right, the contrast the run-level diagnosis needs.
@pytest.mark.eagle3_catches("stale-no-residual", "draft-fc-reversed", need=cases.WIDE_CASE, contrast=True)
@pytest.mark.eagle3_catches("offset-missing", need="specforge-default-ids", tp=1)
# At --eagle3-pp 2 ids [0, 3, 5] span both stages (layers 0-3 and 4-7).
@pytest.mark.eagle3_catches("pp-earlier-stage-zeroed", need=cases.WIDE_CASE, tp=1)
def test_capture_order(eagle3_engine_request, eagle3_capture, eagle3_reference, eagle3_model_config,
                       eagle3_sglang, eagle3_settings, eagle3_checkpoint, eagle3_tp, record_property, pytestconfig):
    req = eagle3_engine_request
    L, H = eagle3_model_config.num_layers, eagle3_model_config.hidden_size
    rule = eagle3_sglang.id_rule(eagle3_model_config.architecture)
    ids = list(req.ids) if req.ids is not None else None
    record_property("eagle3_predicted_snapshots", list(req.predicted))
    record_property("eagle3_rule", rule.to_dict())
    captures = eagle3_capture.run(req)
    candidates = evidence(eagle3_checkpoint, eagle3_capture.prompts, eagle3_model_config, eagle3_tp,
                          fused_allreduce=eagle3_capture.fused_allreduce, pp_stages=eagle3_capture.pp_stages)
    checks = []  # every request judged, then the first wrong one stops the test
    for cap, ref, ev in zip(captures, eagle3_reference, candidates):
        n = len(req.predicted) if rule.known else cap.width // H
        conclude(check_width(cap.width, slots=n, hidden_size=H, ids=ids, sglang=eagle3_sglang.describe()))
        expected = list(req.predicted) if rule.known else [0] * n
        ref, ev = returned_rows(cap, ref, ev)
        report = compare_slots(cap.prefill, ref, expected=expected, num_layers=L, hidden_size=H,
                               tol=tolerance(eagle3_settings), side_names=("SGLang", "id rule"), evidence=ev,
                               diagnose=rule.known, first_row=first_position(cap))
        # The measured id rule (tests/data/measured_id_rules.json pins the rule
        # reader and `inspect` against these): the snapshot each slot holds.
        record_property("eagle3_measured_rule", {
            "sglang": eagle3_sglang.version, "distribution": eagle3_sglang.distribution, "num_layers": L, "ids": ids,
            "measured": [v.best if v.matched else None for v in report.slots],
            "predicted": list(req.predicted), "rule_source": rule.source})
        checks.append((check_capture_order(report, rule=rule, ids=ids, predicted=req.predicted, num_layers=L),
                       where(req, cap, path="plain")))
    conclude_each(checks, pytestconfig)
