"""Offline draft quality from aux states: first-token accuracy and simulated accept length.

No SGLang: the draft (:func:`pytest_eagle3.draft.model.chain_forward`) is fed aux rows
(from the reference, from SGLang's real captures, or miswired by
:func:`pytest_eagle3.draft.wiring.miswired`) and compared with the target's greedy
continuation (:class:`pytest_eagle3.draft.data.DraftExample`).

* *first-token accuracy*: over every engine row ``t = P-1 .. N-3`` (the prefill's
  last row, then every committed position), whether draft step 1's argmax equals
  ``x[t+2]``.
* *accept length* (topk 1, ``S`` steps): SGLang's metric, tokens per verify
  (``completion_tokens / spec_verify_ct``; ``eagle_worker_v2.py``: ``accept_lens``
  = accepted drafts + 1 bonus). Simulated along the continuation: from the prefill's
  chain at ``t = P-1``, a verify accepts the leading drafts equal to the
  continuation, commits them plus the bonus token, and the next chain starts
  ``a + 1`` rows later, until the trusted continuation is used up. Maximum ``S + 1``.

torch is imported inside functions only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from pytest_eagle3.draft.config import DraftConfig
from pytest_eagle3.draft.model import chain_forward
from pytest_eagle3.draft.wiring import ALL_WIRINGS, miswired

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.draft.data import DraftExample

#: Draft steps the suite runs (``--speculative-num-steps``), topk 1, 4 draft tokens.
DEFAULT_STEPS = 3


@dataclass
class Quality:
    """Offline quality of a draft on a set of sequences under one wiring.

    Attributes:
        first_token_accuracy: fraction of engine rows whose step-1 argmax is right.
        accept_length: simulated tokens per verify (1 .. steps+1).
        accept_rate: accepted drafts per proposed draft, ``(tokens - verifies) / (verifies * steps)``.
        step_accuracy: teacher-forced accuracy of step ``k`` (k = 1..steps).
        rows: engine rows counted for ``first_token_accuracy``.
        verifies: simulated verify steps.
        tokens: tokens those verifies produced.
        steps: draft steps per chain.
        per_sequence: ``{name: accept_length}``.
    """

    first_token_accuracy: float
    accept_length: float
    accept_rate: float
    step_accuracy: list[float]
    rows: int
    verifies: int
    tokens: int
    steps: int
    per_sequence: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["first_token_accuracy"] = round(self.first_token_accuracy, 4)
        d["accept_length"] = round(self.accept_length, 4)
        d["accept_rate"] = round(self.accept_rate, 4)
        d["step_accuracy"] = [round(a, 4) for a in self.step_accuracy]
        d["per_sequence"] = {k: round(v, 3) for k, v in self.per_sequence.items()}
        return d


def chain_hits(
    params: dict, cfg: DraftConfig, embed: torch.Tensor, example: DraftExample,
    aux: torch.Tensor, steps: int,
) -> torch.Tensor:
    """``[S, R]`` bool: whether step ``k`` of the chain at engine row ``P-1+r`` drafts
    ``x[t+k+1]``; False where that token is past the continuation.

    ``aux`` is ``[>= N-1, K*Ht]``; only rows ``0..N-2`` are used.
    """
    import torch

    tokens = torch.tensor(example.tokens)
    N, first = tokens.shape[0], example.first_start
    R = example.num_starts
    if R == 0:
        return torch.zeros(steps, 0, dtype=torch.bool)
    with torch.no_grad():
        logits = chain_forward(params, cfg, embed, tokens, aux[: N - 1], steps, first=first)
    hits = torch.zeros(steps, R, dtype=torch.bool)
    starts = torch.arange(first, first + R)
    for k, lg in enumerate(logits, start=1):
        label_idx = starts + k + 1
        ok = label_idx < N
        pred = lg[:R].argmax(-1)
        hits[k - 1] = ok & (pred == tokens[label_idx.clamp(max=N - 1)])
    return hits


def simulate_accept(hits: torch.Tensor, remaining: Sequence[int]) -> tuple[int, int]:
    """``(verifies, tokens)`` of SGLang's chain loop over one continuation.

    Args:
        hits: ``[S, R]`` from :func:`chain_hits`.
        remaining: for row ``r``, tokens still to generate after it (``R - r``).
    """
    S, R = hits.shape
    r, verifies, tokens = 0, 0, 0
    while r < R:
        a = 0
        while a < S and bool(hits[a, r]):
            a += 1
        produced = min(a + 1, remaining[r])
        verifies += 1
        tokens += produced
        r += a + 1
    return verifies, tokens


def evaluate(
    params: dict,
    cfg: DraftConfig,
    embed: torch.Tensor,
    examples: list[DraftExample],
    auxes: list[torch.Tensor],
    *,
    steps: int = DEFAULT_STEPS,
) -> Quality:
    """Offline quality over ``examples`` with aux rows ``auxes[j]`` ``[>= N_j - 1, K*Ht]``."""
    rows = hit1 = verifies = tokens = 0
    step_hits = [0] * steps
    step_rows = [0] * steps
    per: dict[str, float] = {}
    for ex, aux in zip(examples, auxes):
        hits = chain_hits(params, cfg, embed, ex, aux, steps)
        R = hits.shape[1]
        if R == 0:
            continue
        rows += R
        hit1 += int(hits[0].sum())
        for k in range(steps):
            valid = R - k  # rows whose step-k label exists
            if valid > 0:
                # teacher-forced: only the label's existence matters
                step_rows[k] += valid
                step_hits[k] += int(hits[k, :valid].sum())
        v, n = simulate_accept(hits, [R - r for r in range(R)])
        verifies += v
        tokens += n
        per[ex.name] = n / v
    return Quality(
        first_token_accuracy=hit1 / rows if rows else 0.0,
        accept_length=tokens / verifies if verifies else 0.0,
        accept_rate=(tokens - verifies) / (verifies * steps) if verifies else 0.0,
        step_accuracy=[h / r if r else 0.0 for h, r in zip(step_hits, step_rows)],
        rows=rows, verifies=verifies, tokens=tokens, steps=steps, per_sequence=per,
    )


def evaluate_wirings(
    params: dict,
    cfg: DraftConfig,
    embed: torch.Tensor,
    examples: list[DraftExample],
    stacks: list[torch.Tensor],
    ids: Sequence[int],
    *,
    norms: list[torch.Tensor] | None = None,
    eps: float = 1e-6,
    steps: int = DEFAULT_STEPS,
    names: Sequence[str] | None = None,
    seed: int = 0,
) -> dict[str, Quality]:
    """Quality under the correct wiring and each miswiring / benign change.

    Args:
        stacks: snapshot stacks ``[L+2, >= N_j, H]`` (reference layout) of ``examples``' tokens.
        ids: the contract's hs indices (``[0, 3, 5]``).
        norms: target input RMSNorm weights, for ``after-input-layernorm``.
        names: wirings to evaluate (default :data:`~pytest_eagle3.draft.wiring.ALL_WIRINGS`);
            ``after-input-layernorm`` is left out without ``norms``, ``embedding-replaced``
            when ``ids`` has no embedding slot, ``server-default-ids`` when ``ids`` is
            SGLang's default list (each would be the correct wiring).

    Returns:
        ``{wiring: Quality}``.
    """

    names = list(names) if names is not None else list(ALL_WIRINGS)
    if norms is None:
        names = [n for n in names if n != "after-input-layernorm"]
    if 0 not in list(ids):  # no embedding slot: "embedding-replaced" would be the correct wiring
        names = [n for n in names if n != "embedding-replaced"]
    L = stacks[0].shape[0] - 2
    if [2, L // 2, L - 3][: len(list(ids))] == list(ids):
        # The contract is SGLang's default list (specforge-default-ids on 8 layers):
        # "server-default-ids" would be the correct wiring.
        names = [n for n in names if n != "server-default-ids"]
    out = {}
    for name in names:
        auxes = miswired(name, stacks, ids, norms=norms, eps=eps, seed=seed)
        out[name] = evaluate(params, cfg, embed, examples, auxes, steps=steps)
    return out
