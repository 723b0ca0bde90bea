"""The stand-in ``sgl_kernel.mamba`` (gated delta-net ops SGLang calls on CPU)
against transformers' own torch implementation of Qwen3-Next's delta-net, and
the contracts SGLang relies on: state carried between prefill chunks and into
decode, padding slots, verify's per-step snapshots without a state write."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from pytest_eagle3.worker.cpu.shim.sgl_kernel import TORCH_OPS  # noqa: E402
from pytest_eagle3.worker.cpu.shim.sgl_kernel import mamba  # noqa: E402

T, H, HV, K, V, DIM, W = 9, 2, 4, 16, 8, 6, 4


@pytest.fixture()
def inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"q": r(1, T, H, K), "k": r(1, T, H, K), "v": r(1, T, HV, V), "a": r(T, HV), "b": r(T, HV),
            "A_log": r(HV), "dt_bias": r(HV), "x": r(T, DIM), "w": r(DIM, W), "bias": r(DIM)}


def _reference(i: dict) -> tuple:
    """transformers' recurrent delta rule over the whole sequence (state ``[1, HV, K, V]``)."""
    g, beta = mamba.gdn_gating(i["A_log"], i["a"], i["b"], i["dt_bias"])
    group = HV // H
    return qwen3_next.torch_recurrent_gated_delta_rule(
        i["q"].repeat_interleave(group, dim=2), i["k"].repeat_interleave(group, dim=2), i["v"], g, beta,
        initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)


def test_gating_matches_the_delta_net_formula(inputs):
    g, beta = mamba.gdn_gating(inputs["A_log"], inputs["a"], inputs["b"], inputs["dt_bias"])
    assert g.shape == beta.shape == (1, T, HV) and g.dtype == torch.float32
    expected = -inputs["A_log"].exp() * F.softplus(inputs["a"] + inputs["dt_bias"])
    assert torch.allclose(g[0], expected) and torch.allclose(beta[0], inputs["b"].sigmoid())


def test_prefill_chunks_then_decode_equal_one_pass(inputs):
    """Prefill in two chunks, then decode token by token, carried in a slot of the
    ``[slots, HV, V, K]`` pool: the outputs and final state of one recurrent pass."""
    ref_out, ref_state = _reference(inputs)
    g, beta = mamba.gdn_gating(inputs["A_log"], inputs["a"], inputs["b"], inputs["dt_bias"])
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    pool = torch.zeros(3, HV, V, K)
    slot = torch.tensor([1])
    outs = []
    for lo, hi in ((0, 4), (4, 7)):
        o, final, _ = mamba.chunk_gated_delta_rule_cpu(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi],
                                                      beta[:, lo:hi], pool, torch.tensor([0, hi - lo]), False,
                                                      True, slot)
        outs.append(o)
    for t in range(7, T):
        outs.append(mamba.fused_sigmoid_gating_delta_rule_update_cpu(
            inputs["A_log"], inputs["dt_bias"], q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], inputs["a"][t:t + 1],
            inputs["b"][t:t + 1], pool, slot, torch.tensor([0, 1]), True))
    assert torch.allclose(torch.cat(outs, dim=1), ref_out, atol=1e-5)
    assert torch.allclose(pool[1], ref_state[0].transpose(-1, -2), atol=1e-5)  # [HV, V, K]
    assert pool[0].abs().sum() == 0 and pool[2].abs().sum() == 0  # other slots untouched


def test_two_sequences_in_one_call_and_a_padding_slot(inputs):
    g, beta = mamba.gdn_gating(inputs["A_log"], inputs["a"], inputs["b"], inputs["dt_bias"])
    pool = torch.zeros(2, HV, V, K)
    cu = torch.tensor([0, 4, T])
    out, _, _ = mamba.chunk_gated_delta_rule_cpu(inputs["q"], inputs["k"], inputs["v"], g, beta, pool, cu,
                                                 False, True, torch.tensor([1, -1]))
    first = dict(inputs, q=inputs["q"][:, :4], k=inputs["k"][:, :4], v=inputs["v"][:, :4], a=inputs["a"][:4],
                 b=inputs["b"][:4])
    assert torch.allclose(out[:, :4], _reference(first)[0], atol=1e-5)
    assert pool[0].abs().sum() == 0  # slot -1 is padding: nothing written anywhere


