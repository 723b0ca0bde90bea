"""Plain-torch forward of the EAGLE-3 draft: what SGLang 0.5.23 computes, step by step.

Source of every fact: ``sglang/srt/models/llama_eagle3.py`` (``LlamaModel.forward``,
``LlamaDecoderLayer.forward``), ``sglang/srt/models/llama.py`` (``LlamaAttention``,
``LlamaMLP``), and the EAGLE worker ``sglang/srt/speculative/eagle_worker_v2.py``
(``_draft_extend_for_prefill``, ``draft_forward``, ``_draft_extend_for_decode``) with
``eagle_worker_common.py::prepare_for_draft_extend``.

One draft forward, for rows with input token embedding ``e`` ``[T, H]`` and input
hidden ``h`` (``[T, K*Ht]`` target aux states, or ``[T, H]`` the draft's own)::

    h = fc(h) if h.shape[-1] != e.shape[-1] else h          # width test, LlamaModel.forward
    residual = h
    x = cat(input_layernorm(e), hidden_norm(h))               # [T, 2H]
    residual = residual + o_proj(attn(rope(q(x)), rope(k(x)), v(x)))
    y = mlp(post_attention_layernorm(residual))
    prenorm = y + residual                                    # returned as the aux hidden
    logits = lm_head(norm(prenorm))

``e`` comes from the *target's* ``embed_tokens`` (``set_embed``, see
:mod:`pytest_eagle3.draft.config`). The returned hidden state (``prenorm``; ``norm_output``
unset) is what the next draft step receives as ``h`` (``draft_forward``:
``hidden_states = logits_output.hidden_states``), so steps after the first skip ``fc``.

How the worker lays a sequence ``x[0..N-1]`` out (positions are absolute target positions):

* prefill: the target processes ``x[0..P-1]``, samples ``x[P]``; draft extend gets
  ids shifted left by one (``cat(input_ids[1:], next_token)``) = ``x[1..P]`` at
  positions ``0..P-1`` with the target aux rows ``A[0..P-1]``;
* verify: the target scores ``[x[n], d1, d2, d3]`` at ``n..n+3``; draft extend gets
  the target's predictions there (the accepted tokens, then the bonus) with
  ``A[n..n+3]``: again row ``t`` = (token ``x[t+1]``, ``A[t]``), predicting ``x[t+2]``;
* draft decode (``speculative_num_steps`` = S, topk 1): the extend's last row gives
  ``d1``; step ``k = 2..S`` feeds ``(d_{k-1}, prenorm of step k-1)`` at position
  ``t + k - 1`` and attends to the committed rows ``0..t`` (written by extends from
  target states) and to the rows this chain wrote itself.

So with teacher forcing, the whole chain from every start ``t`` can be computed at once
(:func:`chain_forward` for one sequence, :func:`packed_chain_forward` for several packed
into one batch: the EAGLE-3 "training-time test" layout); accept counts are exact under
teacher forcing because a chain stops at its first wrong token. :class:`DraftSession`
is the literal sequential form with a KV cache (one row per position), used to check it.

The MLA draft (``cfg.attention == "mla"``, ``sglang/srt/models/kimi_k25_eagle3.py``)
differs only inside the attention (:func:`mla_qkv`: DeepSeek-V2 multi-latent
attention over ``x``, yarn rope on interleaved pairs, softmax scale with yarn's
``mscale**2``) and in two flags: ``fc_norm`` (an RMSNorm per aux slot before
``fc``, :func:`project`) and ``norm_output`` (the next step receives
``norm(prenorm)``, :func:`finish`).

Facts not used because these drafts do not need them: ``norm_before_fc`` (one norm
over all slots before ``fc``), ``d2t`` (reduced vocabulary), more than one decoder layer.

torch is imported inside functions only. Tensors are float32 on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import math

from pytest_eagle3.draft.config import FC, LM_HEAD, NORM, DraftConfig

if TYPE_CHECKING:
    import torch

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """SGLang ``RMSNorm.forward_native``: ``x * rsqrt(mean(x^2) + eps) * weight`` (fp32)."""
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding of ``x`` ``[T, heads, hd]`` at ``positions`` ``[T]`` (int64).

    ``sglang/srt/layers/rotary_embedding/base.py::RotaryEmbedding``: inverse
    frequencies ``1 / theta ** (arange(0, hd, 2) / hd)``, first half / second half pairs.
    """
    import torch

    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def yarn_inv_freq(cfg: DraftConfig) -> torch.Tensor:
    """Inverse frequencies ``[rope/2]`` of the MLA rope: plain ``1 / theta**(2i/d)``, or
    with yarn ``rope_scaling`` the blend of ``sglang/srt/layers/rotary_embedding/rope_variant.py``
    ``DeepseekScalingRotaryEmbedding._compute_inv_freq`` (interpolated by ``factor``
    below the correction range ``beta_fast..beta_slow``, extrapolated above it)."""
    import torch

    d, base = int(cfg.qk_rope_head_dim or 0), cfg.rope_theta
    pos = base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    rs = cfg.rope_scaling or {}
    if not rs or (rs.get("type") or rs.get("rope_type")) != "yarn":
        return 1.0 / pos
    factor = float(rs["factor"])
    original = int(rs.get("original_max_position_embeddings") or cfg.max_position_embeddings)

    def dim(rotations: float) -> float:
        return (d * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(dim(float(rs.get("beta_fast", 32)))), 0)
    high = min(math.ceil(dim(float(rs.get("beta_slow", 1)))), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    return (1.0 / (factor * pos)) * (1 - extrapolate) + (1.0 / pos) * extrapolate


def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, cfg: DraftConfig) -> torch.Tensor:
    """GPT-J style rotary embedding (``is_neox_style=False``, as SGLang's DeepSeek MLA)
    of ``x`` ``[T, heads, d]``: pairs ``(x[2i], x[2i+1])`` rotate by ``positions * inv_freq[i]``.
    Yarn's cos/sin factor ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``
    is applied (1 when the two are equal)."""
    import torch

    freqs = positions.to(torch.float32)[:, None] * yarn_inv_freq(cfg)[None, :]
    rs = cfg.rope_scaling or {}
    m = 1.0
    if rs and float(rs.get("factor", 1)) > 1:
        def ms(v: float) -> float:
            return 0.1 * v * math.log(float(rs["factor"])) + 1.0 if v > 0 else 1.0
        m = ms(float(rs.get("mscale", 1))) / ms(float(rs.get("mscale_all_dim", 0)))
    cos, sin = (freqs.cos() * m)[:, None, :], (freqs.sin() * m)[:, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


@dataclass
class StepOut:
    """One draft forward over ``T`` rows.

    Attributes:
        logits: ``[T, Vd]`` float32.
        prenorm: ``[T, H]`` float32, the hidden state the next step receives (the
            pre-norm sum; the final norm's output with ``norm_output``).
    """

    logits: torch.Tensor
    prenorm: torch.Tensor


def project(params: dict, cfg: DraftConfig, hidden: torch.Tensor) -> torch.Tensor:
    """``fc`` when ``hidden`` is ``[T, K*Ht]`` aux states, identity for ``[T, H]`` (SGLang's
    width test); with ``fc_norm`` each of the K slots is RMS-normed first
    (``Eagle3MLAModel.forward``: ``hidden_states.chunk(K)``, one norm per chunk)."""
    import torch

    if hidden.shape[-1] != cfg.hidden_size:
        if cfg.fc_norm:
            chunks = hidden.chunk(cfg.num_aux, dim=-1)
            hidden = torch.cat([rms_norm(c, params[f"fc_norm.{k}.weight"], cfg.rms_norm_eps)
                                for k, c in enumerate(chunks)], dim=-1)
        return hidden @ params[FC].T
    return hidden


def qkv(
    params: dict, cfg: DraftConfig, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
    q_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention inputs of one step: ``(q [Q,heads,hd], k [T,kv,hd], v [T,kv,hd], residual [T,H])``.

    ``x = cat(input_layernorm(embeds), hidden_norm(hidden))`` ``[T, 2H]`` (SGLang's input
    layer, ``llama_eagle3.py::LlamaDecoderLayer.forward``), then q/k/v projections and
    rope. ``hidden`` must already be projected (:func:`project`). ``q_rows`` (indices
    into ``T``) limits the queries to those rows (default: all).
    """
    import torch

    if cfg.is_mla:
        return mla_qkv(params, cfg, embeds, hidden, positions, q_rows)
    p, eps = cfg.layer_prefix, cfg.rms_norm_eps
    x = torch.cat(
        (rms_norm(embeds, params[f"{p}.input_layernorm.weight"], eps),
         rms_norm(hidden, params[f"{p}.hidden_norm.weight"], eps)),
        dim=-1,
    )
    T, hd = x.shape[0], cfg.head_dim
    xq, qpos = (x, positions) if q_rows is None else (x[q_rows], positions[q_rows])
    q = (xq @ params[f"{p}.self_attn.q_proj.weight"].T).view(xq.shape[0], cfg.num_attention_heads, hd)
    k = (x @ params[f"{p}.self_attn.k_proj.weight"].T).view(T, cfg.num_key_value_heads, hd)
    v = (x @ params[f"{p}.self_attn.v_proj.weight"].T).view(T, cfg.num_key_value_heads, hd)
    return rope(q, qpos, cfg.rope_theta), rope(k, positions, cfg.rope_theta), v, hidden


def mla_qkv(
    params: dict, cfg: DraftConfig, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
    q_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`qkv` of the MLA draft: ``(q [Q,heads,nope+rope], k [T,heads,nope+rope],
    v [T,heads,v_head_dim], residual [T,H])``.

    ``kimi_k25_eagle3.py::Eagle3MLADecoderLayer.forward`` feeds ``x = cat(input_layernorm(e),
    hidden_norm(h))`` to ``DeepseekV2AttentionMLA``, whose math is (absorbed or not)::

        q = q_b_proj(q_a_layernorm(q_a_proj(x)))            -> [nope | rope] per head
        c, k_pe = split(kv_a_proj_with_mqa(x), [kv_lora_rank, rope])
        k_nope, v = split(kv_b_proj(kv_a_layernorm(c)), [nope, v_head_dim]) per head
        q = [q_nope, rope(q_pe)], k = [k_nope, rope(k_pe) (shared by the heads)]
    """
    import torch

    p, eps = cfg.layer_prefix, cfg.rms_norm_eps
    a = f"{p}.self_attn"
    x = torch.cat(
        (rms_norm(embeds, params[f"{p}.input_layernorm.weight"], eps),
         rms_norm(hidden, params[f"{p}.hidden_norm.weight"], eps)),
        dim=-1,
    )
    T, n = x.shape[0], cfg.num_attention_heads
    nope, rope_d, vd, kvr = (int(cfg.qk_nope_head_dim or 0), int(cfg.qk_rope_head_dim or 0),
                             int(cfg.v_head_dim or 0), int(cfg.kv_lora_rank or 0))
    xq, qpos = (x, positions) if q_rows is None else (x[q_rows], positions[q_rows])
    q = rms_norm(xq @ params[f"{a}.q_a_proj.weight"].T, params[f"{a}.q_a_layernorm.weight"], eps)
    q = (q @ params[f"{a}.q_b_proj.weight"].T).view(xq.shape[0], n, nope + rope_d)
    q = torch.cat((q[..., :nope], rope_interleaved(q[..., nope:], qpos, cfg)), dim=-1)
    kv = x @ params[f"{a}.kv_a_proj_with_mqa.weight"].T
    latent, k_pe = kv[:, :kvr], kv[:, kvr:]
    kvb = (rms_norm(latent, params[f"{a}.kv_a_layernorm.weight"], eps) @ params[f"{a}.kv_b_proj.weight"].T)
    kvb = kvb.view(T, n, nope + vd)
    k_pe = rope_interleaved(k_pe[:, None, :], positions, cfg).expand(T, n, rope_d)
    k = torch.cat((kvb[..., :nope], k_pe), dim=-1)
    return q, k, kvb[..., nope:], hidden


def finish(params: dict, cfg: DraftConfig, attn: torch.Tensor, residual: torch.Tensor) -> StepOut:
    """From the attention output ``[T, heads*v_dim]`` to logits and the hidden state the
    next step receives (``prenorm``, or ``norm(prenorm)`` with ``norm_output``)."""
    import torch.nn.functional as F

    p, eps = cfg.layer_prefix, cfg.rms_norm_eps
    residual = residual + attn @ params[f"{p}.self_attn.o_proj.weight"].T
    y = rms_norm(residual, params[f"{p}.post_attention_layernorm.weight"], eps)
    y = F.silu(y @ params[f"{p}.mlp.gate_proj.weight"].T) * (y @ params[f"{p}.mlp.up_proj.weight"].T)
    prenorm = y @ params[f"{p}.mlp.down_proj.weight"].T + residual
    normed = rms_norm(prenorm, params[NORM], eps)
    logits = normed @ params[LM_HEAD].T
    return StepOut(logits=logits, prenorm=normed if cfg.norm_output else prenorm)


def _expand_kv(t: torch.Tensor, cfg: DraftConfig) -> torch.Tensor:
    """``[..., kv, hd]`` -> ``[..., heads, hd]``: query head ``i`` reads kv head ``i // (heads/kv)``."""
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    return t if rep == 1 else t.repeat_interleave(rep, dim=-2)


@dataclass
class Packed:
    """Several sequences' draft rows packed into one batch (for :func:`packed_chain_forward`).

    Attributes:
        row_tokens: ``[T]`` int64, the input token of every committed row (``x[t+1]``).
        positions: ``[T]`` int64, each row's position in its own sequence.
        segment: ``[T]`` int64, which sequence each row belongs to.
        query: ``[Q]`` int64, rows (indices into ``T``) where a chain starts.
        step_tokens: ``[S, Q]`` int64, input token of step ``k`` (``x[t+k]``; row 0 is
            ``row_tokens[query]``); 0 where the sequence has no such token.
        labels: ``[S, Q]`` int64, the token step ``k`` must draft (``x[t+k+1]``), -1 where none.
    """

    row_tokens: torch.Tensor
    positions: torch.Tensor
    segment: torch.Tensor
    query: torch.Tensor
    step_tokens: torch.Tensor
    labels: torch.Tensor


def pack(sequences: list[tuple[list[int], int]], steps: int) -> Packed:
    """Pack ``[(tokens x[0..N-1], first start row), ...]``: rows ``0..N-2`` of each
    sequence are committed rows, rows ``first..N-2`` start chains of ``steps`` steps."""
    import torch

    row_tokens, positions, segment, query, step_tokens, labels = [], [], [], [], [], []
    offset = 0
    for j, (toks, first) in enumerate(sequences):
        N = len(toks)
        T = N - 1
        row_tokens += toks[1:]
        positions += list(range(T))
        segment += [j] * T
        for t in range(first, T):
            query.append(offset + t)
            step_tokens.append([toks[t + k] if t + k < N else 0 for k in range(1, steps + 1)])
            labels.append([toks[t + k + 1] if t + k + 1 < N else -1 for k in range(1, steps + 1)])
        offset += T
    as_long = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return Packed(
        row_tokens=as_long(row_tokens), positions=as_long(positions), segment=as_long(segment),
        query=as_long(query), step_tokens=as_long(step_tokens).reshape(-1, steps).T.contiguous(),
        labels=as_long(labels).reshape(-1, steps).T.contiguous(),
    )


def packed_chain_forward(
    params: dict, cfg: DraftConfig, embed: torch.Tensor, packed: Packed, aux: torch.Tensor,
    steps: int | None = None,
) -> list[torch.Tensor]:
    """Teacher-forced draft chains from every query row of a packed batch, at once.

    Args:
        params: draft weights by checkpoint name (:func:`pytest_eagle3.draft.config.weight_names`).
        cfg: the draft shape.
        embed: the target's ``embed_tokens`` ``[V, H]``.
        packed: rows and chains (:func:`pack`).
        aux: ``[T, K*Ht]`` target aux rows; row ``t`` is the capture at that row's position.
        steps: chain length (default: all of ``packed.step_tokens``).

    Returns:
        ``steps`` tensors ``[Q, Vd]``: step ``k``'s logits at each chain, meant to
        draft ``packed.labels[k-1]``. A chain's step ``k`` query attends to the committed
        rows of its sequence up to its start (all written from target states, as after
        SGLang's draft extend) and to the rows steps ``2..k`` of the same chain wrote.
    """
    import torch

    S = packed.step_tokens.shape[0] if steps is None else steps
    scale = cfg.softmax_scale
    qrows = packed.query
    T = aux.shape[0]
    q, k1, v1, res = qkv(params, cfg, embed[packed.row_tokens], project(params, cfg, aux), packed.positions,
                         q_rows=qrows)
    k1, v1 = _expand_kv(k1, cfg), _expand_kv(v1, cfg)
    resid = res[qrows]
    qpos, qseg = packed.positions[qrows], packed.segment[qrows]
    visible = (packed.segment[None, :] == qseg[:, None]) & (packed.positions[None, :] <= qpos[:, None])
    out: list[torch.Tensor] = []
    diag_k: list[torch.Tensor] = []  # K_j, V_j of steps 2..k at each chain, [Q, heads, hd]
    diag_v: list[torch.Tensor] = []
    for k in range(1, S + 1):
        s1 = torch.einsum("qhd,shd->hqs", q, k1) * scale  # [heads, Q, T]
        s1 = s1.masked_fill(~visible[None], float("-inf"))
        sd = [torch.einsum("qhd,qhd->hq", q, kj)[..., None] * scale for kj in diag_k]
        probs = torch.cat([s1, *sd], dim=-1).softmax(-1)
        o = torch.einsum("hqs,shd->qhd", probs[..., :T], v1)
        for j, vj in enumerate(diag_v):
            o = o + probs[..., T + j].transpose(0, 1)[..., None] * vj
        step = finish(params, cfg, o.reshape(q.shape[0], -1), resid)
        out.append(step.logits)
        if k == S:
            break
        q, kn, vn, resid = qkv(params, cfg, embed[packed.step_tokens[k]], step.prenorm, qpos + k)
        diag_k.append(_expand_kv(kn, cfg))
        diag_v.append(_expand_kv(vn, cfg))
    return out


def chain_forward(
    params: dict,
    cfg: DraftConfig,
    embed: torch.Tensor,
    tokens: torch.Tensor,
    aux: torch.Tensor,
    steps: int,
    first: int = 0,
) -> list[torch.Tensor]:
    """Teacher-forced draft chains of one sequence (see :func:`packed_chain_forward`).

    Args:
        tokens: ``x[0..N-1]`` int64 ``[N]`` (prompt + continuation).
        aux: target aux rows ``[>= N-1, K*Ht]``; rows ``0..N-2`` are used.
        steps: ``S`` draft tokens per chain (SGLang ``speculative_num_steps``).
        first: chains start at rows ``first..N-2`` (``P - 1`` for a prompt of ``P``
            tokens: the prompt rows before it are only attended to).

    Returns:
        ``S`` tensors ``[N-1-first, Vd]``: row ``r`` holds step ``k``'s logits of the
        chain started at row ``t = first + r``, the prediction of ``x[t+k+1]`` given
        that steps ``1..k-1`` drafted ``x[t+2..t+k]`` (rows past the sequence's end
        are computed on token 0: ignore them).
    """
    packed = pack([(tokens.tolist(), first)], steps)
    return packed_chain_forward(params, cfg, embed, packed, aux[: tokens.shape[0] - 1], steps)


@dataclass
class DraftSession:
    """The sequential form, as SGLang's worker runs it: one request, a KV cache by position.

    Use :meth:`extend` for rows coming from the target (prefill or after a verify)
    and :meth:`decode` for a draft step. ``truncate(n)`` drops cached rows at
    positions ``>= n`` (a rejected draft's rows, overwritten by SGLang later).
    """

    params: dict
    cfg: DraftConfig
    embed: torch.Tensor
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    def _run(self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> StepOut:
        import torch

        cfg = self.cfg
        q, k, v, res = qkv(self.params, cfg, self.embed[token_ids], project(self.params, cfg, hidden), positions)
        k, v = _expand_kv(k, cfg), _expand_kv(v, cfg)
        for i, p in enumerate(positions.tolist()):
            self.keys[p], self.values[p] = k[i], v[i]
        outs = []
        for i, p in enumerate(positions.tolist()):
            seen = sorted(x for x in self.keys if x <= p)
            K = torch.stack([self.keys[x] for x in seen])  # [S, heads, hd]
            V = torch.stack([self.values[x] for x in seen])
            w = (torch.einsum("hd,shd->hs", q[i], K) * cfg.softmax_scale).softmax(-1)
            outs.append(torch.einsum("hs,shd->hd", w, V).reshape(-1))
        return finish(self.params, cfg, torch.stack(outs), res)

    def extend(self, token_ids: torch.Tensor, aux: torch.Tensor, start: int) -> StepOut:
        """Rows from the target: ids ``[n]`` (already shifted), aux ``[n, K*Ht]``, positions ``start..``."""
        import torch

        return self._run(token_ids, aux, torch.arange(start, start + token_ids.shape[0]))

    def decode(self, token_id: int, hidden: torch.Tensor, position: int) -> StepOut:
        """One draft step: token ``[1]``, the previous step's prenorm ``[1, H]``."""
        import torch

        return self._run(torch.tensor([token_id]), hidden, torch.tensor([position]))

    def truncate(self, n: int) -> None:
        for p in [p for p in self.keys if p >= n]:
            del self.keys[p], self.values[p]
