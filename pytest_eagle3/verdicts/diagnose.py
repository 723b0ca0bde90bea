"""Name the bug a wrong capture shows.

:func:`pytest_eagle3.verdicts.compare.compare_slots` says which clean snapshot
``hs[i]`` each captured slot holds.  When a slot is wrong, this module tests the
tensors the known wiring bugs produce instead, and names the bug with a tag
``[kind]`` from the fault catalog (:data:`pytest_eagle3.worker.faults.CATALOG`):

* across slots (:mod:`pytest_eagle3.verdicts.patterns`): every slot one layer
  late / early (``[offset-twice]`` / ``[offset-missing]``), SGLang's default
  layer list whatever was configured (``[ids-ignored]``), the expected snapshots
  in reverse or another order (``[reversed-order]`` / ``[permuted-order]``),
  several slots holding one snapshot at or past the deepest expected one
  (``[aliased-capture]``: storage a later in-place norm rewrote);
* per slot (here): ``input_layernorm(hs[i])`` (``[normalized-input]``), a layer's
  MLP output or attention + MLP output without the residual (``[no-residual]``),
  the post-attention residual plus one TP rank's unreduced MLP share
  (``[partial-sum]``; ``[before-fused-allreduce]`` when the engine fuses that
  all-reduce into the next norm), a snapshot times a factor (``[dp-gather-scaled]`` when the
  factor is the attention-TP size, ``[scaled]`` otherwise), a snapshot whose rows
  outside one vocab shard are exact zeros (``[unreduced-embedding]``), rows that
  belong to another request of the batch (``[wrong-request-rows]``).

The candidates beyond ``hs`` come in an :class:`~pytest_eagle3.verdicts.evidence.Evidence`
(or a zero-argument callable returning one, evaluated only when a slot is
wrong; :mod:`pytest_eagle3.verdicts.evidence`): the checkpoint's
``input_layernorm`` weights, the reference's inside-the-layer tensors
(:func:`pytest_eagle3.target.reference.ensure_reference_details`), the prompt's
token ids and TP size, other requests' reference rows.  Every field is
optional; a diagnosis whose evidence is missing is simply not tried.

Pure functions on tensors; torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_eagle3.verdicts.evidence import Evidence, EvidenceLike, resolve
from pytest_eagle3.verdicts.microbatches import row_ranges, tbo_microbatch
from pytest_eagle3.verdicts.patterns import pattern_lines
from pytest_eagle3.verdicts.snapshots import fmt_err, full_label, label
from pytest_eagle3.verdicts.shards import vocab_shard, vocab_shard_ranges
from pytest_eagle3.verdicts.distance import PRECISION_CEILING, rel_err, roundoff_name

if TYPE_CHECKING:
    import torch

# Message templates (tests import these).  Every one ends with its [kind] tag.
TAG = "[{kind}]"
PATTERN = "diagnosis {tag}: {text}"
SLOT_HOLDS = "slot {slot} holds {what} (rel.err {err}): {why} {tag}"

WHY_NORMALIZED = "the normalized attention input of layer {layer}, not the residual stream"
WHY_BRANCH_ONLY = (
    "what layer {layer}'s MLP branch adds to the residual stream, without the residual "
    "({hs} minus layer {layer}'s post-attention residual): the capture took the layer's first "
    "return value while the layer keeps the residual separate"
)
WHY_MLP_ONLY = (
    "the MLP output of layer {layer} without the residual ({hs} minus layer {layer}'s "
    "post-attention residual; vLLM PR #14464)"
)
WHY_DELTA = "layer {layer}'s attention + MLP output without the residual ({hs} - {prev}; vLLM PR #14464)"
WHY_PARTIAL = (
    "{hs} read before the MLP all-reduce: layer {layer}'s post-attention residual plus TP rank "
    "{rank}'s unreduced MLP share (SGLang PR #28343)"
)
WHY_BEFORE_FUSED = (
    "{hs} read before the fused all-reduce: layer {layer}'s post-attention residual plus TP rank "
    "{rank}'s unreduced MLP share, whose all-reduce this engine fuses into layer {next}'s "
    "all-reduce + residual add + RMSNorm (SGLang PR #28343)"
)
WHY_GATHER = (
    "{hs} scaled by the attention-TP size {n}: rows summed over attention-TP ranks that all hold "
    "them, a gather done as an all-reduce (SGLang issue #31699)"
)
WHY_SCALED = "{hs} times {factor}"
WHY_FRACTION = "{hs} times {factor} = {k}/{tp}: as if only {k} of {tp} TP ranks' shares were summed"
WHY_UNREDUCED = (
    "TP rank {rank}'s embedding before the all-reduce: right for the {good} tokens of vocab shard "
    "{rank} of {tp} (ids {start}..{end}), exact zeros for the {zero} others"
)
WHY_ZERO_ROWS = "{hs} with {zero} of {rows} rows exact zeros"
WHY_OTHER_ROWS = (
    "another request's states, not this request's: the batch's rows were attributed to the wrong "
    "request (SGLang issue #26163)"
)

PRECISION_TEXT = (
    "{n} slot(s) hold the snapshot they should, off by up to {err} (tolerance {tol}): the layers are right, "
    "the values are a lower-precision copy ({size})"
)

#: Appended to what a slot holds when it is wrong on some rows only and the candidate
#: was fitted on those rows (the others hold the expected snapshot).
ON_WRONG_ROWS = " on its {n} wrong row{s} of {rows}"

#: A factor this close to 1 is noise, not a scaled snapshot.
SCALE_MARGIN = 0.02

KINDS = (
    "offset-twice", "offset-missing", "ids-ignored", "reversed-order", "permuted-order",
    "normalized-input", "no-residual", "partial-sum", "dp-gather-scaled", "scaled",
    "unreduced-embedding", "zero-rows", "wrong-request-rows", "aliased-capture", "before-fused-allreduce",
    "precision", "pp-earlier-stage", "tbo-microbatch-dropped", "tbo-microbatches-swapped",
)

#: Wrong slots that are exactly the layers of earlier pipeline stages (:attr:`Evidence.pp_stages`).
PP_EARLIER_TEXT = (
    "slot{s} {slots} (layer{s} {layers}, on {stages}) {are} wrong while the last stage's slot{ls} ({last}) "
    "{lare} right: the captures of layers held by an earlier pipeline stage do not reach the draft as they "
    "were captured (SGLang issue #39634)"
)

@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose_slots` found: per-slot lines, pattern lines, kinds."""

    slot_lines: dict[int, str] = field(default_factory=dict)
    pattern_lines: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()

    @property
    def lines(self) -> list[str]:
        return [*self.pattern_lines, *(self.slot_lines[s] for s in sorted(self.slot_lines))]


