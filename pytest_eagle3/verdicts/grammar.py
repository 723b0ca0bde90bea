"""A fault grammar and a simulator of a run's observations, to test the run-level diagnosis.

A fault is a *confinement* (a conjunction of attribute values: TP size, TP rank,
forward mode, prefill chunk, path, batch size, send on its engine, the
attributes of :data:`pytest_eagle3.verdicts.separation.TABLE_ATTRIBUTES`, and
the aux slots it writes, :data:`pytest_eagle3.verdicts.within.SLOT`) times an
*effect*; the comparisons inside the confinement are wrong in those slots, all
others right.  The
simulator lays out the observations a run of the packaged suite leaves
(:func:`default_run`: the capture order and contract tests at TP 1 and 2, the
path variants, the per-rank tests' rows of both TP ranks), samples confinements
(:func:`sample_confinement`, seeded) and classifies what
:func:`~pytest_eagle3.verdicts.run_cause.diagnose_run` names (:func:`classify`):

* ``exact``: the named cause is the sampled conjunction;
* ``coarser``: another conjunction that holds the same comparisons (the run's
  selection cannot tell the two apart);
* ``unnamed``: nothing named (``[mixed]`` with its separating table, or
  ``[global]``), with the reason: the confinement covers every comparison, or
  takes more than :data:`~pytest_eagle3.verdicts.run_cause.MAX_CONJUNCTION`
  attributes to state;
* ``wrong``: the named cause holds a right comparison or misses a wrong one.

Effects change what a test's own diagnosis says of each slot, not which
comparisons fail, so the simulator marks comparisons wrong with the effect's
per-test tag only.  Pure Python; ``benchmarks/diagnosis_grammar.py`` prints the
shares per conjunction size.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Sequence

from pytest_eagle3.verdicts.observation import LATER_CHUNK_UNNUMBERED
from pytest_eagle3.verdicts.run_cause import Observation, compared, diagnose_run
from pytest_eagle3.verdicts.separation import (
    ANY, LATER_CHUNK, MAX_CONJUNCTION, SEND, TABLE_ATTRIBUTES, conjunction_text, holds, named_set,
)
from pytest_eagle3.verdicts.within import SLOT

#: Effects a fault can have (the per-test tag its wrong comparisons carry).
EFFECTS = ("no-residual", "partial-sum", "normalized-input", "offset-twice", "reversed-order")
#: Classes of :func:`classify`.
CLASSES = ("exact", "coarser", "unnamed", "wrong")
#: Classes of :func:`judge_run` (a real run): ``off-target``, the fault's wrong
#: comparisons are not the ones its confinement holds (an injection that reached
#: further, or less far, than sampled; no verdict on the diagnosis).
RUN_CLASSES = (*CLASSES, "off-target")

Conjunction = tuple[tuple[str, frozenset[str]], ...]


#: The prompts a batched send holds in :func:`default_run`.
BATCH = 3


def default_run(ids: tuple[int, ...] = (0, 3, 5)) -> list[Observation]:
    """The right observations of a default-selection run at ``--tp 2``, in send order
    per engine: capture order and contracts (prefill and later chunks), the path
    variants (decode, batch, radix-cache hit) at TP 1 and 2, and the per-rank
    tests' prefill, later-chunk and decode rows on TP ranks 0 and 1.  The API's
    later-chunk rows do not know their chunk's number (:data:`ANY`: a fault on
    chunk 2 reaches them, and rules the chunk attribute out); the per-rank rows do."""
    out: list[Observation] = []
    slots = len(ids)

    def add(test: str, check: str, tp: int, mode: str, order: int, engine: str, **more) -> None:
        chunk = 1 if mode == "prefill" else more.pop("chunk", 0)
        more.pop("chunk", None)
        out.append(Observation(test, check, True, tp=tp, mode=mode, ids=ids, order=order, engine=engine,
                               chunk=chunk, slot_count=slots, **{"batch": 1, **more}))

    for tp in (1, 2):
        engine = f"capture-tp{tp}"
        order = 0
        for test in ("order", "contract"):
            for mode in ("prefill", "later-chunk"):
                add(f"{test}[tp{tp}]", "captures", tp, mode, order, engine, chunk=LATER_CHUNK_UNNUMBERED)
            order += 1
        for path, modes in (("decode", ("prefill", "decode")), ("batch", ("prefill", "decode")),
                            ("radix-cache-hit", ("cache-hit",))):
            for mode in modes:
                add(f"paths[tp{tp}-{path}]", "captures", tp, mode, order, engine, path=path,
                    batch=BATCH if path == "batch" else 1)
            order += 1
        if tp == 2:
            for rank in (0, 1):
                for mode in ("prefill", "later-chunk", "decode"):
                    add("per_rank[tp2]", "ranks", 2, mode, order, engine, rank=rank,
                        chunk=2 if mode == "later-chunk" else 0)
    return out


def _values(run: Sequence[Observation]) -> dict[str, list[str]]:
    out = {name: sorted({v for o in run if (v := read(o)) not in (None, ANY, LATER_CHUNK)})
           for name, read in TABLE_ATTRIBUTES}
    out[SLOT] = [str(s) for s in range(max(o.slot_count for o in run))]
    return out


def sample_confinement(rng: random.Random, run: Sequence[Observation], size: int) -> Conjunction:
    """``size`` attributes, each restricted to a random non-empty strict subset of the
    values the run takes (the send order: every send on one engine from a random
    one on), that hold at least one comparison of ``run`` and not all of them."""
    values = {k: v for k, v in _values(run).items() if len(v) > 1}
    while True:
        names = rng.sample(sorted(values), size)
        conj = tuple((n, _sends_from(rng, run) if n == SEND else
                      frozenset(rng.sample(values[n], rng.randint(1, len(values[n]) - 1)))) for n in names)
        if inside(run, conj) and len(inside(run, conj)) < len(run):
            return conj


def _sends_from(rng: random.Random, run: Sequence[Observation]) -> frozenset[str]:
    """A request-order confinement: every send on one engine from a random send on."""
    engine = rng.choice(sorted({o.engine for o in run}))
    orders = sorted({o.order for o in run if o.engine == engine})
    k = rng.choice(orders[1:])
    return frozenset(f"{o.order + 1} on {engine}" for o in run if o.engine == engine and o.order >= k)


def inside(run: Sequence[Observation], conj: Conjunction) -> list[Observation]:
    """The comparisons of ``run`` ``conj`` holds (its slots narrow none out)."""
    reads = dict(TABLE_ATTRIBUTES)
    return [o for o in run if all(holds(reads[n](o), vals) for n, vals in conj if n in reads)]


def _slots(conj: Conjunction) -> frozenset[str] | None:
    return next((vals for n, vals in conj if n == SLOT), None)


def apply(run: Sequence[Observation], conj: Conjunction, effect: str) -> list[Observation]:
    """``run`` with the comparisons inside ``conj`` wrong in its slots (every slot
    where it names none), tagged ``effect``."""
    wrong = {id(o) for o in inside(run, conj)}
    named = _slots(conj)

    def slots(o: Observation) -> tuple[int, ...]:
        every = range(o.slot_count)
        return tuple(s for s in every if named is None or str(s) in named)

    return [replace(o, ok=False, kinds=(effect,), line=f"[{effect}]", wrong_slots=slots(o)) if id(o) in wrong
            else o for o in run]


def _minimal(run: Sequence[Observation], conj: Conjunction) -> Conjunction:
    """``conj`` without the attributes that add nothing on ``run`` (its slots always add)."""
    chosen = inside(run, conj)
    kept = list(conj)
    for item in list(conj):
        trial = [x for x in kept if x != item]
        if item[0] != SLOT and trial and inside(run, tuple(trial)) == chosen:
            kept = trial
    return tuple(kept)


def classify(run: Sequence[Observation], conj: Conjunction, effect: str = "no-residual") -> tuple[str, str]:
    """``(class, the diagnosis headline)`` of the fault ``conj`` x ``effect`` on ``run``."""
    faulted = apply(run, conj, effect)
    diag = diagnose_run(faulted)
    assert diag is not None
    wrong = [o for o in faulted if not o.ok]
    if not diag.named:
        return "unnamed", diag.headline
    named = named_set(diag, faulted)
    if sorted(map(id, named)) != sorted(map(id, wrong)) or _slots(diag.named) not in (None, _slots(conj)):
        return "wrong", diag.headline
    if {(n, v) for n, v in diag.named} == set(_minimal(faulted, conj)):
        return "exact", diag.headline
    return "coarser", diag.headline


def simulate(samples: int, size: int, seed: int = 0) -> dict[str, int]:
    """Counts of :data:`CLASSES` over ``samples`` faults with ``size``-attribute
    confinements on :func:`default_run`, seeded."""
    rng = random.Random(seed * 1000 + size)
    run = default_run()
    counts = dict.fromkeys(CLASSES, 0)
    for _ in range(samples):
        conj = sample_confinement(rng, run, min(size, MAX_CONJUNCTION + 1))
        cls, _ = classify(run, conj, rng.choice(EFFECTS))
        counts[cls] += 1
    return counts


def tightened(run: Sequence[Observation], conj: Conjunction) -> Conjunction:
    """``conj`` on ``run`` as a diagnosis would state it: each attribute's values cut
    to those the comparisons inside take (the send order stays a threshold), then
    without the attributes that add nothing."""
    held = inside(run, conj)
    reads = dict(TABLE_ATTRIBUTES)
    taken = {n: {reads[n](o) for o in held} for n, _ in conj if n in reads}
    return _minimal(run, tuple((n, vals if n not in taken or n == SEND else frozenset(vals & taken[n]))
                               for n, vals in conj))


def judge_run(observations: Sequence[Observation], named: Conjunction, conj: Conjunction) -> tuple[str, str]:
    """``(class, why)`` of a real run with the fault ``conj`` injected: its
    ``observations`` (the report's) and the cause its diagnosis ``named`` (``()``:
    none), on the comparisons the rules separate
    (:func:`~pytest_eagle3.verdicts.run_cause.compared`).  Classes: :data:`RUN_CLASSES`."""
    captures, _ = compared(observations)
    wrong = [o for o in captures if not o.ok]
    held = inside(captures, conj)
    if sorted(map(id, held)) != sorted(map(id, wrong)):
        extra = [o for o in wrong if id(o) not in set(map(id, held))]
        missed = [o for o in held if o.ok]
        return "off-target", (f"{len(wrong)} comparison(s) wrong, {len(held)} inside the confinement: "
                              f"{len(extra)} wrong outside ({extra[0].context() if extra else '-'}), "
                              f"{len(missed)} right inside ({missed[0].context() if missed else '-'})")
    if not named:
        return "unnamed", f"{len(wrong)} wrong of {len(captures)}; nothing named"
    chosen = inside(captures, named)
    if sorted(map(id, chosen)) != sorted(map(id, wrong)):
        return "wrong", f"the named cause holds {len(chosen)} comparison(s), {len(wrong)} are wrong"
    sampled = tightened(captures, conj)
    table = dict(TABLE_ATTRIBUTES)  # the slots and rows inside: the effect's reach, not sampled on engines
    if {x for x in named if x[0] in table} == {x for x in sampled if x[0] in table}:
        return "exact", f"all {len(wrong)} wrong comparisons, none right"
    return "coarser", (f"the sampled {conjunction_text(sampled)} holds the same {len(wrong)} comparisons "
                       "in this selection")
