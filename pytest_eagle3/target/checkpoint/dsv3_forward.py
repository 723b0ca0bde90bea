"""An independent fp32 forward of a DeepSeek-V3-layout target: batch ``[B, T, H]``, no KV cache.

The same math as transformers' ``DeepseekV3ForCausalLM`` and SGLang's
``DeepseekV2ForCausalLM`` (MLA attention with YaRN rope, noaux_tc MoE
routing), over a state dict under the real checkpoint names.  Used by the
weight calibration (:mod:`pytest_eagle3.target.checkpoint.init`) and as a
cross-check of transformers in the project's tests.

torch is imported inside functions only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pytest_eagle3.target.checkpoint.dsv3_config import Dims

if TYPE_CHECKING:
    import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension, times ``weight``."""
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_tables(dims: Dims, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(cos, sin, softmax_scale)`` for ``positions`` ``[T]`` (int64).

    cos/sin are ``[T, rope/2]`` float32, already multiplied by YaRN's
    attention factor; the softmax scale includes ``mscale(factor, mscale_all_dim)^2``.
    The YaRN inverse frequencies follow SGLang's ``DeepseekScalingRotaryEmbedding``
    and transformers' ``_compute_yarn_parameters`` (truncated correction range).
    """
    import torch

    d = dims.rope
    pos_freqs = dims.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    inv_freq = 1.0 / pos_freqs
    attn_factor = 1.0
    scale = (dims.nope + dims.rope) ** -0.5
    rs = dims.rope_scaling
    if rs is not None:
        factor = float(rs["factor"])
        orig = float(rs["original_max_position_embeddings"])
        beta_fast = float(rs.get("beta_fast") or 32)
        beta_slow = float(rs.get("beta_slow") or 1)

        def corr_dim(rot: float) -> float:
            return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(dims.rope_theta))

        low = max(math.floor(corr_dim(beta_fast)), 0)
        high = min(math.ceil(corr_dim(beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrap_mask = 1 - ramp
        inv_freq = (inv_freq / factor) * (1 - extrap_mask) + inv_freq * extrap_mask
        mscale = rs.get("mscale")
        mscale_all = rs.get("mscale_all_dim")
        # transformers' rule; SGLang's agrees when both are set (as in real V3).
        if mscale and mscale_all:
            attn_factor = _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all))
        else:
            attn_factor = _yarn_mscale(factor)
        if mscale_all:
            scale *= _yarn_mscale(factor, float(mscale_all)) ** 2
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos() * attn_factor, freqs.sin() * attn_factor, scale


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate ``x`` ``[B, T, h, rope]``; cos/sin ``[T, rope/2]``."""
    import torch

    c, s = cos[None, :, None, :], sin[None, :, None, :]
    if interleave:  # GPT-J pairs (x0, x1), (x2, x3), ...: SGLang is_neox_style=False
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def mla_attention(
    sd: dict[str, torch.Tensor], p: str, dims: Dims, h: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, scale: float,
) -> torch.Tensor:
    """MLA self-attention of layer prefix ``p`` (``model.layers.i.self_attn``), causal."""
    import torch

    B, T, _ = h.shape
    if dims.q_lora is None:
        q = h @ sd[f"{p}.q_proj.weight"].T
    else:
        qa = rms_norm(h @ sd[f"{p}.q_a_proj.weight"].T, sd[f"{p}.q_a_layernorm.weight"], dims.eps)
        q = qa @ sd[f"{p}.q_b_proj.weight"].T
    q = q.view(B, T, dims.heads, dims.nope + dims.rope)
    q_nope, q_pe = q.split([dims.nope, dims.rope], dim=-1)
    ckv = h @ sd[f"{p}.kv_a_proj_with_mqa.weight"].T
    c, k_pe = ckv.split([dims.kv_lora, dims.rope], dim=-1)
    c = rms_norm(c, sd[f"{p}.kv_a_layernorm.weight"], dims.eps)
    kv = (c @ sd[f"{p}.kv_b_proj.weight"].T).view(B, T, dims.heads, dims.nope + dims.v)
    k_nope, v = kv.split([dims.nope, dims.v], dim=-1)
    q_pe = _apply_rope(q_pe, cos, sin, dims.rope_interleave)
    k_pe = _apply_rope(k_pe.view(B, T, 1, dims.rope), cos, sin, dims.rope_interleave)
    q = torch.cat((q_nope, q_pe), dim=-1).transpose(1, 2)  # [B, h, T, d]
    k = torch.cat((k_nope, k_pe.expand(-1, -1, dims.heads, -1)), dim=-1).transpose(1, 2)
    scores = (q @ k.transpose(-1, -2)) * scale
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
    out = (probs @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, dims.heads * dims.v)
    return out @ sd[f"{p}.o_proj.weight"].T


def dense_mlp(sd: dict[str, torch.Tensor], p: str, x: torch.Tensor) -> torch.Tensor:
    """SiLU-gated MLP of prefix ``p`` (``model.layers.i.mlp``) on ``x``."""
    import torch.nn.functional as F

    gate = x @ sd[f"{p}.gate_proj.weight"].T
    up = x @ sd[f"{p}.up_proj.weight"].T
    return (F.silu(gate) * up) @ sd[f"{p}.down_proj.weight"].T


def route(sd: dict[str, torch.Tensor], p: str, dims: Dims, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """noaux_tc routing of ``x`` ``[N, H]``: ``(weights [N, k] fp32, experts [N, k] int64)``."""
    import torch

    scores = (x.float() @ sd[f"{p}.gate.weight"].float().T).sigmoid()
    choice = scores + sd[f"{p}.gate.e_score_correction_bias"]
    if dims.n_group > 1:
        grouped = choice.view(-1, dims.n_group, dims.experts // dims.n_group)
        group_scores = grouped.topk(2, dim=-1)[0].sum(-1)
        keep = torch.zeros_like(group_scores).scatter_(
            1, group_scores.topk(dims.topk_group, dim=-1)[1], 1.0
        )
        mask = keep[:, :, None].expand_as(grouped).reshape(-1, dims.experts)
        choice = choice.masked_fill(mask == 0, float("-inf"))
    idx = choice.topk(dims.topk, dim=-1)[1]
    weights = scores.gather(1, idx)
    if dims.norm_topk:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * dims.routed_scale, idx


def moe_mlp(sd: dict[str, torch.Tensor], p: str, dims: Dims, h: torch.Tensor) -> torch.Tensor:
    """MoE MLP of prefix ``p``: routed experts (:func:`route`) plus the shared experts."""
    import torch

    shape = h.shape
    x = h.reshape(-1, shape[-1])
    weights, idx = route(sd, p, dims, x)
    out = torch.zeros_like(x)
    for e in range(dims.experts):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if rows.numel():
            y = dense_mlp(sd, f"{p}.experts.{e}", x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y)
    if dims.shared:
        out = out + dense_mlp(sd, f"{p}.shared_experts", x)
    return out.view(shape)


def forward_hidden_states(sd: dict[str, torch.Tensor], dims: Dims, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Residual-stream snapshots of ``tokens`` ``[B, T]``: ``[hs[0..L], final_prenorm]``.

    Same indexing as :mod:`pytest_eagle3.verdicts.snapshots`; each entry ``[B, T, H]`` fp32.
    An independent fp32 implementation, used for calibration and as a cross-check
    of transformers in the project's tests.
    """
    import torch

    T = tokens.shape[1]
    cos, sin, scale = rope_tables(dims, torch.arange(T))
    x = sd["model.embed_tokens.weight"][tokens]
    out = [x]
    for i in range(dims.layers):
        p = f"model.layers.{i}"
        h = rms_norm(x, sd[f"{p}.input_layernorm.weight"], dims.eps)
        x = x + mla_attention(sd, f"{p}.self_attn", dims, h, cos, sin, scale)
        h = rms_norm(x, sd[f"{p}.post_attention_layernorm.weight"], dims.eps)
        x = x + (moe_mlp(sd, f"{p}.mlp", dims, h) if dims.is_moe(i) else dense_mlp(sd, f"{p}.mlp", h))
        out.append(x)
    out[-1] = rms_norm(x, sd["model.norm.weight"], dims.eps)
    out.append(x)
    return out
