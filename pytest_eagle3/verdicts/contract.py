"""The training-contract check: SGLang feeds a draft what its stack trained it on.

``test_draft_receives_its_training_contract`` compares each captured slot with
the contract (:func:`~pytest_eagle3.verdicts.compare.compare_slots`) and, where
the installed SGLang's id rule predicts other layers, with that prediction;
:func:`check_contract` judges: passed when SGLang captures the contract; XFAIL
with the diagnosis when it does not *and* that is what the rule predicts (a
known incompatibility of this SGLang) or what SGLang measurably captured while
disagreeing with its rule (``test_capture_order`` fails once for that); the
report itself otherwise.  The user's own draft has no XFAIL.  Pure Python.
"""

from __future__ import annotations

from typing import Any

from pytest_eagle3.verdicts.outcome import Verdict

KNOWN_MISMATCH = "{reason}; {diagnosis}"
NO_EMBEDDING_SLOT = "no slot holds the embedding hs[0] the contract starts with"


def contract_diagnosis(report: Any) -> str:
    """The verdict, the first wrong slot, the named cause across slots, and
    whether the embedding the contract wants is missing from every slot."""
    lines = [report.verdict(), *report.message().splitlines()[1:2]]
    if report.diagnosis is not None:
        lines += list(report.diagnosis.pattern_lines)
    if 0 in report.expected and all(v.best != 0 or not v.matched for v in report.slots):
        lines.append(NO_EMBEDDING_SLOT)
    return "; ".join(lines)


def check_contract(report: Any, as_predicted: Any = None, *, follows: str | None = None,
                   xfail_reason: str | None = None, user_draft: bool = False,
                   note: str | None = None) -> Verdict:
    """Judge one prompt's captures against the contract.

    Args:
        report: the slots against the contract (a ``SlotReport``).
        as_predicted: the slots against the id rule's prediction (``report``
            itself when the two agree; ``None`` without a prediction).
        follows: the :data:`~pytest_eagle3.verdicts.order.FOLLOWS_MEASURED` line
            when SGLang's captures disagree with its rule: the contract is then
            judged against what was measured.
        xfail_reason: why the rule predicts this SGLang miswires the draft.
        user_draft: the user's own draft (``--eagle3-draft``): no XFAIL.
        note: why SGLang fed a user draft these layers; it leads a failure.
    """
    if follows is not None:
        if report.ok:
            return Verdict.passed(report)
        if not user_draft:
            return Verdict.xfailed(KNOWN_MISMATCH.format(reason=follows, diagnosis=contract_diagnosis(report)), report)
    elif xfail_reason is not None:
        if as_predicted is not None and as_predicted.ok:
            return Verdict.xfailed(KNOWN_MISMATCH.format(reason=xfail_reason, diagnosis=contract_diagnosis(report)),
                                   report)
    return Verdict.reported(report, cause=note if user_draft else None)
