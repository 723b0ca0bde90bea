"""Random-weights EAGLE-3 drafts: the capture tests' drafts on the draft path.

Through the draft path (``--speculative-draft-model-path`` with
``--enable-return-hidden-states``) SGLang reads the aux layer ids from the
draft's ``config.json`` only, so every id list of the suite needs a draft of its
own.  Random weights suffice there: the capture tests read what SGLang feeds
the draft, not what it proposes.  Acceptance needs the trained draft
(:mod:`.build`).

Layout (read from ``sglang/srt/models/llama_eagle3.py``, 0.5.23): a Llama
``config.json`` with ``architectures: ["LlamaForCausalLMEagle3"]``, one decoder
layer, ``target_hidden_size``, ``draft_vocab_size`` and
``eagle_config.eagle_aux_hidden_state_layer_ids`` (absent: SGLang's default
list); ``model.safetensors`` with the legacy names SGLang maps itself
(``midlayer.*`` -> ``layers.0.*``): ``fc.weight`` ``[H, K*H_target]``, the
attention projections over ``2*H`` inputs, the norms, ``lm_head.weight``
``[draft_vocab, H]``, and ``d2t``/``t2d`` only for a reduced vocabulary.  No
``embed_tokens``: SGLang shares the target's embedding with the draft.

:func:`capture_draft_dir` names a cached draft per ``(target, ids)``;
:func:`ensure_capture_draft` builds it once per machine (keyed, atomic rename,
filelock).  torch is imported inside functions only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch

#: Bump when the bytes :func:`write_draft` writes change.
RANDOM_DRAFT_VERSION = "1"


def draft_config(
    target_config: dict[str, Any],
    layer_ids: Sequence[int] | None,
    *,
    draft_vocab_size: int | None = None,
    num_heads: int = 4,
    intermediate_size: int | None = None,
) -> dict[str, Any]:
    """The ``config.json`` of an EAGLE-3 draft for a target with ``target_config``.

    Args:
        layer_ids: ``eagle_aux_hidden_state_layer_ids`` exactly as written in the
            file (``None``: no ids, so SGLang uses its default list).
        draft_vocab_size: reduced draft vocabulary (default: the target's).
    """
    hidden = int(target_config["hidden_size"])
    vocab = int(target_config["vocab_size"])
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": intermediate_size or 2 * hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "head_dim": hidden // num_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": int(target_config.get("max_position_embeddings", 4096)),
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "vocab_size": vocab,
        "draft_vocab_size": int(draft_vocab_size or vocab),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": target_config.get("bos_token_id", 0),
        "eos_token_id": target_config.get("eos_token_id"),
        "pad_token_id": None,
        "torch_dtype": "float32",
    }
    if layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [int(i) for i in layer_ids]}
    else:
        config["num_aux_hidden_states"] = 3
    return config


def draft_weights(config: dict[str, Any], *, seed: int = 0) -> "dict[str, torch.Tensor]":
    """Random fp32 weights for ``config`` (N(0, 1/fan_in) matrices, unit norms)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    h = int(config["hidden_size"])
    h_in = int(config.get("target_hidden_size", h))
    inter = int(config["intermediate_size"])
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config["head_dim"])
    k = len((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or []) or int(
        config.get("num_aux_hidden_states", 3)
    )
    vocab, draft_vocab = int(config["vocab_size"]), int(config["draft_vocab_size"])

    def mat(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=gen) / in_f**0.5

    w = {
        "fc.weight": mat(h, k * h_in),
        "midlayer.self_attn.q_proj.weight": mat(heads * head_dim, 2 * h),
        "midlayer.self_attn.k_proj.weight": mat(kv_heads * head_dim, 2 * h),
        "midlayer.self_attn.v_proj.weight": mat(kv_heads * head_dim, 2 * h),
        "midlayer.self_attn.o_proj.weight": mat(h, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": mat(inter, h),
        "midlayer.mlp.up_proj.weight": mat(inter, h),
        "midlayer.mlp.down_proj.weight": mat(h, inter),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "norm.weight": torch.ones(h),
        "lm_head.weight": mat(draft_vocab, h),
    }
    if draft_vocab < vocab:
        # Draft token j stands for target token hot[j]; d2t stores hot[j] - j.
        hot = torch.sort(torch.randperm(vocab, generator=gen)[:draft_vocab]).values
        w["d2t"] = hot - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[hot] = True
        w["t2d"] = t2d
    return w


def write_draft(
    out_dir: Path,
    target_config: dict[str, Any],
    layer_ids: Sequence[int] | None,
    *,
    seed: int = 0,
    draft_vocab_size: int | None = None,
) -> Path:
    """Write a random EAGLE-3 draft for ``target_config`` into ``out_dir``; returns it."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = draft_config(target_config, layer_ids, draft_vocab_size=draft_vocab_size)
    weights = draft_weights(config, seed=seed)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def capture_draft_dir(cache_root: Path, target_config: dict[str, Any], layer_ids: Sequence[int] | None) -> Path:
    """``cache_root/drafts/capture-<key>``: the random draft declaring ``layer_ids``
    for a target with ``target_config`` (may not exist yet)."""
    material = json.dumps({"version": RANDOM_DRAFT_VERSION, "ids": None if layer_ids is None else list(layer_ids),
                           "config": draft_config(target_config, layer_ids)}, sort_keys=True)
    key = hashlib.sha256(material.encode()).hexdigest()[:16]
    return Path(cache_root) / "drafts" / f"capture-{key}"


def ensure_capture_draft(cache_root: Path, target_config: dict[str, Any], layer_ids: Sequence[int] | None) -> Path:
    """The cached random draft for ``layer_ids`` (built once per machine; pytest-xdist
    workers wait on a file lock; the directory appears complete or not at all)."""
    from filelock import FileLock

    final = capture_draft_dir(cache_root, target_config, layer_ids)
    if (final / "config.json").is_file() and (final / "model.safetensors").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final.parent / f"{final.name}.lock"), timeout=600):
        if (final / "config.json").is_file():
            return final
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            write_draft(tmp, target_config, layer_ids)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
