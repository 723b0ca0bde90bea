"""The plain-torch stand-ins for the Qwen2-MoE and MiniMax-M2 triton kernels
(``worker/cpu/family_kernels.py``) against the kernels' definitions."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from pytest_eagle3.worker.cpu import family_kernels  # noqa: E402


def test_gate_sigmoid_mul_adds_in_place_or_returns_a_new_tensor():
    g = torch.Generator().manual_seed(0)
    h, w, s, f = (torch.randn(5, 16, generator=g), torch.randn(16, generator=g), torch.randn(5, 16, generator=g),
                  torch.randn(5, 16, generator=g))
    expected = torch.sigmoid(h @ w)[:, None] * s
    assert torch.allclose(family_kernels.gate_sigmoid_mul(h, w, s, None), expected, atol=1e-6)
    out = f.clone()
    ret = family_kernels.gate_sigmoid_mul(h, w, s, out)
    assert ret is out and torch.allclose(out, f + expected, atol=1e-6)


@pytest.mark.parametrize("tp_world", [1, 2])
def test_qk_rmsnorm_sum_of_squares_and_apply(tp_world: int):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(3, 32, generator=g), torch.randn(3, 8, generator=g)
    wq, wk = torch.rand(32, generator=g) + 0.5, torch.rand(8, generator=g) + 0.5
    sums = family_kernels.rms_sumsq(q, k)
    assert sums.shape == (8,) and sums.dtype == torch.float32  # 2B = 6 padded to 8
    assert torch.allclose(sums[:3], (q * q).sum(-1)) and torch.allclose(sums[3:6], (k * k).sum(-1))
    # tp_world ranks each hold 1/tp_world of the heads: the all-reduced sum is tp_world times this one
    qo, ko = family_kernels.rms_apply(q, k, wq, wk, sums * tp_world, tp_world, 1e-6)
    assert torch.allclose(qo, q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * wq, atol=1e-5)
    assert torch.allclose(ko, k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6) * wk, atol=1e-5)


def test_fills_replace_the_names_the_model_files_imported():
    if torch.cuda.is_available():
        pytest.skip("the stand-ins apply only where CUDA is absent")
    qwen = types.SimpleNamespace(__name__="sglang.srt.models.qwen2_moe", fused_gate_sigmoid_mul=None,
                                 fused_gate_sigmoid_mul_add=None)
    family_kernels.qwen2_moe_shared_gate(qwen)
    assert callable(qwen.fused_gate_sigmoid_mul) and callable(qwen.fused_gate_sigmoid_mul_add)
    minimax = types.SimpleNamespace(__name__="sglang.srt.models.minimax_m2", rms_sumsq_serial=None,
                                    rms_apply_serial=None)
    family_kernels.minimax_m2_qk_norm(minimax)
    assert callable(minimax.rms_sumsq_serial) and callable(minimax.rms_apply_serial)
    other = types.SimpleNamespace(__name__="sglang.srt.models.other")
    family_kernels.minimax_m2_qk_norm(other)  # a file without the kernel is left alone
    assert not hasattr(other, "rms_sumsq_serial")


def test_the_standin_serves_the_ops_qwen3_5_binds_at_import():
    """``srt/models/qwen3_5.py`` binds these ``torch.ops.sgl_kernel`` names at import on
    CPU (SGLang's Qwen-VL processors import it) and Qwen3.5's layers call: the sigmoid
    gate in place, the QK norms (with the output gate split off) and the delta-net's
    input split, in plain torch."""
    from pytest_eagle3.worker.cpu.shim.sgl_kernel import TORCH_OPS, fused_sigmoid_mul_cpu

    g = torch.Generator().manual_seed(2)
    x, gate = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    expected = x * torch.sigmoid(gate)
    assert fused_sigmoid_mul_cpu(x, gate) is None and torch.allclose(x, expected, atol=1e-6)
    assert TORCH_OPS["fused_sigmoid_mul_cpu"] is fused_sigmoid_mul_cpu
    # the QK norm with the gate: [q_h0, gate_h0, q_h1, gate_h1] per token, Gemma's (1 + w)
    T, H, KV, D = 3, 2, 1, 4
    qg, k = torch.randn(T, H * 2 * D, generator=g), torch.randn(T, KV * D, generator=g)
    wq, wk = torch.randn(D, generator=g), torch.randn(D, generator=g)
    q_out, k_out, gate = TORCH_OPS["fused_qk_gemma_rmsnorm_with_gate_cpu"](qg, k, wq, wk, 1e-6, D, H)
    heads = qg.view(T, H, 2 * D)
    norm = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)  # noqa: E731
    assert torch.allclose(q_out, norm(heads[..., :D].reshape(-1, D), wq), atol=1e-6)
    assert torch.allclose(k_out, norm(k.view(-1, D), wk), atol=1e-6)
    assert torch.equal(gate, heads[..., D:].reshape(-1, D))
    q_only, k_only = TORCH_OPS["fused_qk_gemma_rmsnorm_cpu"](heads[..., :D].reshape(T, -1), k, wq, wk, 1e-6, D)
    assert torch.allclose(q_only, q_out) and torch.allclose(k_only, k_out)
    # the delta-net's input split: [all q | all k | all v | all z] and [all b | all a]
    qkvz, ba = torch.randn(T, 2 * 8 + 2 * 12, generator=g), torch.randn(T, 6, generator=g)
    mixed, z, b, a = TORCH_OPS["fused_qkvzba_split_reshape_cat_contiguous_cpu"](qkvz, ba, 2, 3, 4, 4)
    assert torch.equal(mixed, qkvz[:, :28]) and torch.equal(z, qkvz[:, 28:].view(T, 3, 4))
    assert torch.equal(b, ba[:, :3]) and torch.equal(a, ba[:, 3:])