def _rel(a: "torch.Tensor", b: "torch.Tensor") -> float:
    return float(rel_err(a, b))



def rms_norm(x: "torch.Tensor", weight: "torch.Tensor", eps: float) -> "torch.Tensor":
    """DeepSeek-V3's RMSNorm, in float64."""
    import torch

    x = x.to(torch.float64)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(torch.float64)


def _candidates(reference: "torch.Tensor", ev: Evidence, num_layers: int) -> list[tuple[str, str, str, Any]]:
    """``(kind, what, why, tensor)`` for every candidate the evidence allows."""
    L = num_layers
    out: list[tuple[str, str, str, Any]] = []
    if ev.norms is not None:
        for i in range(min(L, len(ev.norms))):
            out.append(("normalized-input", f"input_layernorm({label(i, L)})", WHY_NORMALIZED.format(layer=i),
                        rms_norm(reference[i], ev.norms[i], ev.norm_eps)))
    if ev.mlp is not None:
        for l in range(min(L, ev.mlp.shape[0])):
            why = WHY_MLP_ONLY if ev.mlp_what == Evidence.mlp_what else WHY_BRANCH_ONLY
            out.append(("no-residual", ev.mlp_what.format(layer=l),
                        why.format(layer=l, hs=_after(l, L)), ev.mlp[l]))
    for l in range(L):
        after = l + 1 if l + 1 < L else L + 1  # the last layer's output is final_prenorm
        out.append(("no-residual", f"{_after(l, L)} - {label(l, L)}",
                    WHY_DELTA.format(layer=l, hs=_after(l, L), prev=label(l, L)),
                    reference[after].double() - reference[l].double()))
    if ev.partial is not None and ev.post_attention is not None:
        for r in range(ev.partial.shape[0]):
            for l in range(min(L, ev.partial.shape[1])):
                kind, why = (("before-fused-allreduce", WHY_BEFORE_FUSED) if ev.fused_allreduce
                             else ("partial-sum", WHY_PARTIAL))
                out.append((kind, f"layer {l}'s post-attention residual + rank {r}'s MLP share",
                            why.format(hs=_after(l, L), layer=l, rank=r, next=l + 1),
                            ev.post_attention[l].double() + ev.partial[r, l].double()))
    return out


