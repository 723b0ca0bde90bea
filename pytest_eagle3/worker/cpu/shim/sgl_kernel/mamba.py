"""Plain-torch stand-ins for sgl-kernel's CPU gated delta-net (GDN) ops, with their contracts.

SGLang 0.5.23 runs the linear-attention layers of Qwen3-Next and Qwen3.5 on
CPU through ``sgl_kernel.mamba`` (``causal_conv1d_fn_cpu``,
``causal_conv1d_update_cpu``, ``chunk_gated_delta_rule_cpu``, imported by
``srt/layers/attention/linear/gdn_backend.py:183-188`` and
``linear/kernels/gdn_triton.py:27-32``) and two ops it reaches as
``torch.ops.sgl_kernel.<name>``: ``fused_gdn_gating_cpu`` and
``fused_sigmoid_gating_delta_rule_update_cpu``.  The math and the state layout
are read from SGLang's own triton kernels, which the CUDA tier runs:

* gating (``kernels/ops/attention/linear/fused_gdn_gating.py``):
  ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus linear above 20),
  ``beta = sigmoid(b)``, both ``[1, T, HV]`` float32;
* the delta rule per value head (``fused_sigmoid_gating_recurrent.py``): with
  ``q, k`` L2-normalised (``x * rsqrt(sum(x**2) + 1e-6)``) and ``q`` scaled by
  ``K**-0.5``, per token ``S <- S * exp(g)``, ``u = (v - S k) * beta``,
  ``S <- S + u k^T``, ``o = S q``; the state is ``[HV, V, K]`` per slot of the
  pool (``temporal``, ``srt/configs/mamba_utils.py``), query/key head ``h``
  serves value heads ``h * HV/H .. (h+1) * HV/H - 1``; a slot index below 0
  is padding (zero state, nothing written);
* the causal depthwise conv (``kernels/ops/mamba/causal_conv1d_triton.py``):
  ``out_t = act(bias + sum_j w[:, j] x_{t-W+1+j})`` over the slot's last
  ``W-1`` inputs (``conv_states [slots, dim, W-1]``, oldest first) followed by
  the new ones; the slot then holds the last ``W-1`` inputs.  In verify each
  step's window is also written to ``intermediate_conv_window[slot, step]``.

All arithmetic is float32; outputs take the input's dtype.  Nothing here
touches the residual stream, a capture or a collective.  The first call of
each op in a process logs :data:`._said.LINE`, so the engine log proves the path ran.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ._said import said


def _said(op: str) -> None:
    said(op, "gated delta-net")


def gdn_gating(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
               beta: float = 1.0, threshold: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` of ``a, b [T, HV]``: both ``[1, T, HV]`` float32."""
    _said("fused_gdn_gating_cpu")
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float(), beta=beta, threshold=threshold)
    return g.unsqueeze(0), b.float().sigmoid().to(b.dtype).float().unsqueeze(0)


def _normed(x: torch.Tensor, on: bool) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6) if on else x