def test_verify_snapshots_each_step_and_leaves_the_state(inputs):
    pool = torch.randn(2, HV, V, K, generator=torch.Generator().manual_seed(3))
    before = pool.clone()
    steps = torch.zeros(2, 3, HV, V, K)
    sl = slice(0, 3)
    mamba.fused_sigmoid_gating_delta_rule_update_cpu(
        inputs["A_log"], inputs["dt_bias"], inputs["q"][:, sl], inputs["k"][:, sl], inputs["v"][:, sl],
        inputs["a"][sl], inputs["b"][sl], pool, torch.tensor([0]), torch.tensor([0, 3]), True,
        disable_state_update=True, intermediate_states_buffer=steps, intermediate_state_indices=torch.tensor([1]))
    assert torch.equal(pool, before)
    assert steps[1].abs().sum() > 0 and steps[0].abs().sum() == 0
    # the last snapshot is the state a decode of the same three tokens leaves
    mamba.fused_sigmoid_gating_delta_rule_update_cpu(
        inputs["A_log"], inputs["dt_bias"], inputs["q"][:, sl], inputs["k"][:, sl], inputs["v"][:, sl],
        inputs["a"][sl], inputs["b"][sl], pool, torch.tensor([0]), torch.tensor([0, 3]), True)
    assert torch.allclose(steps[1, 2], pool[0], atol=1e-6)


def test_conv_chunks_and_updates_equal_one_causal_conv(inputs):
    x, w, bias = inputs["x"], inputs["w"], inputs["bias"]
    full = F.silu(F.conv1d(x.t()[None], w[:, None, :], bias, padding=W - 1, groups=DIM)[0, :, :T])
    states = torch.zeros(2, DIM, W - 1)
    y1 = mamba.causal_conv1d_fn_cpu(x[:3].t(), w, bias, "silu", states, torch.tensor([False]), torch.tensor([1]),
                                    torch.tensor([0, 3]), [3])
    y2 = mamba.causal_conv1d_fn_cpu(x[3:6].t(), w, bias, "silu", states, torch.tensor([True]), torch.tensor([1]),
                                    torch.tensor([0, 3]), [3])
    window = torch.zeros(2, 3, DIM, W - 1)
    y3 = mamba.causal_conv1d_update_cpu(x[6:9].t()[None], states, w, bias, "silu", torch.tensor([1]),
                                        intermediate_conv_window=window, intermediate_state_indices=torch.tensor([0]))
    assert torch.allclose(torch.cat([y1, y2, y3[0]], dim=1), full, atol=1e-5)
    assert torch.equal(states[1], x[6:9].t())  # the slot keeps the last W-1 inputs
    assert torch.equal(window[0, 0], torch.cat([x[4:6], x[6:7]]).t())  # the window after verify step 0
    assert states[0].abs().sum() == 0


def test_gated_norm_and_the_torch_ops_names():
    g = torch.Generator().manual_seed(4)
    x, z, w = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g), torch.rand(8, generator=g)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * F.silu(z)
    assert torch.allclose(mamba.fused_rmsnorm_gated_cpu(x, w, z, 1e-6), expected, atol=1e-6)
    for name in ("fused_gdn_gating_cpu", "fused_sigmoid_gating_delta_rule_update_cpu", "fused_rmsnorm_gated_cpu"):
        # the stand-in may also be imported as top-level ``sgl_kernel`` (another module object)
        installed = getattr(torch.ops.sgl_kernel, name)
        assert installed.__module__.endswith("sgl_kernel.mamba")
        assert installed.__qualname__ == TORCH_OPS[name].__qualname__


def test_each_standin_op_logs_its_proof_line_once_per_process(caplog):
    from pytest_eagle3.worker.cpu.shim.sgl_kernel import _said

    with caplog.at_level("WARNING", logger="pytest_eagle3.cpu"):
        _said.said("an_op_nobody_calls_cpu", "gated delta-net")
        _said.said("an_op_nobody_calls_cpu", "gated delta-net")
    lines = [r.getMessage() for r in caplog.records if "an_op_nobody_calls_cpu" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("pytest-eagle3 CPU stand-in: sgl_kernel an_op_nobody_calls_cpu (gated delta-net)")
