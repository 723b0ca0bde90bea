"""A speculative verify's rows, each with the token sequence its reference is computed on.

In a verify forward (``TARGET_VERIFY``) the target runs every draft node of a
request's token tree at once under a tree mask: node ``i`` sees the committed
prefix, its root path and itself, never its siblings (0.5.23
``srt/speculative/eagle_utils.py`` ``build_tree_kernel_efficient``; a chain is
the tree whose every node has one child).  So what the target captures at node
``i`` is what it captures for the sequence *committed prefix + the tokens on
node i's root path*, at node ``i``'s position, not the request's final
sequence: only the accepted path lies on that.  The root (node 0) is the last
committed token; its position ``p0`` is where the request's committed prefix
ends.

:func:`verify_node_records` cuts each rank's verify records into groups of
rows that share one root path (the path to a leaf covers every node on it) and
gives each group the sequence its reference must be computed on
(:attr:`~pytest_eagle3.engine.recordings.Record.reference`; ``()`` where that
is a prefix of the final sequence, whose reference the caller has anyway).
The tree comes from SGLang's own links, recorded in the worker
(:attr:`~pytest_eagle3.engine.recordings.Record.parents`); a record without
them (an SGLang whose verify input has no ``retrieve_next_token``) keeps the
rows whose inputs follow the final sequence
(:func:`~pytest_eagle3.engine.recordings.verified_rows`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from pytest_eagle3.engine.recordings import Record, verified_rows

VERIFY = "TARGET_VERIFY"


def root_path(parents: Sequence[int], node: int) -> list[int] | None:
    """Rows from the root to ``node`` (both included), or None when ``node`` is not
    reached from the root (parent -2, or a loop)."""
    path = [node]
    while parents[path[-1]] >= 0:
        if len(path) > len(parents):
            return None
        path.append(parents[path[-1]])
    if parents[path[-1]] != -1:
        return None
    return path[::-1]


def node_groups(record: Record, sequence: Sequence[int]) -> list[tuple[list[int], tuple[int, ...]]]:
    """One request's verify record cut into ``(rows, reference sequence)`` groups:
    the rows on the root path of one leaf not already in an earlier group, and the
    committed prefix plus that path's tokens (``()`` when it is a prefix of
    ``sequence``, the request's final tokens).  ``[]`` without a tree or positions,
    or when the root's position lies outside ``sequence``."""
    parents, pos = list(record.parents), record.positions
    if not parents or pos is None or len(parents) != record.aux.shape[0]:
        return []
    p0 = int(pos[0])
    if not 0 <= p0 < len(sequence) or int(record.input_ids[0]) != int(sequence[p0]):
        return []
    ids = record.input_ids.tolist()
    has_child = {p for p in parents if p >= 0}
    seen: set[int] = set()
    groups = []
    for leaf in range(len(parents)):
        if leaf in has_child:
            continue
        path = root_path(parents, leaf)
        if path is None:
            continue
        rows = [r for r in path if r not in seen]
        if not rows:
            continue
        seen.update(rows)
        tokens = [int(ids[r]) for r in path]
        own = tuple(int(t) for t in sequence[:p0]) + tuple(tokens)
        final = tuple(int(t) for t in sequence[: len(own)])
        groups.append((sorted(rows), () if own == final else own))
    return groups


def verify_node_records(records: Mapping[int, Sequence[Record]], sequences: Mapping[str, Sequence[int]],
                        *, off_path: bool = True) -> dict[int, list[Record]]:
    """Per rank, each verify forward of a request in ``sequences`` (rid -> its final
    tokens), cut into groups of tree nodes with the sequence each group's reference
    is computed on (``Record.reference``), in forward order.  A record with no tree,
    or every record with ``off_path=False``, keeps its :func:`verified_rows`
    (reference: the final sequence).  Forwards with no such row are dropped on
    every rank alike (the ranks see the same inputs)."""
    out: dict[int, list[Record]] = {}
    for rank, recs in records.items():
        mine = []
        for rec in recs:
            if rec.mode != VERIFY:
                continue
            for rid in rec.rids:
                part = rec.for_request(rid)
                if part is None or rid not in sequences:
                    continue
                groups = node_groups(part, sequences[rid]) if off_path else []
                if not groups and not (part.parents and off_path):
                    rows = verified_rows(part, sequences[rid])
                    groups = [(rows, ())] if rows else []
                mine += [_rows(part, rows, reference) for rows, reference in groups]
        out[rank] = mine
    return out


def _rows(part: Record, rows: list[int], reference: tuple[int, ...]) -> Record:
    import torch

    index = torch.tensor(rows, dtype=torch.long)
    pos = part.positions[index] if part.positions is not None else None
    return replace(part, aux=part.aux[index], input_ids=part.input_ids[index], positions=pos,
                   lens=(len(rows),), parents=(), reference=reference)


def tree_summary(records: Sequence[Record], sequences: Mapping[str, Sequence[int]]) -> str:
    """``verify compared N tree nodes of M forwards (K off the accepted path)`` for one rank's
    :func:`verify_node_records` output (``sequences``: rid -> final tokens): what a passing
    test compared."""
    nodes = sum(r.aux.shape[0] for r in records)
    off = 0
    for r in records:
        seq = sequences.get(r.rids[0], ())
        if r.positions is not None:
            off += sum(1 for p, t in zip(r.positions.tolist(), r.input_ids.tolist())
                       if not (p < len(seq) and int(seq[p]) == int(t)))
    forwards = len({(r.seq, r.rids) for r in records})
    return f"verify compared {nodes} tree nodes of {forwards} forwards ({off} off the accepted path)"
