"""Deterministic "distinguishable-layers" weights for a DeepSeek-V3-layout target.

The init of docs/design.md, "Reduced-layer targets that can tell layers apart":

* every linear weight N(0, gain / fan_in); ``embed_tokens`` N(0, embedding_std^2);
* every RMSNorm weight ``exp(N(0, sigma^2))`` (lognormal), so a tensor and its
  normed copy are not parallel;
* each attention and MLP branch scaled so its output RMS is
  ``sqrt(branch_variance_ratio)`` times the RMS of the residual stream it reads.
  The scales come from a calibration forward (own fp32 torch code,
  :mod:`pytest_eagle3.target.checkpoint.dsv3_forward`, the same math as
  transformers' ``DeepseekV3ForCausalLM`` and SGLang's
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
from typing import TYPE_CHECKING

from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.target.checkpoint.dsv3_config import UNSUPPORTED_MSG, Dims
from pytest_eagle3.target.checkpoint.dsv3_forward import dense_mlp, mla_attention, moe_mlp, rms_norm, rope_tables

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.target.spec import InitParams, TargetSpec

#: ``{name}``: the preset.
NEEDS_GPU_MSG = (
    "target {name} is built on a GPU (init.build_device = cuda: billions of parameters) and "
    "no GPU is visible here; build it on the GPU runner, or use the CPU preset tiny-dsv3"
)


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
        h = rms_norm(x, sd[f"{p}.input_layernorm.weight"], dims.eps)
        attn = mla_attention(sd, f"{p}.self_attn", dims, h, cos, sin, scale)
        s_attn = fitted(attn, x)
        sd[f"{p}.self_attn.o_proj.weight"] *= s_attn
        x = x + attn * s_attn
        h = rms_norm(x, sd[f"{p}.post_attention_layernorm.weight"], dims.eps)
        if dims.is_moe(i):
            mlp = moe_mlp(sd, f"{p}.mlp", dims, h)
            downs = [f"{p}.mlp.experts.{e}.down_proj.weight" for e in range(dims.experts)]
            if dims.shared:
                downs.append(f"{p}.mlp.shared_experts.down_proj.weight")
        else:
            mlp = dense_mlp(sd, f"{p}.mlp", h)
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
