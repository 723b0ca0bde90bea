"""SGLang feeds each draft what its training stack trained it on.

For every contract fixture (and ``--eagle3-draft PATH --eagle3-stack NAME``)
the declared need resolves to the ids SGLang reads from the draft config and
the contract the stack trained on (:func:`pytest_eagle3.planning.declare.resolve`);
each captured slot is compared with the contract.

Outcomes for the fixtures: PASS when SGLang captures the contract; XFAIL with
the diagnosis when it does not *and* that is what the installed SGLang's id
rule (read from its model file) predicts: a known incompatibility of this
SGLang; FAIL on any other surprise.  When SGLang's captures disagree with the
rule, test_capture_order fails once for it and this test judges the contract
against what was measured.  The user's own draft has no XFAIL: a mismatch fails.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.planning.declare import case_needs, user_draft_need
from pytest_eagle3.suite.support import FOLLOWS_MEASURED, evidence, measured_snapshots, tolerance
from pytest_eagle3.verdicts.compare import compare_slots, fail_if_bad

KNOWN_MISMATCH = "{reason}; {diagnosis}"
NO_EMBEDDING_SLOT = "no slot holds the embedding hs[0] the contract starts with"


@pytest.mark.gpu
@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.eagle3_engines(user_draft_need(), *case_needs(needs_contract=True))
def test_draft_receives_its_training_contract(eagle3_engine_request, eagle3_capture, eagle3_reference,
                                              eagle3_model_config, eagle3_sglang, eagle3_settings,
                                              eagle3_checkpoint, eagle3_tp, record_property, pytestconfig):
    req = eagle3_engine_request
    L, H = eagle3_model_config.num_layers, eagle3_model_config.hidden_size
    record_property("eagle3_contract", req.contract)
    tol = tolerance(eagle3_settings)
    captures = eagle3_capture.run(req)
    candidates = evidence(eagle3_checkpoint, eagle3_capture.prompts, eagle3_model_config, eagle3_tp,
                          fused_allreduce=eagle3_capture.fused_allreduce)
    for cap, ref, ev in zip(captures, eagle3_reference, candidates):
        report = compare_slots(cap.prefill, ref, expected=list(req.expected), num_layers=L, hidden_size=H,
                               tol=tol, side_names=("SGLang", "contract"), evidence=ev)
        as_predicted = None
        if req.predicted and list(req.predicted) != list(req.expected):
            as_predicted = compare_slots(cap.prefill, ref, expected=list(req.predicted), num_layers=L,
                                         hidden_size=H, tol=tol, diagnose=False)
        elif req.predicted:
            as_predicted = report
        measured = measured_snapshots(report)
        rule_wrong = (as_predicted is not None and not as_predicted.ok and measured is not None
                      and list(measured) != list(req.predicted))
        if rule_wrong:
            # One root cause, one failure: test_capture_order fails for the rule;
            # this test judges the contract against what SGLang really captured.
            follows = FOLLOWS_MEASURED.format(
                measured=list(measured), ids=list(req.ids) if req.ids is not None else None,
                predicted=list(req.predicted),
                source=eagle3_sglang.id_rule(eagle3_model_config.architecture).source)
            record_property("eagle3_follows_measurement", follows)
            if report.ok:
                continue
            if not req.user_draft:
                pytest.xfail(KNOWN_MISMATCH.format(reason=follows, diagnosis=_diagnosis(report)))
        elif req.xfail_reason is not None:
            if as_predicted is not None and as_predicted.ok:
                pytest.xfail(KNOWN_MISMATCH.format(reason=req.xfail_reason, diagnosis=_diagnosis(report)))
        # A user draft's note says why SGLang fed it these layers (ids where SGLang does not read them).
        fail_if_bad(report, config=pytestconfig, cause=req.note if req.user_draft else None)


def _diagnosis(report) -> str:
    """The verdict, the first wrong slot, the named cause across slots, and
    whether the embedding the contract wants is missing from every slot."""
    lines = [report.verdict(), *report.message().splitlines()[1:2]]
    if report.diagnosis is not None:
        lines += list(report.diagnosis.pattern_lines)
    if 0 in report.expected and all(v.best != 0 or not v.matched for v in report.slots):
        lines.append(NO_EMBEDDING_SLOT)
    return "; ".join(lines)
