"""The candidates a diagnosis tries beyond the clean snapshots: an :class:`Evidence`.

Per prompt: the checkpoint's ``input_layernorm`` weights, the reference's
inside-the-layer tensors (:func:`pytest_eagle3.target.reference.ensure_reference_details`),
the prompt's token ids and TP sizes, other requests' reference rows.  Every
field is optional; a diagnosis whose evidence is missing is simply not tried
(:mod:`pytest_eagle3.verdicts.diagnose`).  :func:`checkpoint_evidence` builds
one lazily per prompt: nothing is read until a slot matches no snapshot.

torch and safetensors are imported inside the functions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Union

from pytest_eagle3.target.checkpoint.families import family_of, language_config
from pytest_eagle3.target.reference import ensure_reference_details


@dataclass(frozen=True)
class Evidence:
    """Candidate tensors for one prompt's rows (every field optional).

    Attributes:
        token_ids: the rows' token ids (vocab shards of zero rows).
        vocab_size: the target's vocabulary (unpadded).
        tp: the engine's TP size (rank shares, vocab shards).
        attn_tp: its attention-TP size (default ``tp``).
        norms: ``[L, H]`` ``input_layernorm`` weights of every layer.
        norm_eps: their epsilon.
        post_attention: ``[L, T, H]`` each layer's residual after attention.
        mlp: ``[L, T, H]`` what each layer's MLP branch adds to the residual stream.
        mlp_what: how a slot holding ``mlp[l]`` is named (``{layer}``); Gemma 3's
            branch ends in a norm: "the MLP output of layer 0 after its
            post_feedforward_layernorm".
        partial: ``[tp, L, T, H]`` each TP rank's unreduced MLP share.
        others: label (``"request 1"``) -> ``[L+2, T', H]`` another request's
            reference rows (a wrong row is looked up among all of them, the
            same row index first).
        fused_allreduce: the engine fuses each MLP all-reduce into the next
            layer's all-reduce + add + RMSNorm (FlashInfer's on SM90/SM100, the
            CPU tier's stand-in): a partial sum is then named
            ``[before-fused-allreduce]`` instead of ``[partial-sum]``.
        pp_stages: ``((start, end), ...)`` the layers of each pipeline stage (end
            exclusive; ``()`` without PP): wrong slots that are exactly those of
            layers on earlier stages are named ``[pp-earlier-stage]``.
        tbo_split: the engine runs two-batch overlap, and the layers from this one
            on (``first_k_dense_replace``) run split into two micro-batches; ``None``:
            no TBO.  Wrong slots that are exactly those layers' are named
            ``[tbo-microbatch-dropped]`` / ``[tbo-microbatches-swapped]`` by their rows.
    """

    token_ids: Sequence[int] | None = None
    vocab_size: int | None = None
    tp: int = 1
    attn_tp: int | None = None
    norms: Any = None
    norm_eps: float = 1e-6
    post_attention: Any = None
    mlp: Any = None
    mlp_what: str = "the MLP output of layer {layer}"
    partial: Any = None
    others: Mapping[str, Any] = field(default_factory=dict)
    fused_allreduce: bool = False
    pp_stages: tuple[tuple[int, int], ...] = ()
    tbo_split: int | None = None

    def rows(self, start: int, stop: int) -> "Evidence":
        """The same evidence for rows ``start:stop`` (compare a slice of a prompt)."""
        def cut(t: Any) -> Any:
            return None if t is None else t[..., start:stop, :]

        return replace(
            self,
            token_ids=None if self.token_ids is None else list(self.token_ids)[start:stop],
            post_attention=cut(self.post_attention), mlp=cut(self.mlp), partial=cut(self.partial),
        )

    def at(self, positions: Sequence[int]) -> "Evidence":
        """The same evidence for the rows at ``positions`` (any order; a rank's rows of a
        request, gathered from its forwards).  ``others`` is dropped: another request's
        rows are looked up by row index, which no longer means a position here."""
        pos = [int(p) for p in positions]
        ids = None if self.token_ids is None else list(self.token_ids)

        def pick(t: Any) -> Any:
            return None if t is None else t[..., pos, :]

        return replace(
            self,
            token_ids=None if ids is None else [ids[p] for p in pos],
            post_attention=pick(self.post_attention), mlp=pick(self.mlp), partial=pick(self.partial), others={},
        )


EvidenceLike = Union[Evidence, Callable[[], Evidence], None]


def resolve(evidence: EvidenceLike) -> Evidence:
    if evidence is None:
        return Evidence()
    if isinstance(evidence, Evidence):
        return evidence
    return evidence()


def layer_norms(checkpoint_dir: Path) -> tuple[Any, float]:
    """``([L, H] input_layernorm multipliers, rms_norm_eps)`` read from the checkpoint
    (the stored weight, plus 1 for Gemma 3's ``x * (1 + w)`` norms)."""
    import torch
    from safetensors import safe_open

    checkpoint_dir = Path(checkpoint_dir)
    config = json.loads((checkpoint_dir / "config.json").read_text())
    text = language_config(config)
    L = int(text["num_hidden_layers"])
    # ``model.layers.<l>.`` (a causal LM, Qwen2.5-VL) or ``language_model.model.layers.<l>.`` (Gemma 3's wrapper).
    names = {f"model.layers.{l}.input_layernorm.weight": l for l in range(L)}
    found: dict[int, Any] = {}
    for path in sorted(checkpoint_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                key = name.removeprefix("language_model.").removeprefix("model.language_model.")
                key = key if key.startswith("model.") else f"model.{key}"
                if key in names:
                    found[names[key]] = f.get_tensor(name).to(torch.float32)
    if len(found) != L:
        raise ValueError(f"{checkpoint_dir}: input_layernorm weights of layers {sorted(set(range(L)) - set(found))} missing")
    # Gemma 3's norms multiply by (1 + weight): the candidates need the multiplier.
    family = family_of(config)
    offset = family.norm_offset if family is not None else 0.0
    return torch.stack([found[l] + offset for l in range(L)]), float(text.get("rms_norm_eps", 1e-6))


def checkpoint_evidence(checkpoint_dir: Path, prompts: Sequence[Sequence[int]], *, tp: int, vocab_size: int,
                        attn_tp: int | None = None, cache_dir: Path | None = None,
                        fused_allreduce: bool = False, pp_stages: Sequence[tuple[int, int]] = (),
                        tbo_split: int | None = None) -> list[Callable[[], Evidence]]:
    """One lazy :class:`Evidence` per prompt: norms from the checkpoint, the
    reference's inside-the-layer tensors (one transformers run for all prompts,
    cached), token ids, TP sizes, whether the engine fuses its all-reduces
    (:attr:`Evidence.fused_allreduce`), the pipeline stages (:attr:`Evidence.pp_stages`),
    the first layer two-batch overlap splits (:attr:`Evidence.tbo_split`).
    Nothing is read until a diagnosis asks."""
    from functools import lru_cache

    prompts = [[int(t) for t in p] for p in prompts]

    @lru_cache(maxsize=1)
    def shared() -> tuple[Any, float, list[dict[str, Any]]]:
        norms, eps = layer_norms(checkpoint_dir)
        return norms, eps, ensure_reference_details(checkpoint_dir, prompts, tp, cache_dir=cache_dir)

    def one(i: int) -> Callable[[], Evidence]:
        def build() -> Evidence:
            norms, eps, details = shared()
            d = details[i]
            return Evidence(token_ids=prompts[i], vocab_size=vocab_size, tp=tp, attn_tp=attn_tp, norms=norms,
                            norm_eps=eps, post_attention=d["post_attention"], mlp=d["mlp"], partial=d.get("partial"),
                            fused_allreduce=fused_allreduce, pp_stages=tuple(map(tuple, pp_stages)),
                            tbo_split=tbo_split,
                            **({"mlp_what": d["mlp_what"]} if d.get("mlp_what") else {}))
        return build

    return [one(i) for i in range(len(prompts))]
