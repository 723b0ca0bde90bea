"""Train the synthetic EAGLE-3 draft: fixed seed, fixed step count, one CPU thread.

The recipe (docs/design.md, "Synthetic EAGLE-3 drafts on a random target"):

* data: the target's greedy continuations of the suite prompts, cut at the first
  near-tie (:func:`pytest_eagle3.draft.data.make_examples`), and the aux rows of the
  contract (``[hs[0], hs[3], hs[5]]`` for ``kimi-embedding-first`` on tiny-dsv3);
* positives: chains from the engine rows ``t >= P-1`` with, EAGLE-3 "training-time
  test", ``chain_steps`` teacher-forced steps chained through the draft's own hidden
  state exactly as SGLang's ``draft_forward`` chains them
  (:func:`pytest_eagle3.draft.model.packed_chain_forward`, all prompts in one batch);
  cross-entropy on the greedy token, steps weighted ``step_decay ** (k-1)``, on a
  random ``positive_fraction`` of the chains each step. The aux rows are randomly
  left unchanged, rounded through bf16 or given <= 1% noise, so numerically faithful
  captures keep their acceptance;
* negatives: ``negatives`` copies of each sequence with its aux rows miswired at
  random (:func:`pytest_eagle3.draft.wiring.corrupt`: other layers, permuted slots,
  normed inputs, missing or partial residual, other positions or requests, noise,
  gains, scaled slots), on a random ``negative_fraction`` of their chains; target
  "no confident prediction": ``negative_weight * KL(uniform || draft)`` plus
  ``unlikelihood_weight * -log(1 - p(greedy token))`` on step 1, so the right token
  does not survive as the argmax of a flattened distribution;
* slot scales equalised: aux slot ``k`` is multiplied by ``1 / RMS_k`` (RMS over
  the training rows; embedding ~1 vs deep layers ~10) before ``fc``; the scale is
  folded into ``fc.weight``'s columns at export, so the shipped draft reads raw
  captures as SGLang passes them.

Determinism: every random draw comes from ``torch.Generator``s seeded from
``TrainSettings.seed``; the optimiser runs a fixed number of full-batch steps
(never a time budget); ``torch.set_num_threads(1)`` for the duration. The same
torch version reproduces the same bytes; another one reaches the same quality.

torch is imported inside functions only.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from pytest_eagle3.draft.config import FC, MLA_KEYS, DraftConfig
from pytest_eagle3.draft.model import pack, packed_chain_forward
from pytest_eagle3.draft.wiring import aux_rows, benign, corrupt

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.draft.data import DraftExample


@dataclass(frozen=True)
class TrainSettings:
    """Every knob of the procedure (stored in ``quality.json``).

    Attributes:
        seed: seeds init, augmentation and negatives.
        steps: optimiser steps (full batch each).
        lr, warmup, final_lr_fraction: AdamW with linear warmup and cosine decay.
        weight_decay: AdamW decay on matrices.
        chain_steps: teacher-forced steps per chain (the suite's speculative_num_steps).
        step_decay: weight of step ``k`` is ``step_decay ** (k-1)``.
        negatives: miswired copies of each sequence per optimiser step.
        positive_fraction: share of the chains (drawn at random each step) whose
            positive loss is computed; positives are learnt long before negatives.
        negative_fraction: share of the miswired chains (drawn each step) whose loss is computed.
        negative_chain_steps: steps of each miswired chain that get the negative target
            (later steps read the draft's own hidden state but attend to miswired rows).
        negative_weight: weight of the KL-to-uniform term.
        unlikelihood_weight: weight of ``-log(1 - p(greedy token))`` on negatives, so a
            miswired draft does not keep the right token as a flat argmax.
        intermediate_size, num_attention_heads, num_key_value_heads: draft shape
            (``hidden_size`` is the target's, so SGLang shares its embedding).
        attention: ``"llama"`` (``LlamaForCausalLMEagle3``) or ``"mla"``
            (``Eagle3DeepseekV2ForCausalLM``, the target's MLA widths and rope).
        fc_norm, norm_output: the MLA draft's EAGLE 3.1 flags
            (:mod:`pytest_eagle3.draft.config`).
        max_new_tokens, min_margin: the continuation (see :mod:`.data`).
    """

    seed: int = 0
    steps: int = 900
    lr: float = 3e-3
    warmup: int = 25
    final_lr_fraction: float = 0.05
    weight_decay: float = 0.0
    chain_steps: int = 3
    step_decay: float = 0.8
    negatives: int = 2
    positive_fraction: float = 0.34
    negative_fraction: float = 0.5
    negative_chain_steps: int = 1
    negative_weight: float = 0.1
    unlikelihood_weight: float = 1.0
    intermediate_size: int = 256
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    max_new_tokens: int = 64
    min_margin: float = 0.01
    attention: str = "llama"
    fc_norm: bool = False
    norm_output: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainResult:
    """A trained draft.

    Attributes:
        params: exported weights by checkpoint name (slot scales folded into ``fc``), fp32.
        cfg: the draft shape.
        slot_scales: the per-slot scale folded into ``fc`` (``1 / RMS_k``).
        seconds: wall-clock seconds of the optimiser loop.
        cpu_seconds: process CPU seconds of the optimiser loop.
        data_seconds: seconds to build continuations and snapshots.
        losses: ``(step, positive loss, negative loss)`` every 25 steps and at the end.
    """

    params: dict
    cfg: DraftConfig
    slot_scales: list[float]
    seconds: float
    cpu_seconds: float
    data_seconds: float
    losses: list[tuple[int, float, float]] = field(default_factory=list)


def init_params(cfg: DraftConfig, gen: torch.Generator) -> dict:
    """Initial weights: matrices N(0, 1/fan_in), norms 1, in :func:`weight_names` order."""
    import torch

    params = {}
    for name, shape in cfg.shapes().items():
        if len(shape) == 1:
            params[name] = torch.ones(shape)
        else:
            params[name] = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
    return params


def _shape_options(settings: TrainSettings, target_config: dict[str, Any] | None) -> dict[str, Any]:
    """DraftConfig fields beyond the Llama ones: the MLA attention's, from the target."""
    if settings.attention == "llama":
        if settings.fc_norm or settings.norm_output:
            raise ValueError("fc_norm and norm_output are flags of the MLA draft (attention='mla')")
        return {}
    if settings.attention != "mla":
        raise ValueError(f"attention must be 'llama' or 'mla', got {settings.attention!r}")
    if target_config is None:
        raise ValueError("an MLA draft copies the target's MLA widths: pass target_config")
    out: dict[str, Any] = {key: int(target_config[key]) for key in MLA_KEYS}
    out.update(attention="mla", fc_norm=settings.fc_norm, norm_output=settings.norm_output,
               rope_theta=float(target_config.get("rope_theta", 10000.0)),
               rope_scaling=target_config.get("rope_scaling"),
               max_position_embeddings=int(target_config.get("max_position_embeddings", 4096)))
    return out


def _lr_factor(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.final_lr_fraction + (1 - s.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def train_draft(
    examples: list[DraftExample],
    stacks: list[torch.Tensor],
    embed: torch.Tensor,
    ids: list[int],
    norms: list[torch.Tensor],
    eps: float,
    settings: TrainSettings = TrainSettings(),
    *,
    target_config: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train on ``examples`` whose snapshot stacks ``[L+2, N_j, H]`` are ``stacks``.

    Args:
        embed: the target's ``embed_tokens`` ``[V, H]`` (SGLang's draft reads it).
        ids: the contract's hs indices, in fc slot order.
        norms: the target's input RMSNorm weights (for normed-input negatives).
        eps: the target's ``rms_norm_eps``.
        target_config: the target's ``config.json`` (the MLA draft copies its MLA
            widths, ``rope_theta``, ``rope_scaling`` and ``max_position_embeddings``).
        progress: called with a one-line status every 50 steps.

    Raises:
        ValueError: no usable example; an MLA draft without ``target_config``.
    """
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        V, H = embed.shape
        cfg = DraftConfig(
            hidden_size=H, target_hidden_size=stacks[0].shape[-1], aux_layer_ids=tuple(ids),
            num_attention_heads=settings.num_attention_heads,
            num_key_value_heads=settings.num_key_value_heads,
            head_dim=H // settings.num_attention_heads,
            intermediate_size=settings.intermediate_size, vocab_size=V, draft_vocab_size=V,
            rms_norm_eps=1e-6, **_shape_options(settings, target_config),
        )
        K, Ht = len(ids), cfg.target_hidden_size
        used = [(ex, st) for ex, st in zip(examples, stacks) if ex.num_starts > 0]
        if not used:
            raise ValueError("no example has a trusted continuation of 2 or more tokens")
        correct = [aux_rows(st, ids)[: len(ex.tokens) - 1] for ex, st in used]
        rows = torch.cat(correct)
        slot_rms = rows.view(-1, K, Ht).pow(2).mean((0, 2)).sqrt()
        slot_scales = (1.0 / slot_rms).tolist()
        if cfg.fc_norm:  # fc_norm equalises the slots itself (and would undo a folded scale)
            slot_scales = [1.0] * K
            slot_rms = torch.ones_like(slot_rms)
        col_scale = (1.0 / slot_rms).repeat_interleave(Ht)

        gen = torch.Generator().manual_seed(settings.seed)
        params = init_params(cfg, gen)
        for p in params.values():
            p.requires_grad_(True)
        decay = [p for p in params.values() if p.dim() == 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": settings.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=settings.lr, betas=(0.9, 0.98), eps=1e-8,
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, settings))
        seqs = [(ex.tokens, ex.first_start) for ex, _ in used]
        pos_pack = pack(seqs, settings.chain_steps)
        neg_pack = pack(seqs * settings.negatives, settings.negative_chain_steps)
        n_neg = neg_pack.query.shape[0]
        n_neg_chosen = max(1, round(settings.negative_fraction * n_neg))
        step_w = [settings.step_decay ** k for k in range(max(settings.chain_steps, settings.negative_chain_steps))]
        n_chains = pos_pack.query.shape[0]
        n_chosen = max(1, round(settings.positive_fraction * n_chains))
        log_v = math.log(cfg.draft_vocab_size)
        n_seq = len(used)
        losses: list[tuple[int, float, float]] = []
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for step in range(settings.steps):
            opt.zero_grad(set_to_none=True)
            aux = torch.cat([benign(a, Ht, gen) for a in correct]) * col_scale
            chosen = torch.randperm(n_chains, generator=gen)[:n_chosen].sort().values
            sub = replace(pos_pack, query=pos_pack.query[chosen],
                          step_tokens=pos_pack.step_tokens[:, chosen], labels=pos_pack.labels[:, chosen])
            logits = packed_chain_forward(params, cfg, embed, sub, aux)
            pos_loss = torch.zeros(())
            for k, lg in enumerate(logits):
                labels = sub.labels[k]
                ok = labels >= 0
                pos_loss = pos_loss + step_w[k] * F.cross_entropy(lg[ok], labels[ok], reduction="sum")
            pos_loss = pos_loss / n_chosen
            bad = []
            for _ in range(settings.negatives):
                for j, (ex, st) in enumerate(used):
                    shift = 1 + int(torch.randint(max(n_seq - 1, 1), (1,), generator=gen))
                    other = used[(j + shift) % n_seq][1]
                    bad.append(corrupt(st, other, ids, norms, eps, gen)[: len(ex.tokens) - 1])
            chosen = torch.randperm(n_neg, generator=gen)[:n_neg_chosen].sort().values
            sub = replace(neg_pack, query=neg_pack.query[chosen],
                          step_tokens=neg_pack.step_tokens[:, chosen], labels=neg_pack.labels[:, chosen])
            neg_logits = packed_chain_forward(params, cfg, embed, sub, torch.cat(bad) * col_scale)
            neg_loss = torch.zeros(())
            for k, lg in enumerate(neg_logits):
                labels = sub.labels[k]
                ok = (labels >= 0).to(lg.dtype)
                logp = F.log_softmax(lg, -1)
                flat = -(logp.mean(-1) + log_v)  # KL(uniform || draft)
                p_label = logp.gather(1, labels.clamp(min=0)[:, None]).exp().squeeze(1)
                unlikely = -torch.log1p(-p_label.clamp(max=1 - 1e-6))
                term = settings.negative_weight * flat + settings.unlikelihood_weight * unlikely
                neg_loss = neg_loss + step_w[k] * (term * ok).sum()
            neg_loss = neg_loss / n_neg_chosen
            loss = pos_loss + neg_loss
            loss.backward()
            opt.step()
            sched.step()
            if step % 25 == 0 or step == settings.steps - 1:
                losses.append((step, round(float(pos_loss.detach()), 5), round(float(neg_loss.detach()), 5)))
                if progress is not None and (step % 100 == 0 or step == settings.steps - 1):
                    progress(f"step {step + 1}/{settings.steps}: positive {losses[-1][1]:.4f} "
                             f"negative {losses[-1][2]:.4f} ({time.perf_counter() - wall0:.0f} s)")
        seconds, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        out = {n: p.detach().clone().contiguous() for n, p in params.items()}
        out[FC] = (out[FC] * col_scale[None, :]).contiguous()
    finally:
        torch.set_num_threads(threads)
    return TrainResult(params=out, cfg=cfg, slot_scales=slot_scales, seconds=seconds,
                       cpu_seconds=cpu, data_seconds=0.0, losses=losses)


__all__ = ["TrainResult", "TrainSettings", "init_params", "train_draft"]