def _after(layer: int, num_layers: int) -> str:
    """Label of layer ``layer``'s output: ``hs[layer+1]``, or final_prenorm for the last."""
    return label(layer + 1 if layer + 1 < num_layers else num_layers + 1, num_layers)


def _scaled(slot: "torch.Tensor", reference: "torch.Tensor", ev: Evidence, num_layers: int,
            tol: float) -> tuple[str, str, str, float] | None:
    """A snapshot times a factor clearly not 1: ``(kind, what, why, fit error)``."""
    import torch

    c = slot.to(torch.float64)
    best = None
    for r in range(reference.shape[0]):
        b = reference[r].to(torch.float64)
        denom = float((b * b).sum())
        if denom == 0:
            continue
        alpha = float((c * b).sum()) / denom
        if alpha == 0:
            continue
        err = _rel(c, alpha * b)
        if best is None or err < best[0]:
            best = (err, alpha, r)
    if best is None or best[0] > tol:
        return None
    err, alpha, r = best
    if abs(alpha - 1) <= SCALE_MARGIN:
        return None
    hs = label(r, num_layers)
    factor = f"{alpha:.3g}"
    attn_tp = ev.attn_tp or ev.tp
    if attn_tp > 1 and abs(alpha - attn_tp) <= 0.01 * attn_tp:
        return "dp-gather-scaled", f"{factor} x {hs}", WHY_GATHER.format(hs=full_label(r, num_layers), n=attn_tp), err
    if ev.tp > 1:
        k = round(alpha * ev.tp)
        if 1 <= k < ev.tp and abs(alpha * ev.tp - k) <= 0.01:
            return "scaled", f"{factor} x {hs}", WHY_FRACTION.format(hs=hs, factor=factor, k=k, tp=ev.tp), err
    return "scaled", f"{factor} x {hs}", WHY_SCALED.format(hs=full_label(r, num_layers), factor=factor), err


def _zero_rows(slot: "torch.Tensor", reference: "torch.Tensor", expected: int, ev: Evidence, num_layers: int,
               tol: float) -> tuple[str, str, str, float] | None:
    """Some rows exact zeros, the others right: an embedding before its all-reduce."""
    zero = (slot == 0).all(dim=-1)
    n_zero = int(zero.sum())
    if n_zero == 0 or n_zero == slot.shape[0]:
        return None
    for r in ([expected] if expected < reference.shape[0] else []) + [0]:
        err = _rel(slot[~zero], reference[r][~zero])
        if err > tol:
            continue
        hs = label(r, num_layers)
        if ev.token_ids is not None and ev.vocab_size and ev.tp > 1:
            ids = [int(t) for t in ev.token_ids]
            shards = [vocab_shard(t, ev.vocab_size, ev.tp) for t in ids]
            good = {s for s, z in zip(shards, zero.tolist()) if not z}
            if len(good) == 1 and None not in good:
                (rank,) = good
                if all((s == rank) != z for s, z in zip(shards, zero.tolist())):
                    start, end = vocab_shard_ranges(ev.vocab_size, ev.tp)[rank]
                    why = WHY_UNREDUCED.format(rank=rank, good=slot.shape[0] - n_zero, tp=ev.tp,
                                               start=start, end=end - 1, zero=n_zero)
                    return "unreduced-embedding", f"{hs} with the rows of other vocab shards zeroed", why, err
        return ("unreduced-embedding" if r == 0 else "zero-rows", f"{hs} with exact zero rows",
                WHY_ZERO_ROWS.format(hs=hs, zero=n_zero, rows=slot.shape[0]), err)
    return None


def _other_rows(slot: "torch.Tensor", reference: "torch.Tensor", expected: int, ev: Evidence, num_layers: int,
                tol: float) -> tuple[str, str, str, float] | None:
    """Rows that hold another request's snapshot (row ``t`` against its row ``t``)."""
    if not ev.others or expected >= reference.shape[0]:
        return None
    rows = slot.shape[0]
    own = [_rel(slot[t], reference[expected][t]) for t in range(rows)]
    wrong = [t for t in range(rows) if not own[t] <= tol]
    if not wrong:
        return None
    by_other: dict[str, list[int]] = {}
    worst = 0.0
    for t in wrong:
        match = _row_match(slot[t], expected, ev.others, prefer=t, tol=tol)
        if match is None:
            return None
        name, err = match
        by_other.setdefault(name, []).append(t)
        worst = max(worst, err)
    hs = label(expected, num_layers)
    if len(by_other) == 1:
        (name,) = by_other
        what = f"{name}'s {hs}" + (f" in rows {row_ranges(wrong)} of {rows}" if len(wrong) < rows else "")
    else:
        what = "; ".join(f"{name}'s {hs} in rows {row_ranges(ts)}" for name, ts in by_other.items())
    return "wrong-request-rows", what, WHY_OTHER_ROWS, worst


