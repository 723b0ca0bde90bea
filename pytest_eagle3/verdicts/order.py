"""The capture-order check: SGLang captures the layers its own id rule says.

The rule is read from the installed SGLang's model file
(:mod:`pytest_eagle3.sglang_source.model_code`); ``test_capture_order`` measures
the running engine with :func:`~pytest_eagle3.verdicts.compare.compare_slots`
and :func:`check_capture_order` judges the comparison: when the two disagree
this is the one check that fails for it, naming both; the other checks of the
run follow what was measured (:func:`measured_snapshots`, :data:`FOLLOWS_MEASURED`).
Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_eagle3.verdicts.outcome import Verdict
from pytest_eagle3.verdicts.snapshots import label

#: test_capture_order's failure when SGLang's captures disagree with the rule read from its code.
RULE_DISAGREES = (
    "aux hidden states: {wrong} of {k} slots differ from the id rule read from {source} ({kind}): "
    "for ids {ids} SGLang captured {measured}, the rule says {predicted}. Something besides that method "
    "chose the captured layers (a server argument, code patched at run time), or pytest-eagle3's rule "
    "reader misread the file. The other tests of this run follow the measurement"
)
#: What another test says when it follows the measurement instead of the rule.
FOLLOWS_MEASURED = (
    "SGLang captured {measured} for ids {ids}, not {predicted} as the id rule read from {source} says: "
    "test_capture_order reports that once; this test follows the measurement"
)
WRONG_COUNT = (
    "ids {ids}: {sglang} returned {width} columns = {slots:g} slots of hidden {H}; "
    "its rule gives {n} slots ({want} columns)"
)
UNKNOWN_UNMATCHED = (
    "ids {ids}: the id rule could not be read ({source}), and slot(s) {slots} match no snapshot: "
    "what SGLang captures cannot be named"
)


def measured_snapshots(report: Any) -> "tuple[int, ...] | None":
    """The snapshot each slot holds when every slot cleanly matches one (what SGLang's
    rule really did for these ids), else ``None`` (a slot matches nothing: a
    broken capture, not a different rule)."""
    if report.problem is not None or not report.slots or not all(v.matched for v in report.slots):
        return None
    return tuple(v.best for v in report.slots)


def labels(indices: Sequence[int], num_layers: int) -> str:
    """``[hs[0], hs[3], final_prenorm]``."""
    return "[" + ", ".join(label(i, num_layers) for i in indices) + "]"


def check_width(width: int, *, slots: int, hidden_size: int, ids: Sequence[int] | None, sglang: str) -> Verdict:
    """Passed when a capture of ``width`` columns is ``slots`` slots of ``hidden_size``;
    failed with :data:`WRONG_COUNT` (``sglang``: the installed SGLang, described) otherwise."""
    H = hidden_size
    if width != slots * H:
        return Verdict.failed(WRONG_COUNT.format(ids=ids, sglang=sglang, width=width, slots=width / H, H=H,
                                                 n=slots, want=slots * H))
    return Verdict.passed()


def check_capture_order(report: Any, *, rule: Any, ids: Sequence[int] | None, predicted: Sequence[int],
                        num_layers: int) -> Verdict:
    """Judge one prompt's slot comparison against the id rule ``rule``
    (:class:`pytest_eagle3.conventions.IdRule`-like: ``known``, ``source``, ``kind``).

    Rule unknown: passed when every slot matches some snapshot (recorded, not
    judged), else failed with :data:`UNKNOWN_UNMATCHED`.  Rule known: failed with
    :data:`RULE_DISAGREES` and the report when every slot holds a clean snapshot
    but not the predicted one; otherwise the report speaks (a broken capture
    names its bug; the predicted snapshots, off by more than the tolerance, are
    a ``[precision]`` diagnosis, never a rule disagreement).
    """
    measured = measured_snapshots(report)
    if not rule.known:
        if measured is None:
            return Verdict.failed(UNKNOWN_UNMATCHED.format(
                ids=ids, source=rule.source, slots=[v.slot for v in report.slots if not v.matched]), report)
        return Verdict.passed(report)
    if not report.ok and measured is not None and tuple(measured) != tuple(predicted):
        return Verdict.failed(RULE_DISAGREES.format(
            wrong=len(report.wrong), k=len(report.slots), ids=ids, measured=labels(measured, num_layers),
            source=rule.source, kind=rule.kind, predicted=labels(predicted, num_layers)) + "\n" + report.message(),
            report)
    return Verdict.reported(report)


def follows_measured(measured: Sequence[int], *, ids: Sequence[int] | None, predicted: Sequence[int],
                     rule_source: str) -> str:
    """:data:`FOLLOWS_MEASURED`: a check that judges what SGLang captured
    (``measured``, :func:`measured_snapshots`) instead of the rule's prediction."""
    return FOLLOWS_MEASURED.format(measured=list(measured), ids=list(ids) if ids is not None else None,
                                   predicted=list(predicted), source=rule_source)
