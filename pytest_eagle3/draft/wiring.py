"""Aux inputs for the draft: the correct wiring and the miswirings, from snapshots.

A *snapshot stack* is ``[L+2, T, H]`` float32 in the reference layout
(:mod:`pytest_eagle3.verdicts.snapshots`: ``[i] = hs[i]``, ``[L+1]`` = final prenorm),
from :func:`pytest_eagle3.target.reference.ensure_reference` or
:func:`pytest_eagle3.draft.data.snapshots`. The aux input SGLang feeds ``fc`` for
ids ``[i1, .., iK]`` is ``cat(hs[i1], .., hs[iK])`` along the hidden axis, ``[T, K*H]``
(captures are concatenated in layer order:
``sglang/srt/models/deepseek_v2.py`` ``layers_to_capture`` /
``set_eagle3_layers_to_capture``).

:data:`MISWIRINGS` are the faults the acceptance gate must catch (named after the
SGLang bugs they stand for); :data:`PROBES` are synthetic perturbations (noise,
gains); :data:`BENIGN` changes must not matter (bf16 rounding belongs to the capture
comparison, not to this gate). :func:`corrupt` is the randomised family the draft is
trained against (:mod:`pytest_eagle3.draft.train`); the fixed wirings here are
held-out draws of it.

torch is imported inside functions only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch

CORRECT = "correct"
#: Wirings SGLang can produce, name -> what it stands for. The acceptance gate must
#: catch each (the issue's target: correct accept length >= 2x the best of them).
MISWIRINGS: dict[str, str] = {
    "slots-permuted": "fc blocks in another order: [hs[i2], hs[i3], hs[i1]]",
    "ids-plus-1": "every id one layer late (SGLang before PR #25454 adds 1): hs[i+1]",
    "embedding-replaced": "the embedding slot replaced by hs[1] (capture misses the embedding)",
    "server-default-ids": "no ids in the config: SGLang's default [2, L//2, L-3]",
    "after-input-layernorm": "captured after the layer's input RMSNorm instead of the residual stream",
    "residual-not-added": "the layer's branch outputs without the residual: hs[i] - hs[i-1]",
    "partial-sum": "deep slots miss half of the last layer's branch outputs, hs[i-1] + (hs[i] - hs[i-1]) / 2 "
                   "(a TP 2 capture taken before the all-reduce finished)",
    "other-position": "each row holds the previous position's state",
    "other-request": "rows of another request in the batch",
}
#: Synthetic perturbations the draft is also trained against: expected below the gate,
#: but left out of the 2x power ratio (how far below varies with the seed).
PROBES: dict[str, str] = {
    "noise": "relative Gaussian noise of 0.5 on every slot",
    "channel-gains": "per-channel gains exp(N(0, 0.5^2)) on every slot",
}
#: Changes that must not matter (bf16 rounding belongs to the capture comparison).
BENIGN: dict[str, str] = {
    "bf16-rounded": "captures rounded through bfloat16",
}
#: Every wiring :func:`miswired` builds, in report order.
ALL_WIRINGS: tuple[str, ...] = (CORRECT, *MISWIRINGS, *PROBES, *BENIGN)


def aux_rows(snaps: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    """``cat(snaps[i] for i in ids)`` along hidden: ``[T, K*H]``."""
    import torch

    return torch.cat([snaps[i] for i in ids], dim=-1)


def input_layernorm_weights(sd: dict[str, torch.Tensor], num_layers: int) -> list[torch.Tensor]:
    """``model.layers.i.input_layernorm.weight`` ``[H]`` for ``i < L``, from a target state dict."""
    return [sd[f"model.layers.{i}.input_layernorm.weight"] for i in range(num_layers)]


def _normed(snaps: torch.Tensor, i: int, norms: list[torch.Tensor], eps: float) -> torch.Tensor:
    """What a capture after layer ``i``'s input RMSNorm sees (``hs[i]`` normed by layer ``i``'s weight)."""
    import torch

    x = snaps[i]
    w = norms[min(i, len(norms) - 1)]
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _branch(snaps: torch.Tensor, i: int) -> torch.Tensor:
    """``hs[i] - hs[i-1]``: layer ``i-1``'s attention + MLP output without the residual; ``hs[0]`` as is."""
    return snaps[i] - snaps[i - 1] if i > 0 else snaps[0]