def _row_match(row: "torch.Tensor", index: int, others: Mapping[str, Any], *, prefer: int,
               tol: float) -> tuple[str, float] | None:
    """``(name, rel.err)`` of another request whose snapshot ``index`` has ``row``
    (its row ``prefer`` first: same decode step; then any of its rows)."""
    for name, other in others.items():
        if index >= other.shape[0]:
            continue
        n = other.shape[-2]
        for u in ([prefer] if prefer < n else []) + [u for u in range(n) if u != prefer]:
            err = _rel(row, other[index][u])
            if err <= tol:
                return name, err
    return None


def diagnose_slot(slot: "torch.Tensor", reference: "torch.Tensor", expected: int, *, num_layers: int,
                  tol: float, evidence: Evidence, rows: Sequence[int] = ()) -> tuple[str, str, str, float] | None:
    """``(kind, what, why, rel.err)`` of the best-fitting bug candidate for one
    slot ``[T, H]`` that matches no clean snapshot (or is wrong on some rows only),
    or ``None``.

    ``rows``: where the slot is wrong on these rows only (a fault on some forwards,
    e.g. only the decode steps SGLang routes through attention DP's reduce-scatter),
    the candidates are fitted on them alone and ``what`` says so (:data:`ON_WRONG_ROWS`)."""
    for special in (_other_rows, _zero_rows):
        found = special(slot, reference, expected, evidence, num_layers, tol)
        if found is not None:
            return found
    part = sorted(set(rows)) if rows and len(set(rows)) < slot.shape[0] else None
    on = "" if part is None else ON_WRONG_ROWS.format(n=len(part), s="" if len(part) == 1 else "s",
                                                      rows=slot.shape[0])
    best = None
    for kind, what, why, tensor in _candidates(reference, evidence, num_layers):
        if tuple(tensor.shape) != tuple(slot.shape):
            continue
        err = _rel(slot, tensor) if part is None else _rel(slot[part], tensor[part])
        if err <= tol and (best is None or err < best[3]):
            best = (kind, what + on, why, err)
    if best is not None:
        return best
    if part is None:
        return _scaled(slot, reference, evidence, num_layers, tol)
    found = _scaled(slot[part], reference[:, part], evidence, num_layers, tol)
    return None if found is None else (found[0], found[1] + on, *found[2:])


