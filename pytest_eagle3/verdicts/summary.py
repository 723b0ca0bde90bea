"""A verdict report in short: its JSON record and the cause it names.

:func:`report_record` is what the JSON report keeps of a comparison
(:mod:`pytest_eagle3.plugin.report`); :func:`cause_signature` tells two failed
reports that fail for one reason apart from two that do not, and
:func:`same_cause` words the short failure of every test after the first that
reports a cause (:func:`pytest_eagle3.suite.outcome.fail_if_bad` keeps the
run's ledger).  Pure Python.
"""

from __future__ import annotations

import math
import re
from collections.abc import MutableMapping
from typing import Any

from pytest_eagle3.verdicts.snapshots import label

#: A later test's failure when an earlier one already named the same cause.
SAME_CAUSE = ("same cause as {first}, which reports it in full: {line}")
_NUMBERS = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def report_record(report: Any) -> dict[str, Any]:
    """A JSON-ready summary of a verdict report: ``ok``, ``verdict`` (its first
    line), ``slots`` (per slot: expected and best-matching snapshot with their
    relative L2 errors) for a :class:`~pytest_eagle3.verdicts.compare.SlotReport`,
    ``lines`` for a per-rank report."""
    message = report.message()
    out: dict[str, Any] = {"ok": bool(report.ok), "verdict": message.splitlines()[0] if message else ""}
    slots = getattr(report, "slots", None)
    num_layers = getattr(report, "num_layers", None)
    if slots and num_layers is not None:
        out["slots"] = [
            {"slot": v.slot, "expected": label(v.expected, num_layers), "expected_rel_err": _json_float(v.expected_err),
             "best": label(v.best, num_layers), "best_rel_err": _json_float(v.best_err), "ok": v.ok}
            for v in slots
        ]
    if getattr(report, "kinds", None):
        out["diagnoses"] = list(report.kinds)
    if getattr(report, "problem", None):
        out["problem"] = report.problem
    if getattr(report, "lines", None) and not slots:
        out["lines"] = list(report.lines)
    return out


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def cause_signature(report: Any) -> tuple[str, ...] | None:
    """What a failed report's diagnosis says the wrong slots hold, with layer
    numbers and errors left out (``"slot # holds the MLP output of layer # after
    its post_feedforward_layernorm ..."``), when it names every wrong slot and
    no id-list pattern; else ``None``.  Two reports with one signature fail for
    one reason, whatever ids, contract or path each test used (each pointer
    keeps its own first slot line, layer numbers included; ``-v`` reports every
    test in full).  A per-rank report has the signature its ranks share
    (``slot_reports``), if they share one."""
    subs = getattr(report, "slot_reports", None)
    if subs:
        signatures = {cause_signature(r) for r in subs}
        return signatures.pop() if len(signatures) == 1 and None not in signatures else None
    diag = getattr(report, "diagnosis", None)
    if diag is None or diag.pattern_lines or not diag.slot_lines:
        return None
    if {v.slot for v in report.wrong} - set(diag.slot_lines):
        return None
    return tuple(sorted({_NUMBERS.sub("#", line) for line in diag.slot_lines.values()}))


def same_cause(report: Any, seen: MutableMapping[tuple[str, ...], str], here: str) -> str | None:
    """:data:`SAME_CAUSE` for a failed ``report`` whose :func:`cause_signature` an
    earlier test (``seen``: signature -> test) already reported in full, naming
    that test and this report's own first slot line; ``None`` when ``here`` is
    the first (it is recorded in ``seen``) or the report has no signature."""
    signature = cause_signature(report)
    if signature is None:
        return None
    first = seen.setdefault(signature, here)
    if first == here:
        return None
    diag = (getattr(report, "slot_reports", None) or [report])[0].diagnosis
    return SAME_CAUSE.format(first=first, line=diag.slot_lines[min(diag.slot_lines)])