def miswired(
    name: str,
    stacks: list[torch.Tensor],
    ids: Sequence[int],
    *,
    norms: list[torch.Tensor] | None = None,
    eps: float = 1e-6,
    seed: int = 0,
) -> list[torch.Tensor]:
    """The aux rows ``[T_j, K*H]`` of every sequence under wiring ``name``.

    Args:
        name: one of :data:`ALL_WIRINGS`.
        stacks: one snapshot stack ``[L+2, T_j, H]`` per sequence.
        ids: the correct hs indices (the contract), e.g. ``[0, 3, 5]``.
        norms: the target's input RMSNorm weights (:func:`input_layernorm_weights`);
            needed for ``after-input-layernorm``.
        eps: the target's ``rms_norm_eps``.
        seed: for ``noise`` and ``channel-gains``.

    Raises:
        ValueError: unknown name, or ``norms`` missing for ``after-input-layernorm``.
    """
    import torch

    ids = list(ids)
    L = stacks[0].shape[0] - 2
    gen = torch.Generator().manual_seed(seed)
    if name == CORRECT:
        return [aux_rows(s, ids) for s in stacks]
    if name == "slots-permuted":
        return [aux_rows(s, ids[1:] + ids[:1]) for s in stacks]
    if name == "ids-plus-1":
        return [aux_rows(s, [min(i + 1, L + 1) for i in ids]) for s in stacks]
    if name == "embedding-replaced":
        return [aux_rows(s, [1 if i == 0 else i for i in ids]) for s in stacks]
    if name == "server-default-ids":
        default = [2, L // 2, L - 3][: len(ids)]
        return [aux_rows(s, default) for s in stacks]
    if name == "after-input-layernorm":
        if norms is None:
            raise ValueError("after-input-layernorm needs the target's input_layernorm weights")
        return [torch.cat([_normed(s, i, norms, eps) for i in ids], dim=-1) for s in stacks]
    if name == "residual-not-added":
        return [torch.cat([_branch(s, i) for i in ids], dim=-1) for s in stacks]
    if name == "partial-sum":
        return [torch.cat([s[i - 1] + 0.5 * (s[i] - s[i - 1]) if i > 0 else s[0] for i in ids], dim=-1)
                for s in stacks]
    if name == "other-position":
        out = []
        for s in stacks:
            a = aux_rows(s, ids)
            out.append(torch.cat([a[:1], a[:-1]], dim=0))
        return out
    if name == "other-request":
        out = []
        for j, s in enumerate(stacks):
            other = aux_rows(stacks[(j + 1) % len(stacks)], ids)
            T = s.shape[1]
            idx = torch.arange(T) % other.shape[0]
            out.append(other[idx])
        return out
    if name == "noise":
        out = []
        for s in stacks:
            a = aux_rows(s, ids)
            rms = a.view(a.shape[0], len(ids), -1).pow(2).mean((0, 2)).sqrt()  # per slot
            scale = rms.repeat_interleave(a.shape[1] // len(ids))
            out.append(a + 0.5 * scale * torch.randn(a.shape, generator=gen))
        return out
    if name == "channel-gains":
        width = stacks[0].shape[-1] * len(ids)
        gains = torch.exp(0.5 * torch.randn(width, generator=gen))
        return [aux_rows(s, ids) * gains for s in stacks]
    if name == "bf16-rounded":
        return [aux_rows(s, ids).to(torch.bfloat16).to(torch.float32) for s in stacks]
    raise ValueError(f"unknown wiring {name!r}; known: {list(ALL_WIRINGS)}")


#: Relative frequency of each training-negative family in :func:`corrupt`.
CORRUPTION_FAMILIES: dict[str, int] = {
    "other-layers": 2,      # some slots read another hs index (incl. +-1, the final prenorm)
    "shifted-ids": 1,       # every id +1 or +2 (older SGLang's +1, a doubled +1)
    "embedding-slot": 2,    # the hs[0] slot reads hs[1] or hs[2] (embedding capture missing)
    "permuted": 1,          # a non-identity slot permutation
    "normed": 1,            # some slots after the layer's input RMSNorm
    "no-residual": 1,       # some slots hold hs[i] - hs[i-1]
    "partial-residual": 2,  # some slots hold hs[i-1] + u * (hs[i] - hs[i-1]), u in [0, 0.75]
    "other-position": 1,    # rows shifted by 1-3 positions
    "other-request": 1,     # another sequence's rows
    "noise": 3,             # relative noise 0.15-0.8, on some slots
    "gains": 3,             # per-channel gains exp(N(0, s^2)), s 0.15-0.7, on some slots
    "scaled": 1,            # some slots scaled by 0, 0.5, 1.5 or 2
}


def corrupt(
    snaps: torch.Tensor,
    other: torch.Tensor,
    ids: Sequence[int],
    norms: list[torch.Tensor],
    eps: float,
    gen: torch.Generator,
) -> torch.Tensor:
    """One random miswiring of one sequence's aux rows ``[T, K*H]`` (training negatives).

    Draws a family of :data:`CORRUPTION_FAMILIES` by weight, then its parameters; a
    family acting on "some slots" picks a non-empty random subset. ``other`` is another
    sequence's snapshot stack ``[L+2, T', H]``. Never returns the correct wiring
    unchanged.
    """
    import torch

    ids = list(ids)
    K, L2, T, H = len(ids), snaps.shape[0], snaps.shape[1], snaps.shape[2]

    def ri(n: int) -> int:
        return int(torch.randint(n, (1,), generator=gen))

    def ru(a: float, b: float) -> float:
        return a + (b - a) * float(torch.rand((), generator=gen))

    def some_slots() -> list[int]:
        mask = [bool(ri(2)) for _ in range(K)]
        if not any(mask):
            mask[ri(K)] = True
        return [k for k in range(K) if mask[k]]

    names = list(CORRUPTION_FAMILIES)
    weights = torch.tensor([float(CORRUPTION_FAMILIES[n]) for n in names])
    family = names[int(torch.multinomial(weights, 1, generator=gen))]
    if family == "other-layers":
        new = list(ids)
        for k in some_slots():
            choices = [i for i in range(L2) if i != ids[k]]
            new[k] = choices[ri(len(choices))]
        return aux_rows(snaps, new)
    if family == "shifted-ids":
        d = 1 + ri(2)
        return aux_rows(snaps, [min(i + d, L2 - 1) for i in ids])
    if family == "embedding-slot":
        new = [(1 + ri(2)) if i == 0 else i for i in ids]
        if new == ids:  # no embedding slot in this contract: read another layer instead
            k = ri(K)
            choices = [i for i in range(L2) if i != ids[k]]
            new[k] = choices[ri(len(choices))]
        return aux_rows(snaps, new)
    if family == "permuted":
        perm = list(range(K))
        while perm == list(range(K)):
            perm = torch.randperm(K, generator=gen).tolist()
        return aux_rows(snaps, [ids[p] for p in perm])
    if family == "normed":
        slots = set(some_slots())
        return torch.cat(
            [_normed(snaps, i, norms, eps) if k in slots else snaps[i] for k, i in enumerate(ids)], dim=-1
        )
    if family in ("no-residual", "partial-residual"):
        deep = [k for k in range(K) if ids[k] > 0]
        slots = {k for k in some_slots() if ids[k] > 0} or set(deep)
        u = 0.0 if family == "no-residual" else ru(0.0, 0.75)
        parts = []
        for k, i in enumerate(ids):
            if k not in slots:
                parts.append(snaps[i])
            elif family == "no-residual":
                parts.append(_branch(snaps, i))
            else:
                parts.append(snaps[i - 1] + u * (snaps[i] - snaps[i - 1]))
        return torch.cat(parts, dim=-1)
    a = aux_rows(snaps, ids)
    if family == "other-position":
        d = min(1 + ri(3), T)
        if ri(2):
            return torch.cat([a[:1].expand(d, -1), a[:-d]], dim=0)[:T]
        return torch.cat([a[d:], a[-1:].expand(d, -1)], dim=0)[:T]
    if family == "other-request":
        o = aux_rows(other, ids)
        start = ri(o.shape[0])
        return o[(torch.arange(T) + start) % o.shape[0]]
    mask = torch.zeros(K)
    for k in some_slots():
        mask[k] = 1.0
    cols = mask.repeat_interleave(H)
    if family == "noise":
        slot_rms = a.view(T, K, H).pow(2).mean((0, 2)).sqrt().repeat_interleave(H)
        return a + cols * ru(0.15, 0.8) * slot_rms * torch.randn(a.shape, generator=gen)
    if family == "gains":
        gains = torch.exp(ru(0.15, 0.7) * torch.randn(a.shape[1], generator=gen))
        return a * (1 + cols * (gains - 1))
    # scaled
    scale = torch.ones(K)
    for k in mask.nonzero().flatten().tolist():
        scale[k] = [0.0, 0.5, 1.5, 2.0][ri(4)]
    return a * scale.repeat_interleave(H)


def benign(a: torch.Tensor, slot_width: int, gen: torch.Generator) -> torch.Tensor:
    """A harmless change of correct rows ``[T, K*H]`` (training positives): unchanged,
    bf16-rounded, or noise of at most 1% of each slot's RMS (``slot_width`` = H)."""
    import torch

    family = int(torch.randint(3, (1,), generator=gen))
    if family == 0:
        return a
    if family == 1:
        return a.to(torch.bfloat16).to(torch.float32)
    sigma = 0.01 * float(torch.rand((), generator=gen))
    T, width = a.shape
    K = width // slot_width
    slot_rms = a.view(T, K, slot_width).pow(2).mean((0, 2)).sqrt().repeat_interleave(slot_width)
    return a + sigma * slot_rms * torch.randn(a.shape, generator=gen)
