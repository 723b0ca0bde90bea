"""SGLang feeds each draft what its training stack trained it on.

For every contract fixture (and ``--eagle3-draft PATH --eagle3-stack NAME``)
the declared need resolves to the ids SGLang reads from the draft config and
the contract the stack trained on (:func:`pytest_eagle3.capture.declare.resolve`);
each captured slot is compared with the contract.

Outcomes for the fixtures: PASS when SGLang captures the contract; XFAIL with
the diagnosis when it does not *and* that is what the installed version's rule
predicts (a known incompatibility of this SGLang version, pinned by the
project's tests); FAIL on any surprise, including a prediction that turned out
wrong.  The user's own draft has no XFAIL: a mismatch fails.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.capture.declare import case_needs, user_draft_need
from pytest_eagle3.suite.support import evidence, tolerance
from pytest_eagle3.verdicts.compare import compare_slots, fail_if_bad

KNOWN_MISMATCH = "{reason}; {diagnosis}"
NO_EMBEDDING_SLOT = "no slot holds the embedding hs[0] the contract starts with"
PREDICTION_WRONG = (
    "{sglang} captured the contract {contract}, but its rule predicted {predicted}: "
    "pytest_eagle3/verdicts/conventions.py is out of date for this SGLang"
)


@pytest.mark.gpu
@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.eagle3_engines(user_draft_need(), *case_needs(needs_contract=True))
def test_draft_receives_its_training_contract(eagle3_engine_request, eagle3_capture, eagle3_reference,
                                              eagle3_model_config, eagle3_sglang, eagle3_settings,
                                              eagle3_checkpoint, eagle3_tp, record_property):
    req = eagle3_engine_request
    L, H = eagle3_model_config.num_layers, eagle3_model_config.hidden_size
    record_property("eagle3_contract", req.contract)
    tol = tolerance(eagle3_settings)
    captures = eagle3_capture.run(req)
    candidates = evidence(eagle3_checkpoint, eagle3_capture.prompts, eagle3_model_config, eagle3_tp)
    for cap, ref, ev in zip(captures, eagle3_reference, candidates):
        report = compare_slots(cap.prefill, ref, expected=list(req.expected), num_layers=L, hidden_size=H,
                               tol=tol, side_names=("SGLang", "contract"), evidence=ev)
        if req.xfail_reason is not None:
            if report.ok:
                pytest.fail(PREDICTION_WRONG.format(sglang=eagle3_sglang.describe(), contract=req.contract,
                                                    predicted=list(req.predicted)), pytrace=False)
            as_predicted = compare_slots(cap.prefill, ref, expected=list(req.predicted), num_layers=L,
                                         hidden_size=H, tol=tol)
            if as_predicted.ok:
                pytest.xfail(KNOWN_MISMATCH.format(reason=req.xfail_reason, diagnosis=_diagnosis(report)))
        fail_if_bad(report, config=eagle3_capture.request.config)


def _diagnosis(report) -> str:
    """The verdict, the first wrong slot, the named cause across slots, and
    whether the embedding the contract wants is missing from every slot."""
    lines = [report.verdict(), *report.message().splitlines()[1:2]]
    if report.diagnosis is not None:
        lines += list(report.diagnosis.pattern_lines)
    if 0 in report.expected and all(v.best != 0 or not v.matched for v in report.slots):
        lines.append(NO_EMBEDDING_SLOT)
    return "; ".join(lines)
