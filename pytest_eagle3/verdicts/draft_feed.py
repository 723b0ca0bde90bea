"""The draft's inputs: what the EAGLE draft read after each prefill chunk and each verify.

Every row the draft reads pairs the target's aux hidden states at position ``p``
with the token at ``p + 1`` of the request's final sequence
(:mod:`pytest_eagle3.engine.draft_inputs`).  :func:`check_draft_feed` compares
both, on every TP rank, and names what a wrong row is:

* ``[chunk-seam]``: wrong token ids only at the ends of prefill chunks that are
  not the prompt's last: the draft was fed something other than the next prompt
  token there (SGLang issue #26329, fixed by PR #26800,
  ``srt/speculative/eagle_utils.py`` ``_eagle_prefill_tail_tokens``);
* ``[tree-order]``: after a token-tree verify, the block's rows hold the verify's
  tree nodes in tree order (row ``k`` = node ``k``'s capture, a node off the
  accepted path) instead of the accepted path: the aux hidden states were not
  moved to the front with the tokens and the KV slots
  (``srt/speculative/eagle_worker_common.py`` ``_finalize_accept_tree_path``;
  SGLang issue #37949 reports capture output left in tree order);
* otherwise the rows, positions and errors, unnamed.

Pure torch on CPU tensors; no pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from pytest_eagle3.verdicts.distance import rel_err
from pytest_eagle3.verdicts.outcome import Verdict
from pytest_eagle3.verdicts.snapshots import fmt_err, label

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.engine.draft_inputs import DraftFeed
    from pytest_eagle3.engine.recordings import Record

#: The tags :func:`check_draft_feed` names (beside :data:`pytest_eagle3.verdicts.diagnose.KINDS`).
KINDS = ("tree-order", "chunk-seam")
NOTHING = ("the draft's input recorder recorded {what} on the {draft} engine: the draft's inputs were not "
           "checked (is the pytest-eagle3 SGLang plugin loaded; did SGLang replay its draft extend as a graph?)")
CHUNK_SEAM = ("[chunk-seam] token ids wrong only at prefill chunk ends: at {n} chunk end(s) ({where}) the draft "
              "read {got} where the next prompt token is {want}; every other row right. SGLang issue #26329, fixed "
              "by PR #26800 (srt/speculative/eagle_utils.py _eagle_prefill_tail_tokens)")
TREE_ORDER = ("[tree-order] after {n} of {verifies} verifies the draft read the verify's tree nodes in tree order: "
              "{example}; the accepted path's tokens are right. The aux hidden states were not moved to the front "
              "with the tokens and KV slots (srt/speculative/eagle_worker_common.py _finalize_accept_tree_path; "
              "SGLang issue #37949)")
ROWS = "{kind} rows wrong on TP rank {rank}: {n} of {total}, e.g. {examples}"


def _expected_aux(reference: "torch.Tensor", expected: Sequence[int], positions: "torch.Tensor") -> "torch.Tensor":
    import torch

    return torch.cat([reference[e][positions] for e in expected], dim=-1)


def _verify_at(verify: Sequence["Record"], rid: str, root: int) -> "Record | None":
    """The whole verify forward of ``rid`` whose root sits at ``root`` (rows in tree order)."""
    for rec in verify:
        part = rec.for_request(rid) if rec.mode == "TARGET_VERIFY" else None
        if part is not None and part.positions is not None and int(part.positions[0]) == root:
            return part
    return None


def _tree_order(feed: "DraftFeed", row: int, sequence: Sequence[int], verify: Sequence["Record"],
                tol: float) -> str | None:
    """``row k ... holds tree node k's capture (token X at position p)`` when the draft's row
    ``row`` after a verify equals the verify's row of the same index (tree order) and that node
    is not the accepted node of the row's position."""
    root = int(feed.positions[0])
    rec = _verify_at(verify, feed.rid, root)
    if rec is None or row >= rec.aux.shape[0]:
        return None
    node_pos, node_tok, want_pos = int(rec.positions[row]), int(rec.input_ids[row]), int(feed.positions[row])
    on_path = node_pos < len(sequence) and int(sequence[node_pos]) == node_tok
    if (on_path and node_pos == want_pos) or float(rel_err(feed.aux[row], rec.aux[row])) > tol:
        return None
    where = f"the accepted node of position {node_pos}" if on_path else "off the accepted path"
    return (f"row {row} of request {feed.rid}'s block after the verify at position {root} (position {want_pos}) "
            f"holds tree node {row}'s capture (token {node_tok} at position {node_pos}, {where})")