def _run_sequence(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  g: torch.Tensor, beta: torch.Tensor, l2norm: bool,
                  steps_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: ``state [HV, V, K]``, ``q, k [T, H, K]``, ``v [T, HV, V]``,
    ``g, beta [T, HV]``; returns ``(o [T, HV, V] float32, final state)``; the
    state after step ``t`` goes to ``steps_out[t]`` when given."""
    hv = v.shape[1]
    group = hv // q.shape[1]
    q = _normed(q, l2norm).repeat_interleave(group, dim=1) * q.shape[-1] ** -0.5
    k = _normed(k, l2norm).repeat_interleave(group, dim=1)
    s = state.float().clone()
    out = torch.empty(v.shape, dtype=torch.float32)
    for t in range(v.shape[0]):
        s = s * g[t].float().exp()[:, None, None]
        u = (v[t].float() - torch.einsum("hvk,hk->hv", s, k[t])) * beta[t].float()[:, None]
        s = s + u[:, :, None] * k[t][:, None, :]
        out[t] = torch.einsum("hvk,hk->hv", s, q[t])
        if steps_out is not None:
            steps_out[t] = s.to(steps_out.dtype)
    return out, s


def _bounds(cu_seqlens: torch.Tensor | None, total: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, total)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(cu[:-1], cu[1:]))


def chunk_gated_delta_rule_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, initial_state: torch.Tensor, cu_seqlens: torch.Tensor,
                               head_first: bool = False, use_qk_l2norm_in_kernel: bool = True,
                               initial_state_indices: torch.Tensor | None = None,
                               **_: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
    """Prefill: ``q, k [1, T, H, K]``, ``v [1, T, HV, V]``, ``g, beta [1, T, HV]``,
    sequences split at ``cu_seqlens``; ``initial_state`` is the pool
    ``[slots, HV, V, K]``, read and overwritten in place at
    ``initial_state_indices``.  Returns ``(o [1, T, HV, V], final states
    [N, HV, V, K], None)``."""
    _said("chunk_gated_delta_rule_cpu")
    if head_first:
        raise NotImplementedError("pytest-eagle3's stand-in chunk_gated_delta_rule_cpu takes head_first=False only")
    out = torch.empty(v.shape, dtype=v.dtype)
    finals = []
    for n, (lo, hi) in enumerate(_bounds(cu_seqlens, v.shape[1])):
        idx = int(initial_state_indices[n]) if initial_state_indices is not None else n
        init = initial_state[idx] if idx >= 0 else torch.zeros_like(initial_state[0])
        o, s = _run_sequence(init, q[0, lo:hi], k[0, lo:hi], v[0, lo:hi], g[0, lo:hi], beta[0, lo:hi],
                             use_qk_l2norm_in_kernel)
        out[0, lo:hi] = o.to(out.dtype)
        if idx >= 0:
            initial_state[idx] = s.to(initial_state.dtype)
        finals.append(s.to(initial_state.dtype))
    return out, torch.stack(finals) if finals else initial_state[:0], None


def fused_sigmoid_gating_delta_rule_update_cpu(
        A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        a: torch.Tensor, b: torch.Tensor, initial_state_source: torch.Tensor,
        initial_state_indices: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
        use_qk_l2norm_in_kernel: bool = False, softplus_beta: float = 1.0, softplus_threshold: float = 20.0,
        is_kda: bool = False, disable_state_update: bool = False,
        intermediate_states_buffer: torch.Tensor | None = None,
        intermediate_state_indices: torch.Tensor | None = None, cache_steps: int | None = None,
        retrieve_parent_token: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
    """Decode and verify: the gating and the delta rule in one, ``q, k [1, T, H, K]``,
    ``v [1, T, HV, V]``, ``a, b [T, HV]``; returns ``o [1, T, HV, V]``.  The
    state pool is written back unless ``disable_state_update`` (verify); in
    verify the state after step ``t`` of sequence ``n`` goes to
    ``intermediate_states_buffer[intermediate_state_indices[n], t]``."""
    _said("fused_sigmoid_gating_delta_rule_update_cpu")
    if is_kda:
        raise NotImplementedError("pytest-eagle3's stand-in runs the GDN delta rule, not KDA")
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float(), beta=softplus_beta,
                                          threshold=softplus_threshold)
    beta = b.float().sigmoid()
    out = torch.empty(v.shape, dtype=v.dtype)
    for n, (lo, hi) in enumerate(_bounds(cu_seqlens, v.shape[1])):
        idx = int(initial_state_indices[n])
        init = initial_state_source[idx] if idx >= 0 else torch.zeros_like(initial_state_source[0])
        steps = None
        if intermediate_states_buffer is not None and intermediate_state_indices is not None:
            slot = int(intermediate_state_indices[n])
            steps = intermediate_states_buffer[slot] if slot >= 0 else None
        o, s = _run_sequence(init, q[0, lo:hi], k[0, lo:hi], v[0, lo:hi], g[lo:hi], beta[lo:hi],
                             use_qk_l2norm_in_kernel, steps)
        out[0, lo:hi] = o.to(out.dtype)
        if idx >= 0 and not disable_state_update:
            initial_state_source[idx] = s.to(initial_state_source.dtype)
    return out


def _conv(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """``window [dim, W-1 + T]`` -> ``[dim, T]``: the depthwise causal conv."""
    width = weight.shape[1]
    cols = window.float().unfold(1, width, 1)  # [dim, T, W]
    out = (cols * weight.float()[:, None, :]).sum(-1)
    if bias is not None:
        out = out + bias.float()[:, None]
    return F.silu(out) if silu else out


def causal_conv1d_fn_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         activation: str | None = None, conv_states: torch.Tensor | None = None,
                         has_initial_state: torch.Tensor | None = None,
                         cache_indices: torch.Tensor | None = None,
                         query_start_loc: torch.Tensor | None = None, seq_lens_cpu: Any = None,
                         **_: Any) -> torch.Tensor:
    """Prefill conv: ``x [dim, T]`` (sequences split at ``query_start_loc``),
    ``weight [dim, W]``; each sequence starts from its slot's ``W-1`` inputs
    where ``has_initial_state`` (else zeros) and leaves its last ``W-1`` there.
    Returns ``[dim, T]`` in ``x``'s dtype."""
    _said("causal_conv1d_fn_cpu")
    width = weight.shape[1]
    out = torch.empty(x.shape, dtype=x.dtype)
    for n, (lo, hi) in enumerate(_bounds(query_start_loc, x.shape[1])):
        idx = int(cache_indices[n]) if cache_indices is not None else n
        prior = torch.zeros(x.shape[0], width - 1, dtype=torch.float32)
        if idx >= 0 and has_initial_state is not None and bool(has_initial_state[n]):
            prior = conv_states[idx].float()
        window = torch.cat([prior, x[:, lo:hi].float()], dim=1)
        out[:, lo:hi] = _conv(window, weight, bias, activation in ("silu", "swish", True)).to(x.dtype)
        if idx >= 0 and conv_states is not None:
            conv_states[idx] = window[:, -(width - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(x: torch.Tensor, conv_states: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None = None, activation: str | None = None,
                             conv_state_indices: torch.Tensor | None = None,
                             intermediate_conv_window: torch.Tensor | None = None,
                             intermediate_state_indices: torch.Tensor | None = None,
                             **_: Any) -> torch.Tensor:
    """Decode and verify conv: ``x [B, dim]`` or ``[B, dim, T]``; each row slides
    its slot's window over its ``T`` new inputs (the slot keeps the last
    ``W-1``); in verify the window after step ``t`` also goes to
    ``intermediate_conv_window[intermediate_state_indices[b], t]``.  Returns
    ``x``'s shape and dtype."""
    _said("causal_conv1d_update_cpu")
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    width = weight.shape[1]
    out = torch.empty(xs.shape, dtype=x.dtype)
    silu = activation in ("silu", "swish", True)
    for row in range(xs.shape[0]):
        idx = int(conv_state_indices[row]) if conv_state_indices is not None else row
        prior = conv_states[idx].float() if idx >= 0 else torch.zeros(xs.shape[1], width - 1)
        window = torch.cat([prior, xs[row].float()], dim=1)
        out[row] = _conv(window, weight, bias, silu).to(x.dtype)
        if idx >= 0:
            conv_states[idx] = window[:, -(width - 1):].to(conv_states.dtype)
        if intermediate_conv_window is not None and intermediate_state_indices is not None:
            slot = int(intermediate_state_indices[row])
            if slot >= 0:
                for t in range(xs.shape[2]):
                    intermediate_conv_window[slot, t] = window[:, t + 1:t + width].to(intermediate_conv_window.dtype)
    return out.squeeze(-1) if squeeze else out


def fused_rmsnorm_gated_cpu(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """The delta-net's gated output norm (``FusedRMSNormGated``, activation silu, norm
    before the gate): ``x * rsqrt(mean(x**2) + eps) * weight * silu(gate)`` over the
    last dimension, float32, returned as a new tensor of ``x``'s dtype."""
    _said("fused_rmsnorm_gated_cpu")
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y * F.silu(gate.float())).to(x.dtype)


#: ``torch.ops.sgl_kernel`` names (the rest are imported from this module).
TORCH_OPS = {
    "fused_gdn_gating_cpu": gdn_gating,
    "fused_sigmoid_gating_delta_rule_update_cpu": fused_sigmoid_gating_delta_rule_update_cpu,
    "fused_rmsnorm_gated_cpu": fused_rmsnorm_gated_cpu,
}
