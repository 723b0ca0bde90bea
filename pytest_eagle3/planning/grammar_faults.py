"""Faults sampled from the grammar, as SGLang's workers inject them
(``pytest-eagle3 self-test --grammar N --seed S``).

A sampled fault is a *confinement* (a conjunction of one to three attributes of
the run-level diagnosis, :data:`pytest_eagle3.verdicts.separation.TABLE_ATTRIBUTES`,
each restricted to a random non-empty strict subset of its values) times an
*effect* (a layer fault kind of :mod:`pytest_eagle3.worker.faults`).  The worker
confines a layer fault by three of those attributes:

* TP size: the fault's ``tp`` (only engines of those sizes write it);
* TP rank: its ``rank`` (only those ranks write it; the API returns rank 0's
  captures, so rank 0 stands for the diagnosis's values ``rank 0`` and
  ``API (rank 0's output)``);
* forward mode: its ``when`` (:data:`pytest_eagle3.worker.fault_when.WHEN`).

The path and the send order are left to the simulator
(:mod:`pytest_eagle3.verdicts.grammar`): inside a forward the worker sees neither
how a test sent its requests nor which send they came in.  ``partial-sum`` is
drawn only for confinements inside TP 2 (at TP 1 the MLP output is complete and
the fault changes nothing).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from pytest_eagle3.verdicts.grammar import Conjunction, default_run, inside
from pytest_eagle3.verdicts.run_wording import MODES
from pytest_eagle3.verdicts.separation import API_RANK, conjunction_text

__all__ = ["REAL_EFFECTS", "SampledFault", "sample_faults", "to_fault"]

#: Effects the worker confines (layer faults that honour ``tp``, ``rank`` and ``when``).
REAL_EFFECTS = ("no-residual", "normalized-input", "partial-sum")
#: The attributes the worker confines, with the values a ``--tp 2`` run takes (worker values).
REAL_ATTRIBUTES = (("TP size", (1, 2)), ("TP rank", (0, 1)), ("forward mode", MODES))


@dataclass(frozen=True)
class SampledFault:
    """One sample: its place in the sequence, the confinement as the diagnosis words
    attributes (:data:`~pytest_eagle3.verdicts.separation.TABLE_ATTRIBUTES` names and
    values), the effect, and the worker's fault (``--eagle3-fault`` JSON)."""

    index: int
    conjunction: Conjunction
    effect: str
    fault: dict[str, Any]

    @property
    def text(self) -> str:
        """``TP rank rank 1 and forward mode decode x no-residual``."""
        return f"{conjunction_text(self.conjunction)} x {self.effect}"

    @property
    def fault_json(self) -> str:
        return json.dumps(self.fault, sort_keys=True)


def to_fault(effect: str, picks: dict[str, tuple[Any, ...]]) -> tuple[Conjunction, dict[str, Any]]:
    """The diagnosis's conjunction and the worker's fault for ``effect`` confined to
    ``picks`` (attribute -> worker values: TP sizes, TP ranks, forward modes)."""
    fault: dict[str, Any] = {"kind": effect}
    conj = []
    for name, values in picks.items():
        if name == "TP size":
            fault["tp"] = sorted(int(v) for v in values)
            conj.append((name, frozenset(f"tp {v}" for v in values)))
        elif name == "TP rank":
            fault["rank"] = sorted(int(v) for v in values)
            conj.append((name, frozenset({f"rank {v}" for v in values} | ({API_RANK} if 0 in values else set()))))
        elif name == "forward mode":
            fault["when"] = [m for m in MODES if m in values]
            conj.append((name, frozenset(values)))
        else:
            raise ValueError(f"the worker cannot confine a fault by {name!r}")
    return tuple(conj), fault


def sample_faults(n: int, seed: int) -> list[SampledFault]:
    """``n`` faults drawn with ``random.Random(seed)``: one to three attributes of
    :data:`REAL_ATTRIBUTES`, each a random non-empty strict subset of its values,
    kept when it holds some and not all of a default run's comparisons
    (:func:`pytest_eagle3.verdicts.grammar.default_run`); then an effect."""
    rng = random.Random(seed)
    run = default_run()
    out: list[SampledFault] = []
    while len(out) < n:
        names = rng.sample([name for name, _ in REAL_ATTRIBUTES], rng.randint(1, len(REAL_ATTRIBUTES)))
        domain = dict(REAL_ATTRIBUTES)
        picks = {name: tuple(sorted(rng.sample(domain[name], rng.randint(1, len(domain[name]) - 1)), key=str))
                 for name in names}
        tp2_only = picks.get("TP size") == (2,) or picks.get("TP rank") == (1,)
        effect = rng.choice([e for e in REAL_EFFECTS if tp2_only or e != "partial-sum"])
        conj, fault = to_fault(effect, picks)
        held = inside(run, conj)
        if held and len(held) < len(run):
            out.append(SampledFault(len(out) + 1, conj, effect, fault))
    return out
