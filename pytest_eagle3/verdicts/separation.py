"""Exact separations of a run's comparisons: which attribute values hold every wrong
comparison and no right one.

The attributes (:data:`TABLE_ATTRIBUTES`): TP size, TP rank (the API's rows are
rank 0's output), forward mode, prefill chunk, path, batch size (the requests
its send held together), and the request's order on its engine (send, then its
place in the send; a threshold: every request from the first wrong one on).  A
comparison that does not know an attribute (a decode forward's chunk) is never
inside a conjunction on it, and a wrong one that does not know it rules the
attribute out.  :func:`separation` finds the smallest conjunctions;
:func:`separating_table` prints each attribute's wrong / right counts where
none separates; :func:`named_set` reads a diagnosis's named cause back as the
comparisons it holds.  Used by :mod:`pytest_eagle3.verdicts.run_cause`.  Pure Python.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, Callable, Sequence

from pytest_eagle3.verdicts.observation import LATER_CHUNK_UNNUMBERED, Observation

SEPARATING = "  {attribute}: {values}"
SEPARATING_HEAD = "  separating table (value: wrong / right comparisons):"

#: The request-order attribute of :data:`TABLE_ATTRIBUTES` (a threshold per engine).
SEND = "send on its engine"
#: Largest number of attributes in a :func:`separation`.
MAX_CONJUNCTION = 3
#: What a read returns where the observation may hold any of the attribute's values
#: (rows joined over a prompt's chunks), or any chunk but the first (the API's last
#: chunk, its number not recorded): a right one blocks every conjunction on the
#: attribute it may be inside of; a wrong one rules the attribute out.
ANY, LATER_CHUNK = "*", "2+"
#: The TP-rank value of the API's captures (they are rank 0's output).
API_RANK = "API (rank 0's output)"
#: The attributes of :func:`separation` and :func:`separating_table`, with how each observation reads.
#: Each read returns ``None`` where the attribute does not apply (a decode forward's
#: prefill chunk): never inside a conjunction on it; :data:`ANY` where it may hold any value.
TABLE_ATTRIBUTES: tuple[tuple[str, Callable[[Observation], "str | None"]], ...] = (
    ("TP size", lambda o: f"tp {o.tp}"),
    ("TP rank", lambda o: API_RANK if o.rank is None else f"rank {o.rank}"),
    ("forward mode", lambda o: o.mode),
    ("prefill chunk", lambda o: str(o.chunk) if o.chunk > 0 else None if o.chunk == 0
     else LATER_CHUNK if o.chunk == LATER_CHUNK_UNNUMBERED else ANY),
    ("path", lambda o: o.path),
    ("batch size", lambda o: str(o.batch) if o.batch > 0 else None),
    (SEND, lambda o: send_text(o)),
)


def conjunction_text(rule: Sequence[tuple[str, frozenset[str]]]) -> str:
    """``forward mode decode and path batch``: a conjunction as the diagnosis words it."""
    return " and ".join(f"{name} {' or '.join(sorted(values))}" for name, values in rule)


def separation(captures: Sequence[Observation]) -> list[list[tuple[str, frozenset[str]]]]:
    """The smallest conjunctions of attributes (:data:`TABLE_ATTRIBUTES`, at most
    :data:`MAX_CONJUNCTION`) that hold every wrong comparison and no right one,
    each attribute restricted to the values the wrong comparisons take (never all
    the values the run took), the send order to every send on an engine from its
    first wrong one on.  Empty: none separates, or nothing is right."""
    bad = [o for o in captures if not o.ok]
    good = [o for o in captures if o.ok]
    if not bad or not good:
        return []
    options = []
    for name, read in TABLE_ATTRIBUTES:
        values = frozenset(read(o) for o in bad)
        if values & {None, ANY, LATER_CHUNK}:
            continue  # a wrong comparison without a value of its own: the attribute cannot hold it
        if name == SEND:
            # Request order is a threshold: every send on an engine from its first wrong one on.
            first: dict[str, tuple[int, int]] = {}
            for o in bad:
                first[o.engine] = min(first.get(o.engine, request_key(o)), request_key(o))
            values = frozenset(read(o) for o in captures
                               if o.engine in first and request_key(o) >= first[o.engine] and o.order >= 0)
        if values and values < frozenset(read(o) for o in captures) - {None, ANY, LATER_CHUNK}:
            options.append((name, read, values))
    for size in range(1, MAX_CONJUNCTION + 1):
        found = [[(name, values) for name, _, values in rule] for rule in combinations(options, size)
                 if not any(all(holds(read(o), values) for _, read, values in rule) for o in good)]
        if found:
            return found
    return []


def holds(value: str | None, values: frozenset[str]) -> bool:
    """An observation's attribute ``value`` is (or may be: :data:`ANY`, :data:`LATER_CHUNK`) one of ``values``."""
    return value == ANY or value in values or (value == LATER_CHUNK and any(v != "1" for v in values))


def request_key(o: Observation) -> tuple[int, int]:
    """The request's order on its engine: (send, request within the send)."""
    return (o.order, o.request)


def send_text(o: Observation) -> str | None:
    """The send (and request) on its engine, as :data:`TABLE_ATTRIBUTES` reads it (engines apart)."""
    if o.order < 0:
        return None
    return (f"{o.order + 1}" + (f".{o.request + 1}" if o.request >= 0 else "")
            + (f" on {o.engine}" if o.engine else ""))


def relevant(captures: Sequence[Observation]) -> list[Observation]:
    """``captures`` without the right comparisons that examined none of the snapshots
    the wrong ones got wrong (the embedding check's slot 0 beside a fault in the layers'
    slots): they are no evidence for or against a cause.  Unchanged when a wrong
    comparison does not say which snapshots it got wrong."""
    bad = [o for o in captures if not o.ok]
    if not bad or not all(o.wrong_snapshots for o in bad):
        return list(captures)
    wrong = {i for o in bad for i in o.wrong_snapshots}
    return [o for o in captures if not o.ok or o.snapshots is None or wrong & set(o.snapshots)]


def named_set(diagnosis: Any, captures: Sequence[Observation]) -> list[Observation]:
    """The comparisons ``diagnosis`` names as the cause's (:attr:`RunDiagnosis.named`):
    those whose every named attribute takes one of the named values (the slots and rows
    inside them, :mod:`pytest_eagle3.verdicts.within`, narrow no comparison out)."""
    reads = dict(TABLE_ATTRIBUTES)
    return [o for o in captures if all(holds(reads[name](o), values) for name, values in diagnosis.named
                                       if name in reads)]


def separating_table(captures: Sequence[Observation]) -> list[str]:
    """Per attribute (:data:`TABLE_ATTRIBUTES`) that takes more than one value, each
    value with its wrong / right comparison counts: what a reader needs where no
    rule separates the wrong comparisons from the right ones."""
    lines = []
    for name, read in TABLE_ATTRIBUTES:
        counts: dict[str, list[int]] = {}
        for o in captures:
            value = read(o)
            if value not in (None, ANY, LATER_CHUNK):
                counts.setdefault(value, [0, 0])[0 if not o.ok else 1] += 1
        if len(counts) < 2:
            continue
        values = ", ".join(f"{v}: {w} / {r}" for v, (w, r) in counts.items())
        lines.append(SEPARATING.format(attribute=name, values=values))
    return [SEPARATING_HEAD, *lines] if lines else []


