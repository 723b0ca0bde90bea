"""SGLang feeds each draft what its training stack trained it on.

For every contract fixture (and ``--eagle3-draft PATH --eagle3-stack NAME``),
a draft config is on disk the way a user ships it; the ids SGLang reads from it
configure the engine, and each captured slot is compared with the contract.

Outcomes for the fixtures: PASS when SGLang captures the contract; XFAIL with
the diagnosis when it does not *and* that is what the installed version's rule
predicts (a known incompatibility of this SGLang version, pinned by the
project's tests); FAIL on any surprise, including a prediction that turned out
wrong.  The user's own draft has no XFAIL: a mismatch fails.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.compare import compare_slots, fail_if_bad
from pytest_eagle3.contracts.draft import contract_for_draft, load_draft
from pytest_eagle3.conventions import predict
from pytest_eagle3.options import get_settings
from pytest_eagle3.suite import cases
from pytest_eagle3.suite.support import tolerance, write_draft_config

USER_DRAFT = "your-draft"

KNOWN_MISMATCH = "{case}: known incompatibility of {sglang}: contract {contract}; {diagnosis}"
PREDICTION_WRONG = (
    "{case}: {sglang} captured the contract {contract}, but its rule ({rule}) predicted "
    "{predicted}: pytest_eagle3/conventions.py is out of date for this SGLang"
)
IDS_IGNORED = "SGLang reads no ids from this draft config ({key}); it uses its default list"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.name != "test_draft_receives_its_training_contract":
        return
    names = cases.case_names()
    if get_settings(metafunc.config).draft is not None:
        names = [USER_DRAFT, *names]
    metafunc.parametrize("eagle3_case", names)


@pytest.mark.tp(1, 2, 4, 8)
def test_draft_receives_its_training_contract(eagle3_case, eagle3_tp, eagle3_capture, eagle3_reference,
                                              eagle3_model_config, eagle3_sglang, eagle3_settings,
                                              tmp_path, record_property):
    user = eagle3_case == USER_DRAFT
    if not user:
        reason = cases.skip_reason(eagle3_case, eagle3_tp)
        if reason:
            pytest.skip(reason)
    facts = eagle3_model_config
    L, H = facts.num_layers, facts.hidden_size
    if user:
        draft_dir, stack, options = eagle3_settings.draft, eagle3_settings.stack, {}
    else:
        case = cases.resolve(eagle3_case, L, H, eagle3_sglang.version)
        if case.contract is None:
            pytest.skip(f"{eagle3_case}: no contract on a {L}-layer target: {case.error}")
        draft_dir = write_draft_config(tmp_path / "draft", case.ids, H)
        stack, options = case.stack, dict(case.options)
    draft = load_draft(draft_dir)
    contract = contract_for_draft(draft_dir, stack, num_layers=L, target_hidden_size=H,
                                  sglang_version=eagle3_sglang.version if stack == "specforge-sglang" else None,
                                  **options)
    serving_ids = list(draft.ids) if draft.ids is not None and draft.sglang_reads_ids else None
    if draft.ids is not None and not draft.sglang_reads_ids:
        record_property("eagle3_note", IDS_IGNORED.format(key=draft.ids_key))
    expected = contract.to_snapshot_indices(L)
    prediction = predict(serving_ids, L, eagle3_sglang.version)
    record_property("eagle3_contract", str(contract))

    captures = eagle3_capture(serving_ids)
    for cap, ref in zip(captures, eagle3_reference):
        report = compare_slots(cap.prefill, ref, expected=expected, num_layers=L, hidden_size=H,
                               tol=tolerance(eagle3_settings), side_names=("SGLang", "contract"))
        predicted_ok = list(prediction.snapshots) == expected
        if report.ok and not predicted_ok and not user:
            pytest.fail(PREDICTION_WRONG.format(case=eagle3_case, sglang=eagle3_sglang.describe(),
                                                contract=contract, rule=prediction.rule,
                                                predicted=list(prediction.snapshots)), pytrace=False)
        if not report.ok and not predicted_ok and not user:
            as_predicted = compare_slots(cap.prefill, ref, expected=list(prediction.snapshots), num_layers=L,
                                         hidden_size=H, tol=tolerance(eagle3_settings))
            if as_predicted.ok:
                pytest.xfail(KNOWN_MISMATCH.format(case=eagle3_case, sglang=eagle3_sglang.describe(),
                                                   contract=contract,
                                                   diagnosis="; ".join(report.message().splitlines()[:2])))
        fail_if_bad(report, config=eagle3_capture.request.config)