def diagnose_slots(captured: Any, reference: Any, verdicts: Sequence[Any], *, expected: Sequence[int],
                   num_layers: int, hidden_size: int, tol: float, evidence: EvidenceLike = None,
                   rows: Sequence[int] = ()) -> Diagnosis:
    """Diagnoses for the wrong slots of a :class:`~pytest_eagle3.verdicts.compare.SlotReport`.

    ``verdicts``: its :class:`~pytest_eagle3.verdicts.compare.SlotVerdict` s
    (``best``, ``matched``, ``ok``).  Slots that hold a clean snapshot are
    judged together (offsets, order, default ids); the others one by one
    against the candidates of ``evidence``.  ``rows``: the rows where the wrong
    slots are wrong, when the others are right
    (:func:`~pytest_eagle3.verdicts.compare.wrong_rows`); a candidate is then fitted on them.
    """
    import torch

    L, H = num_layers, hidden_size
    ref = torch.as_tensor(reference)
    cap = torch.as_tensor(captured).to(ref.device)
    kinds: list[str] = []
    patterns: list[str] = []
    best = [v.best if v.matched else None for v in verdicts]
    for kind, text in pattern_lines(best[:len(expected)], list(expected), L):
        kinds.append(kind)
        patterns.append(PATTERN.format(tag=TAG.format(kind=kind), text=text))
    off = [v for v in verdicts if not v.ok and v.slot < len(expected)]
    # Rows told apart (far off, the others within tolerance) are no precision loss spread over all rows.
    if off and not rows and all(v.matched and v.best == int(expected[v.slot]) for v in off):
        err = max(v.expected_err for v in off)
        if err < PRECISION_CEILING:
            kinds.append("precision")
            patterns.append(PATTERN.format(tag=TAG.format(kind="precision"), text=PRECISION_TEXT.format(
                n=len(off), err=fmt_err(err), tol=fmt_err(off[0].tol), size=roundoff_name(err))))
    slot_lines: dict[int, str] = {}
    slot_kinds: dict[int, str] = {}
    # A slot that matches nothing; with wrong rows told apart, also one that still matches
    # its expected snapshot overall because few of its rows are wrong.
    wrong = [v for v in verdicts if not v.ok and v.slot < len(expected)
             and (not v.matched or (bool(rows) and v.best == int(expected[v.slot])))]
    if wrong:
        ev = resolve(evidence)
        tbo = tbo_microbatch(cap, ref, verdicts, expected, ev, hidden_size=H, tol=tol)
        if tbo is not None:  # the rows of the split layers, not a per-slot bug
            kinds.insert(0, tbo[0])
            patterns.insert(0, PATTERN.format(tag=TAG.format(kind=tbo[0]), text=tbo[1]))
            wrong = [v for v in wrong if int(expected[v.slot]) < int(ev.tbo_split or 0)]
        for v in wrong:
            slot = cap[:, v.slot * H:(v.slot + 1) * H]
            found = diagnose_slot(slot, ref, int(expected[v.slot]), num_layers=L, tol=tol, evidence=ev,
                                  rows=_own_rows(slot, ref, int(expected[v.slot]), rows, tol))
            if found is None:
                continue
            kind, what, why, err = found
            slot_kinds[v.slot] = kind
            slot_lines[v.slot] = SLOT_HOLDS.format(slot=v.slot, what=what, err=fmt_err(err), why=why,
                                                   tag=TAG.format(kind=kind))
        kinds.extend(slot_kinds.values())
    # Only where a slot matched nothing (the evidence is built then anyway; it is costly).
    if wrong and evidence is not None:
        text = pp_earlier_stage_text(verdicts, expected, ev.pp_stages, diagnosed=set(slot_lines))
        if text is not None:
            kinds.insert(0, "pp-earlier-stage")
            patterns.insert(0, PATTERN.format(tag=TAG.format(kind="pp-earlier-stage"), text=text))
    return Diagnosis(slot_lines=slot_lines, pattern_lines=tuple(patterns), kinds=tuple(dict.fromkeys(kinds)))


def _own_rows(slot: "torch.Tensor", reference: "torch.Tensor", expected: int, rows: Sequence[int],
              tol: float) -> list[int]:
    """Of ``rows`` (where some wrong slot is wrong), those where this ``slot`` misses its
    ``expected`` snapshot: each slot is fitted on its own wrong rows."""
    if not rows or expected >= reference.shape[0]:
        return list(rows)
    picked = list(rows)
    errs = rel_err(slot[picked], reference[expected][picked], dim=(1,))
    return [t for t, e in zip(picked, errs.tolist()) if not e <= tol]


def pp_earlier_stage_text(verdicts: Sequence[Any], expected: Sequence[int],
                          stages: Sequence[tuple[int, int]], diagnosed: "set[int] | frozenset[int]" = frozenset(),
                          ) -> str | None:
    """The ``[pp-earlier-stage]`` line when the wrong slots are exactly those whose layer
    (``expected[slot]`` is ``hs[i]``, the input of layer ``i``) an earlier stage holds,
    none of them has a diagnosis of its own (``diagnosed``: the slots that have one), and at
    least one slot of the last stage is right; ``None`` otherwise or without PP."""
    if len(stages) < 2:
        return None
    last_start = stages[-1][0]
    slots = [v for v in verdicts if v.slot < len(expected)]
    earlier = [v for v in slots if int(expected[v.slot]) < last_start]
    last = [v for v in slots if int(expected[v.slot]) >= last_start]
    if not earlier or not last or any(v.ok for v in earlier) or not all(v.ok for v in last):
        return None
    if any(v.slot in diagnosed for v in earlier):
        return None
    held = sorted({r for r, (a, b) in enumerate(stages[:-1]) for v in earlier if a <= int(expected[v.slot]) < b})
    where = ", ".join(f"stage {r}: layers {stages[r][0]}-{stages[r][1] - 1}" for r in held)
    plural, last_plural = len(earlier) > 1, len(last) > 1
    return PP_EARLIER_TEXT.format(
        s="s" if plural else "", slots=", ".join(str(v.slot) for v in earlier),
        layers=", ".join(str(int(expected[v.slot])) for v in earlier), stages=where, are="are" if plural else "is",
        ls="s" if last_plural else "", last=", ".join(str(v.slot) for v in last), lare="are" if last_plural else "is")

