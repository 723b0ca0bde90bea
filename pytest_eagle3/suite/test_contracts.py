"""SGLang feeds each draft what its training stack trained it on.

For every contract fixture (and ``--eagle3-draft PATH --eagle3-stack NAME``)
the declared need resolves to the ids SGLang reads from the draft config and
the contract the stack trained on (:func:`pytest_eagle3.planning.request.resolve`);
each captured slot is compared with the contract.

Outcomes for the fixtures: PASS when SGLang captures the contract; XFAIL with
the diagnosis when it does not *and* that is what the installed SGLang's id
rule (read from its model file) predicts: a known incompatibility of this
SGLang; FAIL on any other surprise.  When SGLang's captures disagree with the
rule, test_capture_order fails once for it and this test judges the contract
against what was measured.  The user's own draft has no XFAIL: a mismatch fails;
a draft that keeps its ids only under ``eagle_config`` gets a
:class:`VllmIgnoresIds` warning: vLLM >= 0.34 would serve it its default layers.
"""

from __future__ import annotations

import warnings

import pytest

from pytest_eagle3.contracts.draft import read_draft_config
from pytest_eagle3.contracts.servers import nested_ids_ignored
from pytest_eagle3.planning import cases
from pytest_eagle3.planning.declare import case_needs, user_draft_need
from pytest_eagle3.suite.outcome import conclude_each
from pytest_eagle3.suite.support import evidence, first_position, returned_rows, tolerance, where
from pytest_eagle3.verdicts.compare import compare_slots
from pytest_eagle3.verdicts.contract import check_contract
from pytest_eagle3.verdicts.order import follows_measured, measured_snapshots


class VllmIgnoresIds(UserWarning):
    """The user's draft keeps its ids where vLLM's runner never reads them
    (:func:`pytest_eagle3.contracts.servers.nested_ids_ignored`)."""


@pytest.mark.gpu
@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.eagle3_engines(user_draft_need(), *case_needs(needs_contract=True))
# Runs after test_capture_order on the same engine: wrong once the engine went stale.
@pytest.mark.eagle3_catches("stale-no-residual", need=cases.WIDE_CASE)
def test_draft_receives_its_training_contract(eagle3_engine_request, eagle3_capture, eagle3_reference,
                                              eagle3_model_config, eagle3_sglang, eagle3_settings,
                                              eagle3_checkpoint, eagle3_tp, record_property, pytestconfig):
    req = eagle3_engine_request
    L, H = eagle3_model_config.num_layers, eagle3_model_config.hidden_size
    record_property("eagle3_contract", req.contract)
    if req.user_draft:
        # What vLLM would serve the same draft: a verdict on the draft's layout, not on SGLang.
        vllm = nested_ids_ignored(read_draft_config(eagle3_settings.draft), eagle3_model_config.num_layers)
        if vllm is not None:
            record_property("eagle3_vllm", vllm)
            warnings.warn(VllmIgnoresIds(vllm), stacklevel=1)
    tol = tolerance(eagle3_settings)
    captures = eagle3_capture.run(req)
    candidates = evidence(eagle3_checkpoint, eagle3_capture.prompts, eagle3_model_config, eagle3_tp,
                          fused_allreduce=eagle3_capture.fused_allreduce, pp_stages=eagle3_capture.pp_stages)
    checks = []  # every request judged, then the first wrong one stops the test
    for cap, ref, ev in zip(captures, eagle3_reference, candidates):
        ref, ev = returned_rows(cap, ref, ev)
        report = compare_slots(cap.prefill, ref, expected=list(req.expected), num_layers=L, hidden_size=H,
                               tol=tol, side_names=("SGLang", "contract"), evidence=ev,
                               first_row=first_position(cap))
        as_predicted = None
        if req.predicted and list(req.predicted) != list(req.expected):
            as_predicted = compare_slots(cap.prefill, ref, expected=list(req.predicted), num_layers=L,
                                         hidden_size=H, tol=tol, diagnose=False)
        elif req.predicted:
            as_predicted = report
        measured = measured_snapshots(report)
        follows = None
        if (as_predicted is not None and not as_predicted.ok and measured is not None
                and list(measured) != list(req.predicted)):
            # One root cause, one failure: test_capture_order fails for the rule;
            # this test judges the contract against what SGLang really captured.
            follows = follows_measured(measured, ids=req.ids, predicted=req.predicted,
                                       rule_source=eagle3_sglang.id_rule(eagle3_model_config.architecture).source)
            record_property("eagle3_follows_measurement", follows)
        # A user draft's note says why SGLang fed it these layers (ids where SGLang does not read them).
        checks.append((check_contract(report, as_predicted, follows=follows, xfail_reason=req.xfail_reason,
                                      user_draft=req.user_draft, note=req.note), where(req, cap, path="plain")))
    conclude_each(checks, pytestconfig)
