"""Plain-torch stand-ins for the sgl-kernel CPU ops Qwen3.5's model file binds on CPU.

SGLang 0.5.23 ``srt/models/qwen3_5.py:283-297`` binds, under ``is_cpu()``,
``torch.ops.sgl_kernel.<name>`` for its attention's QK norm (and output gate)
and its delta-net's input split; HIP and XPU run the triton kernels of the
same names, whose contracts these follow (``srt/models/utils.py``
``fused_qk_gemma_rmsnorm`` and ``fused_qk_gemma_rmsnorm_with_gate``,
``kernels/ops/attention/triton_gdn_fused_proj.py``
``fused_qkvzba_split_reshape_cat_contiguous``):

* ``fused_qk_gemma_rmsnorm_cpu(q [T, H*D], k [T, KV*D], wq [D], wk [D], eps, D)
  -> (q_out [T*H, D], k_out [T*KV, D])``: each head ``x * rsqrt(mean(x**2) +
  eps) * (1 + w)``, new contiguous tensors;
* ``fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate [T, H*2D], k, wq, wk, eps, D, H)
  -> (q_out [T*H, D], k_out [T*KV, D], gate_out [T*H, D])``: ``q_gate`` holds
  each head's query then its gate (``[q_h0, gate_h0, q_h1, ...]``); the
  queries and keys normed as above, the gates copied;
* ``fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz [T, 2K+2V], ba [T, 2HV],
  heads_qk, heads_v, head_qk, head_v) -> (mixed_qkv [T, 2K+V], z [T, HV, Dv],
  b [T, HV], a [T, HV])``: ``qkvz`` is ``[all q | all k | all v | all z]``,
  ``ba`` is ``[all b | all a]``.

One deviation, as for the norm stand-ins: the triton kernels store their
normed outputs in bfloat16 or float16; these keep the input's dtype, float32
on the CPU tier.  The first call of each op in a process logs :data:`._said.LINE`.
"""

from __future__ import annotations

import torch

from ._said import said


def _said(op: str) -> None:
    said(op, "Qwen3.5")


def _gemma_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)


def fused_qk_gemma_rmsnorm_cpu(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                               eps: float, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    _said("fused_qk_gemma_rmsnorm_cpu")
    return (_gemma_norm(q.reshape(-1, head_dim), q_weight, eps).contiguous(),
            _gemma_norm(k.reshape(-1, head_dim), k_weight, eps).contiguous())


def fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                                         k_weight: torch.Tensor, eps: float, head_dim: int,
                                         num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _said("fused_qk_gemma_rmsnorm_with_gate_cpu")
    per_head = q_gate.reshape(q_gate.shape[0], num_heads, 2 * head_dim)
    q = per_head[..., :head_dim].reshape(-1, head_dim)
    gate = per_head[..., head_dim:].reshape(-1, head_dim).contiguous()
    q_out, k_out = fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim)
    return q_out, k_out, gate


def fused_qkvzba_split_reshape_cat_contiguous_cpu(
        mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, num_heads_qk: int, num_heads_v: int, head_qk: int,
        head_v: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _said("fused_qkvzba_split_reshape_cat_contiguous_cpu")
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    rows = mixed_qkvz.shape[0]
    mixed_qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim:qkv_dim + num_heads_v * head_v].reshape(rows, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v:2 * num_heads_v].contiguous()
    return mixed_qkv, z, b, a


TORCH_OPS = {
    "fused_qk_gemma_rmsnorm_cpu": fused_qk_gemma_rmsnorm_cpu,
    "fused_qk_gemma_rmsnorm_with_gate_cpu": fused_qk_gemma_rmsnorm_with_gate_cpu,
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": fused_qkvzba_split_reshape_cat_contiguous_cpu,
}