def check_draft_feed(feeds: Mapping[int, Sequence["DraftFeed"]], sequences: Mapping[str, Sequence[int]],
                     references: Mapping[str, "torch.Tensor"], *, expected: Sequence[int], num_layers: int,
                     tol: float, draft: str, verify: Mapping[int, Sequence["Record"]] | None = None) -> Verdict:
    """Every row the draft read, on every TP rank: token ``S[p + 1]`` and the aux
    hidden states of ``S`` at ``p`` (``expected`` snapshot indices of
    ``references[rid]``, ``[L+2, N, H]`` of the final sequence ``sequences[rid]``).

    ``verify``: rank -> the target's recorded forwards of the same run, whose
    verify rows name a ``[tree-order]`` fault.  Fails when nothing was recorded
    (after a prefill or after a verify), or with the named cause (module
    docstring) or the wrong rows.
    """
    rows = [f for fs in feeds.values() for f in fs]
    kinds = {f.kind for f in rows}
    if {"prefill", "after-verify"} - kinds:
        missing = " and ".join(sorted({"prefill", "after-verify"} - kinds))
        return Verdict.failed(NOTHING.format(what=f"no {missing} draft extend", draft=draft))
    seams: list[tuple[int, int, int, int]] = []  # rank, position, got, want
    other_ids: list[str] = []
    tree: list[str] = []
    bad_aux: dict[tuple[int, str], list[str]] = {}
    verifies = {(f.rid, int(f.positions[0])) for f in rows if f.kind == "after-verify"}
    tree_verifies: set[tuple[str, int]] = set()
    totals: dict[tuple[int, str], int] = {}
    for f in rows:
        seq = sequences[f.rid]
        want = [int(seq[int(p) + 1]) for p in f.positions]
        for p, got, w in zip(f.positions.tolist(), f.input_ids.tolist(), want):
            if got != w:
                if p == f.chunk_end:
                    seams.append((f.rank, p, got, w))
                else:
                    other_ids.append(f"rank {f.rank} request {f.rid} {f.kind} position {p}: token {got}, not {w}")
        err = rel_err(f.aux, _expected_aux(references[f.rid], expected, f.positions), dim=-1)
        totals[(f.rank, f.kind)] = totals.get((f.rank, f.kind), 0) + len(want)
        for k in (err > tol).nonzero().flatten().tolist():
            named = _tree_order(f, k, seq, (verify or {}).get(f.rank, []), tol) if f.kind == "after-verify" else None
            if named is not None:
                tree.append(named)
                tree_verifies.add((f.rid, int(f.positions[0])))
                continue
            bad_aux.setdefault((f.rank, f.kind), []).append(
                f"request {f.rid} position {int(f.positions[k])}: rel.err {fmt_err(float(err[k]))} from "
                + "+".join(label(e, num_layers) for e in expected))
    lines = []
    if seams and not other_ids:
        lines.append(CHUNK_SEAM.format(n=len(seams), where=", ".join(f"rank {r} position {p}" for r, p, _, _ in seams[:4]),
                                       got=seams[0][2], want=seams[0][3]))
    elif seams or other_ids:
        lines.append("token ids wrong: " + "; ".join(
            [f"rank {r} chunk end position {p}: token {g}, not {w}" for r, p, g, w in seams] + other_ids)[:600])
    if tree and not bad_aux:
        lines.append(TREE_ORDER.format(n=len(tree_verifies), verifies=len(verifies), example=tree[0]))
    elif tree:
        lines.append(f"{len(tree)} rows after a verify hold tree nodes in tree order, e.g. {tree[0]}")
    for (rank, kind), found in sorted(bad_aux.items()):
        lines.append(ROWS.format(kind=f"aux hidden states {kind}", rank=rank, n=len(found),
                                 total=totals[(rank, kind)], examples="; ".join(found[:3])))
    if lines:
        return Verdict.failed(f"the {draft} draft was fed wrong inputs:\n" + "\n".join(lines))
    return Verdict.passed()


def feed_summary(feeds: Mapping[int, Sequence["DraftFeed"]]) -> str:
    """What the check compared, for the report: ``draft fed 210 prefill rows (6 at chunk ends) and
    256 accepted-path rows after 76 verifies, TP ranks 0, 1``."""
    rows = [f for fs in feeds.values() for f in fs]
    prefill = sum(len(f.positions) for f in rows if f.kind == "prefill")
    seams = sum(1 for f in rows if f.chunk_end >= 0)
    after = sum(len(f.positions) for f in rows if f.kind == "after-verify")
    verifies = len({(f.rank, f.rid, int(f.positions[0])) for f in rows if f.kind == "after-verify"})
    return (f"draft fed {prefill} prefill rows ({seams} at chunk ends) and {after} accepted-path rows after "
            f"{verifies} verifies, TP ranks {', '.join(str(r) for r in sorted(feeds))}")
