"""Deterministic "distinguishable-layers" weights for a DeepSeek-V3-layout target.

The init of docs/design.md, "Reduced-layer targets that can tell layers apart":

* every linear weight N(0, gain / fan_in); ``embed_tokens`` N(0, embedding_std^2);
* every RMSNorm weight ``exp(N(0, sigma^2))`` (lognormal), so a tensor and its
  normed copy are not parallel;
* each attention and MLP branch scaled so its output RMS is
  ``sqrt(branch_variance_ratio)`` times the RMS of the residual stream it reads.
  The scales come from a calibration forward (own fp32 torch code below, the
  same math as transformers' ``DeepseekV3ForCausalLM`` and SGLang's
  ``DeepseekV2ForCausalLM``), layer by layer, on a seeded random token batch;
  each scale is rounded to ``scale_mantissa_bits`` bits so float noise
  (thread count, BLAS) cannot change the bytes, then folded into ``o_proj``
  and every ``down_proj`` (routed and shared experts alike: the MoE output is
  linear in them);
* MoE routing pinned: ``e_score_correction_bias`` is ``router_bias`` on
  ``pinned_experts`` experts per MoE layer (rotating across layers) and 0
  elsewhere, so top-k never depends on the sigmoid scores (in [0, 1]).

Everything is drawn from one ``torch.Generator`` seeded with ``spec.seed``, in a
fixed order, on CPU in float32 (``e_score_correction_bias`` is float32 as in
the real checkpoint). Weight names are the real DeepSeek-V3 checkpoint names.

torch is imported inside functions only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_eagle3.errors import Eagle3ConfigError

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.target.spec import InitParams, TargetSpec

#: ``{what}``: the unsupported config feature.
UNSUPPORTED_MSG = (
    "the checkpoint builder supports the DeepSeek-V3 layout only ({what}); "
    "use a tiny-dsv3-like spec or pass an existing checkpoint directory"
)
#: ``{name}``: the preset.
NEEDS_GPU_MSG = (
    "target {name} is built on a GPU (init.build_device = cuda: billions of parameters) and "
    "no GPU is visible here; build it on the GPU runner, or use the CPU preset tiny-dsv3"
)


@dataclass(frozen=True)
class Dims:
    """The config fields the builder reads, validated.

    Raises (from :meth:`from_config`):
        Eagle3ConfigError: the config is not a DeepSeek-V3 layout the builder supports.
    """

    layers: int
    hidden: int
    vocab: int
    heads: int
    q_lora: int | None
    kv_lora: int
    nope: int
    rope: int
    v: int
    inter: int
    moe_inter: int
    experts: int
    shared: int
    topk: int
    n_group: int
    topk_group: int
    first_dense: int
    moe_freq: int
    eps: float
    norm_topk: bool
    routed_scale: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    rope_interleave: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Dims:
        arch = cfg.get("architectures") or []
        if "DeepseekV3ForCausalLM" not in arch:
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what=f"architectures={arch}"))
        checks = {
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "hidden_act": "silu",
        }
        for key, want in checks.items():
            if cfg.get(key, want) != want:
                raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what=f"{key}={cfg.get(key)!r}"))
        if cfg.get("tie_word_embeddings", False):
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what="tie_word_embeddings=true"))
        if cfg.get("attention_bias", False):
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what="attention_bias=true"))
        rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rtype = rp.get("rope_type", rp.get("type", "default"))
        theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        if rtype not in ("default", "yarn"):
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what=f"rope type {rtype!r}"))
        try:
            return cls(
                layers=int(cfg["num_hidden_layers"]),
                hidden=int(cfg["hidden_size"]),
                vocab=int(cfg["vocab_size"]),
                heads=int(cfg["num_attention_heads"]),
                q_lora=None if cfg.get("q_lora_rank") is None else int(cfg["q_lora_rank"]),
                kv_lora=int(cfg["kv_lora_rank"]),
                nope=int(cfg["qk_nope_head_dim"]),
                rope=int(cfg["qk_rope_head_dim"]),
                v=int(cfg["v_head_dim"]),
                inter=int(cfg["intermediate_size"]),
                moe_inter=int(cfg["moe_intermediate_size"]),
                experts=int(cfg["n_routed_experts"]),
                shared=int(cfg.get("n_shared_experts") or 0),
                topk=int(cfg["num_experts_per_tok"]),
                n_group=int(cfg.get("n_group") or 1),
                topk_group=int(cfg.get("topk_group") or 1),
                first_dense=int(cfg.get("first_k_dense_replace", 0)),
                moe_freq=int(cfg.get("moe_layer_freq", 1)),
                eps=float(cfg.get("rms_norm_eps", 1e-6)),
                norm_topk=bool(cfg.get("norm_topk_prob", True)),
                routed_scale=float(cfg.get("routed_scaling_factor", 1.0)),
                rope_theta=theta,
                rope_scaling=rp if rtype == "yarn" else None,
                rope_interleave=bool(cfg.get("rope_interleave", True)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what=f"config field {exc}")) from None

    def is_moe(self, layer: int) -> bool:
        """Whether ``layer`` has a MoE MLP (transformers' and SGLang's rule)."""
        return layer >= self.first_dense and layer % self.moe_freq == 0


@dataclass(frozen=True)
class BranchScale:
    """Calibration record of one layer (plain floats, for ``build_info.json``)."""

    layer: int
    stream_rms_in: float
    attn_scale: float
    mlp_scale: float


def _round_scale(value: float, bits: int) -> float:
    """``value`` rounded to ``bits`` mantissa bits (exact in float32)."""
    mant, exp = math.frexp(value)
    return math.ldexp(round(mant * (1 << bits)) / (1 << bits), exp)


def _draw(dims: Dims, init: InitParams, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """All weights before calibration, in a fixed draw order."""
    import torch

    sd: dict[str, torch.Tensor] = {}

    def linear(name: str, out_f: int, in_f: int) -> None:
        std = math.sqrt(init.matrix_gain / in_f)
        sd[name] = torch.randn(out_f, in_f, generator=gen) * std

    def norm(name: str, size: int) -> None:
        sd[name] = torch.exp(torch.randn(size, generator=gen) * init.norm_lognormal_sigma)

    def mlp(prefix: str, inter: int) -> None:
        linear(f"{prefix}.gate_proj.weight", inter, dims.hidden)
        linear(f"{prefix}.up_proj.weight", inter, dims.hidden)
        linear(f"{prefix}.down_proj.weight", dims.hidden, inter)

    qk_head = dims.nope + dims.rope
    sd["model.embed_tokens.weight"] = (
        torch.randn(dims.vocab, dims.hidden, generator=gen) * init.embedding_std
    )
    moe_index = 0
    for i in range(dims.layers):
        p = f"model.layers.{i}"
        norm(f"{p}.input_layernorm.weight", dims.hidden)
        a = f"{p}.self_attn"
        if dims.q_lora is None:
            linear(f"{a}.q_proj.weight", dims.heads * qk_head, dims.hidden)
        else:
            linear(f"{a}.q_a_proj.weight", dims.q_lora, dims.hidden)
            norm(f"{a}.q_a_layernorm.weight", dims.q_lora)
            linear(f"{a}.q_b_proj.weight", dims.heads * qk_head, dims.q_lora)
        linear(f"{a}.kv_a_proj_with_mqa.weight", dims.kv_lora + dims.rope, dims.hidden)
        norm(f"{a}.kv_a_layernorm.weight", dims.kv_lora)
        linear(f"{a}.kv_b_proj.weight", dims.heads * (dims.nope + dims.v), dims.kv_lora)
        linear(f"{a}.o_proj.weight", dims.hidden, dims.heads * dims.v)
        norm(f"{p}.post_attention_layernorm.weight", dims.hidden)
        if dims.is_moe(i):
            linear(f"{p}.mlp.gate.weight", dims.experts, dims.hidden)
            bias = torch.zeros(dims.experts, dtype=torch.float32)
            for t in range(init.pinned_experts):
                bias[(moe_index * init.pinned_experts + t) % dims.experts] = init.router_bias
            sd[f"{p}.mlp.gate.e_score_correction_bias"] = bias
            for e in range(dims.experts):
                mlp(f"{p}.mlp.experts.{e}", dims.moe_inter)
            if dims.shared:
                mlp(f"{p}.mlp.shared_experts", dims.moe_inter * dims.shared)
            moe_index += 1
        else:
            mlp(f"{p}.mlp", dims.inter)
    norm("model.norm.weight", dims.hidden)
    linear("lm_head.weight", dims.vocab, dims.hidden)
    return sd


# --------------------------------------------------------------------------
# Calibration forward: fp32, batch [B, T, H], no KV cache.


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
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


def _attention(
    sd: dict[str, torch.Tensor], p: str, dims: Dims, h: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, scale: float,
) -> torch.Tensor:
    """MLA self-attention of layer prefix ``p`` (``model.layers.i.self_attn``), causal."""
    import torch

    B, T, _ = h.shape
    if dims.q_lora is None:
        q = h @ sd[f"{p}.q_proj.weight"].T
    else:
        qa = _rms_norm(h @ sd[f"{p}.q_a_proj.weight"].T, sd[f"{p}.q_a_layernorm.weight"], dims.eps)
        q = qa @ sd[f"{p}.q_b_proj.weight"].T
    q = q.view(B, T, dims.heads, dims.nope + dims.rope)
    q_nope, q_pe = q.split([dims.nope, dims.rope], dim=-1)
    ckv = h @ sd[f"{p}.kv_a_proj_with_mqa.weight"].T
    c, k_pe = ckv.split([dims.kv_lora, dims.rope], dim=-1)
    c = _rms_norm(c, sd[f"{p}.kv_a_layernorm.weight"], dims.eps)
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


def _mlp(sd: dict[str, torch.Tensor], p: str, x: torch.Tensor) -> torch.Tensor:
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


def _moe(sd: dict[str, torch.Tensor], p: str, dims: Dims, h: torch.Tensor) -> torch.Tensor:
    import torch

    shape = h.shape
    x = h.reshape(-1, shape[-1])
    weights, idx = route(sd, p, dims, x)
    out = torch.zeros_like(x)
    for e in range(dims.experts):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if rows.numel():
            y = _mlp(sd, f"{p}.experts.{e}", x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y)
    if dims.shared:
        out = out + _mlp(sd, f"{p}.shared_experts", x)
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
        h = _rms_norm(x, sd[f"{p}.input_layernorm.weight"], dims.eps)
        x = x + _attention(sd, f"{p}.self_attn", dims, h, cos, sin, scale)
        h = _rms_norm(x, sd[f"{p}.post_attention_layernorm.weight"], dims.eps)
        x = x + (_moe(sd, f"{p}.mlp", dims, h) if dims.is_moe(i) else _mlp(sd, f"{p}.mlp", h))
        out.append(x)
    out[-1] = _rms_norm(x, sd["model.norm.weight"], dims.eps)
    out.append(x)
    return out


def _calibrate(
    sd: dict[str, torch.Tensor], dims: Dims, init: InitParams, gen: torch.Generator
) -> list[BranchScale]:
    """Scale ``o_proj`` and ``down_proj`` weights in place, layer by layer."""
    import torch

    tokens = torch.randint(
        dims.vocab, (init.calibration_sequences, init.calibration_tokens), generator=gen
    )
    cos, sin, scale = rope_tables(dims, torch.arange(init.calibration_tokens))
    target = math.sqrt(init.branch_variance_ratio)

    def rms(t: torch.Tensor) -> float:
        return float(t.double().pow(2).mean().sqrt())

    def fitted(branch: torch.Tensor, stream: torch.Tensor) -> float:
        return _round_scale(target * rms(stream) / rms(branch), init.scale_mantissa_bits)

    records: list[BranchScale] = []
    x = sd["model.embed_tokens.weight"][tokens]
    for i in range(dims.layers):
        p = f"model.layers.{i}"
        stream_in = rms(x)
        h = _rms_norm(x, sd[f"{p}.input_layernorm.weight"], dims.eps)
        attn = _attention(sd, f"{p}.self_attn", dims, h, cos, sin, scale)
        s_attn = fitted(attn, x)
        sd[f"{p}.self_attn.o_proj.weight"] *= s_attn
        x = x + attn * s_attn
        h = _rms_norm(x, sd[f"{p}.post_attention_layernorm.weight"], dims.eps)
        if dims.is_moe(i):
            mlp = _moe(sd, f"{p}.mlp", dims, h)
            downs = [f"{p}.mlp.experts.{e}.down_proj.weight" for e in range(dims.experts)]
            if dims.shared:
                downs.append(f"{p}.mlp.shared_experts.down_proj.weight")
        else:
            mlp = _mlp(sd, f"{p}.mlp", h)
            downs = [f"{p}.mlp.down_proj.weight"]
        s_mlp = fitted(mlp, x)
        for name in downs:
            sd[name] *= s_mlp
        x = x + mlp * s_mlp
        records.append(BranchScale(i, stream_in, s_attn, s_mlp))
    return records


def make_weights(spec: TargetSpec) -> tuple[dict[str, torch.Tensor], list[BranchScale]]:
    """All weights of ``spec``'s checkpoint and the calibration record.

    Weights are drawn on ``spec.init.build_device`` (a GPU preset's billions
    of parameters take seconds there).

    Returns:
        ``(state_dict, scales)``: contiguous float32 tensors on the build device, under real
        DeepSeek-V3 names (``model.layers.N.self_attn.q_a_proj.weight``, ...,
        ``lm_head.weight``), and one :class:`BranchScale` per layer.

    Raises:
        Eagle3ConfigError: the config is not a supported DeepSeek-V3 layout, or
            the spec is built on cuda and no GPU is visible.
    """
    import torch

    dims = Dims.from_config(spec.config)
    if spec.init.pinned_experts > dims.experts:
        raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what="pinned_experts > n_routed_experts"))
    device = spec.init.build_device
    if device == "cuda" and not torch.cuda.is_available():
        raise Eagle3ConfigError(NEEDS_GPU_MSG.format(name=spec.name))
    gen = torch.Generator(device=device).manual_seed(spec.seed)
    # One thread: reductions then do not depend on the machine's core count, and
    # these tiny ops are much faster than with OpenMP on busy, shared cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # Factory calls (randn, arange, zeros) default to the build device.
        with torch.no_grad(), torch.device(device):
            sd = _draw(dims, spec.init, gen)
            scales = _calibrate(sd, dims, spec.init, gen)
    finally:
        torch.set_num_threads(threads)
    return {k: v.contiguous() for k, v in sd.items()}, scales
