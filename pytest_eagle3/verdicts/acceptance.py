"""The acceptance checks: speculative decoding with a trained draft meets its
gate, and the gate has teeth.

* :func:`check_output`: speculative output equals the greedy continuation;
* :func:`check_gate`: the accept length and rate clear the draft's gates (a
  ``DraftGates`` of :mod:`pytest_eagle3.draft.power`: ``min_accept_length``,
  ``min_accept_rate``, ``source``), or collapse below them where the installed
  SGLang's id rule predicts a miswired draft (XFAIL; holding then FAILS);
* :func:`check_relative`: at TP > 1 the accept length is at least
  :data:`RELATIVE_GATE` x the TP 1 run's;
* :func:`check_power`: offline, on SGLang's captures, the correct wiring clears
  the gate and every miswiring falls below it (:func:`power_problems`).

A failure leads with :data:`CAPTURES_WRONG` when this run already found the
captures wrong (``causes``: the tests that reported it).  Pure Python.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pytest_eagle3.verdicts.outcome import Verdict

#: A parallel run's accept length must be at least this fraction of TP 1's (vLLM's pattern).
RELATIVE_GATE = 0.95
GATE_FAILED = (
    "accept length {length:.3f} (rate {rate:.3f}) with {draft} at TP {tp} is below the gate "
    "{gate_length} (rate {gate_rate}, from {source}); per prompt: {per}"
)
RELATIVE_FAILED = "accept length {length:.3f} at TP {tp} is below {ratio} x the TP 1 run's {base:.3f}"
OUTPUT_DIVERGES = (
    "{name}: speculative output leaves the greedy continuation at token {j} ({got} != {want}); "
    "speculative decoding must equal greedy decoding at temperature 0"
)
COLLAPSED = ("{reason}; measured at TP {tp}: accept length {length:.3f} (rate {rate:.3f}), below the gate "
             "{gate}: the draft's acceptance collapses as the rule predicts")
PREDICTED_COLLAPSE_HELD = (
    "accept length {length:.3f} clears the gate {gate} although the installed SGLang's id rule predicts a "
    "miswired draft ({reason}): the rule read from the installed code does not describe what this SGLang "
    "feeds the draft (test_capture_order measures it)"
)
OFFLINE_COLLAPSE = ("{reason}; offline, the draft reaches accept length {got:.2f} on what SGLang captures and "
                    "{ref:.2f} on its training contract's layers of the reference (gate {gate})")
#: Leads an acceptance failure when this run already found the captures wrong.
CAPTURES_WRONG = ("the aux hidden states this SGLang captures are wrong ({tests} reports it): a draft fed them "
                  "cannot meet its gate")
LOST_POWER = (
    "the acceptance gate has lost its power: miswiring {names} still reaches accept length {got} "
    ">= gate {gate} on SGLang's captures; a passing acceptance test would prove nothing"
)
WEAK_CORRECT = "the draft on SGLang's captures reaches accept length {got} < gate {gate} (reference: {ref})"


def check_output(names: Sequence[str], outputs: Sequence[Sequence[int]],
                 expected: Sequence[Sequence[int]]) -> Verdict:
    """Failed with :data:`OUTPUT_DIVERGES` at the first prompt whose speculative
    output leaves its greedy continuation (compared over the continuation's length)."""
    for name, output, want in zip(names, outputs, expected):
        got = list(output)[: len(want)]
        j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if j is not None:
            return Verdict.failed(OUTPUT_DIVERGES.format(name=name, j=j, got=got[j], want=want[j]))
    return Verdict.passed()


def _lead(causes: Sequence[str]) -> str:
    return CAPTURES_WRONG.format(tests=", ".join(causes)) if causes else ""


def check_gate(*, length: float, rate: float | None, gates: Any, draft: str, tp: int, per: Mapping[str, float],
               xfail_reason: str | None = None, causes: Sequence[str] = ()) -> Verdict:
    """Judge the measured accept ``length`` and ``rate`` (``None``: SGLang reports
    none) against ``gates``.

    With ``xfail_reason`` (the rule predicts a miswired draft) the acceptance must
    collapse: XFAIL with :data:`COLLAPSED`, or failed with
    :data:`PREDICTED_COLLAPSE_HELD` when it clears the gate.  Otherwise failed
    with :data:`GATE_FAILED` below the gate (after :data:`CAPTURES_WRONG` when
    ``causes``), passed above it."""
    shown_rate = rate if rate is not None else float("nan")
    below = length < gates.min_accept_length or (rate is not None and rate < gates.min_accept_rate)
    if xfail_reason is not None:
        if not below:
            return Verdict.failed(PREDICTED_COLLAPSE_HELD.format(length=length, gate=gates.min_accept_length,
                                                                 reason=xfail_reason))
        return Verdict.xfailed(COLLAPSED.format(reason=xfail_reason, length=length, rate=shown_rate,
                                                gate=gates.min_accept_length, tp=tp))
    if below:
        lead = _lead(causes)
        return Verdict.failed((lead + "\n" if lead else "") + GATE_FAILED.format(
            length=length, rate=shown_rate, draft=draft, tp=tp, gate_length=gates.min_accept_length,
            gate_rate=gates.min_accept_rate, source=gates.source, per=per))
    return Verdict.passed()


def check_relative(*, length: float, tp: int, base: float | None) -> Verdict:
    """Failed with :data:`RELATIVE_FAILED` when the accept ``length`` at ``tp`` is
    below :data:`RELATIVE_GATE` x the TP 1 run's ``base`` (``None``: no TP 1 run)."""
    if tp != 1 and base is not None and length < RELATIVE_GATE * base:
        return Verdict.failed(RELATIVE_FAILED.format(length=length, tp=tp, ratio=RELATIVE_GATE, base=base))
    return Verdict.passed()


def power_problems(qualities: Mapping[str, Any], gates: Any, reference: Any = None, *, correct: str,
                   miswirings: Collection[str]) -> list[str]:
    """One line per way the gate lacks teeth (empty: it has them).

    ``qualities``: wiring name -> offline quality (``accept_length``) of
    :func:`pytest_eagle3.draft.power.offline_power`; ``correct`` names the
    correct wiring, ``miswirings`` those that must fall below the gate
    (:data:`pytest_eagle3.draft.wiring.MISWIRINGS`); ``reference``: the correct
    wiring's quality on the reference, shown beside a weak one."""
    lines = []
    right = qualities[correct]
    if right.accept_length < gates.min_accept_length:
        lines.append(WEAK_CORRECT.format(got=f"{right.accept_length:.2f}", gate=gates.min_accept_length,
                                         ref=f"{reference.accept_length:.2f}" if reference else "n/a"))
    strong = {n: q.accept_length for n, q in qualities.items() if n in miswirings
              and q.accept_length >= gates.min_accept_length}
    if strong:
        lines.append(LOST_POWER.format(names=", ".join(sorted(strong)),
                                       got=f"{max(strong.values()):.2f}", gate=gates.min_accept_length))
    return lines


def check_power(on_sglang: Mapping[str, Any], on_reference: Mapping[str, Any], gates: Any, *, correct: str,
                miswirings: Collection[str], xfail_reason: str | None = None,
                causes: Sequence[str] = ()) -> Verdict:
    """The gate has teeth on SGLang's captures (:func:`power_problems` of
    ``on_sglang``, the reference's correct wiring beside it).

    With ``xfail_reason`` (SGLang feeds the draft other layers than its
    contract) the draft must collapse offline on SGLang's captures while the
    reference's own layers clear the gate: XFAIL with :data:`OFFLINE_COLLAPSE`;
    else failed (with :data:`PREDICTED_COLLAPSE_HELD` when nothing else is wrong)."""
    problems = power_problems(on_sglang, gates, on_reference[correct], correct=correct, miswirings=miswirings)
    if xfail_reason is not None:
        collapsed = on_sglang[correct].accept_length < gates.min_accept_length
        if collapsed and not power_problems(on_reference, gates, correct=correct, miswirings=miswirings):
            return Verdict.xfailed(OFFLINE_COLLAPSE.format(reason=xfail_reason, got=on_sglang[correct].accept_length,
                                                           ref=on_reference[correct].accept_length,
                                                           gate=gates.min_accept_length))
        problems = problems or [PREDICTED_COLLAPSE_HELD.format(length=on_sglang[correct].accept_length,
                                                               gate=gates.min_accept_length, reason=xfail_reason)]
    if problems:
        lead = _lead(causes)
        return Verdict.failed("\n".join(([lead] if lead else []) + problems))
    return Verdict.passed()
