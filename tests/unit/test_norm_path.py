"""The in-place norm path: the installed layernorm.py read, the stand-in kernels' contract, the proof.

Stand-in kernels are checked against SGLang's own ``forward_native`` of the
same norm class where SGLang is installed (the in-place contract: which
tensors each op overwrites, what it returns).
"""

from __future__ import annotations

import inspect

import pytest

from pytest_eagle3.sglang_source.fusion_code import fusion_code_at, read_fusion_code
from pytest_eagle3.sglang_source.norm_code import (
    INPLACE, NATIVE, STANDIN_ARITY, norm_code_at, read_norm_code, resolve_norm_path,
)
from pytest_eagle3.engine.standin_proof import PATHS, configured, not_taken, ops_called

NORM_PROOF, FUSION_PROOF, SBO_PROOF, TBO_PROOF, OVERLAP_PROOF = PATHS

@pytest.fixture(scope="module")
def sglang_location():
    """The installed SGLang package directory (skips where none is installed)."""
    from pytest_eagle3.sglang_source.install import sglang_location_and_version

    location, _version = sglang_location_and_version()
    if location is None:
        pytest.skip("SGLang is not installed")
    return location


LAYERNORM_SRC = '''
import torch
_is_cpu_amx_available = cpu_has_amx_support()

class RMSNorm:
    def forward_cpu(self, x, residual=None):
        if _is_cpu_amx_available:
            if residual is not None:
                torch.ops.sgl_kernel.fused_add_rmsnorm_cpu(x, residual, self.weight.data, self.variance_epsilon)
                return x, residual
            return torch.ops.sgl_kernel.rmsnorm_cpu(x, self.weight.data, self.variance_epsilon)
        return self.forward_native(x, residual)
'''


def test_reads_the_gated_kernel_calls():
    code = read_norm_code(LAYERNORM_SRC)
    assert code.refusal is None and code.gate_line == 3
    assert [(c.cls, c.op, c.nargs) for c in code.calls] == [
        ("RMSNorm", "fused_add_rmsnorm_cpu", 4), ("RMSNorm", "rmsnorm_cpu", 3)]
    path, why = resolve_norm_path("auto", code)
    assert path == INPLACE and "layernorm.py:9" in why and "_is_cpu_amx_available (srt/layers/layernorm.py:3)" in why
    assert resolve_norm_path(NATIVE, code)[0] == NATIVE


@pytest.mark.parametrize("src, fragment", [
    (None, "has no srt/layers/layernorm.py"),
    (LAYERNORM_SRC.replace("_is_cpu_amx_available = cpu_has_amx_support()", "X = 1"), "no module global"),
    (LAYERNORM_SRC.replace("if _is_cpu_amx_available:", "if False:"), "has no branch on _is_cpu_amx_available"),
    (LAYERNORM_SRC.replace("self.weight.data, self.variance_epsilon)\n                return x",
                           "self.weight.data, self.variance_epsilon, None)\n                return x"),
     "passes 5 arguments to sgl_kernel.fused_add_rmsnorm_cpu; the stand-in takes 4"),
    (LAYERNORM_SRC.replace("rmsnorm_cpu(x, self.weight.data, self.variance_epsilon)\n        return self",
                           "fancy_norm_cpu(x)\n        return self"), "sgl_kernel.fancy_norm_cpu, which"),
    ("def broken(:", "does not parse"),
])
def test_a_fork_whose_norm_code_differs_gets_one_line_and_the_native_path(src, fragment):
    code = read_norm_code(src)
    assert code.refusal is not None and fragment in code.refusal, code.refusal
    assert "\n" not in code.refusal
    path, why = resolve_norm_path("inplace", code)
    assert path == NATIVE and fragment in why


def test_the_installed_sglang_has_the_branch(sglang_location):
    code = norm_code_at(sglang_location)
    assert code.refusal is None, code.refusal
    assert {c.op for c in code.calls} <= set(STANDIN_ARITY)


DISPATCH_SRC = '''
def _platform_key():
    if is_cpu() and cpu_has_amx_support():
        return "cpu"
    return "native"

class BaseFusedOp:
    def _resolve_forward_method(self):
        return getattr(self, "forward_" + _platform_key())
'''


def test_a_fork_that_dispatches_its_norms_otherwise_gets_the_native_path():
    assert read_norm_code(LAYERNORM_SRC, dispatch_text=DISPATCH_SRC).refusal is None
    for dispatch in (None, DISPATCH_SRC.replace("cpu_has_amx_support()", "False"),
                     DISPATCH_SRC.replace("_resolve_forward_method", "_pick")):
        code = read_norm_code(LAYERNORM_SRC, dispatch_text=dispatch)
        assert code.refusal is not None and "kernels/fused_op.py" in code.refusal, code.refusal
        assert resolve_norm_path("auto", code)[0] == NATIVE


def test_the_proof_needs_every_tp_rank():
    line = "[x] pytest-eagle3 norm stand-in: sgl_kernel.fused_add_rmsnorm_cpu called (pid {pid}, input [3, 8] f)\n"
    one = line.format(pid=11)
    assert ops_called(one + line.format(pid=12), NORM_PROOF) == {"fused_add_rmsnorm_cpu": {11, 12}}
    assert not_taken(one + line.format(pid=12), NORM_PROOF, tp=2) is None
    assert "only 1 of 2 TP ranks" in not_taken(one, NORM_PROOF, tp=2)
    assert "no process called" in not_taken("nothing here", NORM_PROOF, tp=1)
    # the fusion path's proof is its own line: norm stand-in calls do not prove it
    assert "no process called" in not_taken(one + line.format(pid=12), FUSION_PROOF, tp=2)
    fused = "pytest-eagle3 all-reduce fusion stand-in: flashinfer_allreduce_residual_rmsnorm called (pid {pid}, x)\n"
    assert not_taken(fused.format(pid=1) + fused.format(pid=2), FUSION_PROOF, tp=2) is None


def test_configured_paths_come_from_the_engine_env():
    assert configured({}) == []
    assert configured({NORM_PROOF.env[0]: "native"}) == []
    assert configured({NORM_PROOF.env[0]: "inplace", FUSION_PROOF.env[0]: "1"}) == [NORM_PROOF, FUSION_PROOF]
    # single-batch overlap's stand-in is selected by a cpu engine's server argument, not the env
    assert configured({"enable_single_batch_overlap": "True"}) == []
    assert configured({}, {"enable_single_batch_overlap": True}) == [SBO_PROOF]
    # DeepEP's combine sums the MoE output: nothing left for the fusion stand-in to fuse.
    assert configured({FUSION_PROOF.env[0]: "1"}, {"enable_two_batch_overlap": True, "moe_a2a_backend": "deepep"}) == [
        TBO_PROOF]
    # SGLang's fusion gate is false under DP attention (a self-test control mixes both).
    assert configured({FUSION_PROOF.env[0]: "1"}, {"attn_dp_size": 2}) == []
    assert configured({FUSION_PROOF.env[0]: "1"}, {"enable_dp_attention": True, "dp_size": 2}) == []
    assert configured({FUSION_PROOF.env[0]: "1"}, {"attn_dp_size": 1}) == [FUSION_PROOF]
    called = "pytest-eagle3 SBO stand-in: alt_stream.wait_stream called (pid {pid})\n"
    assert not_taken(called.format(pid=1), SBO_PROOF, tp=2).startswith("only 1 of 2 TP ranks")
    assert not_taken(called.format(pid=1) + called.format(pid=2), SBO_PROOF, tp=2) is None


GATE_SRC = '''
def flashinfer_ar_fusion_applies(x):
    return (_is_sm90_supported or _is_sm100_supported) and _is_flashinfer_available and (
        get_exec().comm.flashinfer_allreduce_fusion_backend is not None)

def other():
    pass
'''
OP_SRC = "import torch\n\ndef flashinfer_allreduce_residual_rmsnorm(input_tensor, residual, weight):\n    pass\n"


def test_reads_the_fusion_gate():
    code = read_fusion_code(GATE_SRC, OP_SRC)
    assert code.refusal is None
    assert code.gate.endswith("add_norm.py:2") and code.op.endswith("flashinfer_comm_fusion.py:3")
    assert "add_norm.py:2" in code.describe()


@pytest.mark.parametrize("gate, op, fragment", [
    (None, OP_SRC, "has no flashinfer_ar_fusion_applies"),
    (GATE_SRC, None, "has no flashinfer_allreduce_residual_rmsnorm"),
    (GATE_SRC.replace("_is_flashinfer_available", "True"), OP_SRC, "does not read _is_flashinfer_available"),
])
def test_a_fork_without_the_fusion_gate_gets_one_line(gate, op, fragment):
    code = read_fusion_code(gate, op)
    assert code.refusal is not None and fragment in code.refusal and "\n" not in code.refusal
    assert code.describe().startswith("not available on this SGLang")


def test_the_installed_sglang_has_the_fusion_gate(sglang_location):
    code = fusion_code_at(sglang_location)
    assert code.refusal is None, code.refusal


# --- the stand-in kernels (need torch) --------------------------------------------------


@pytest.fixture(scope="module")
def norm_ops():
    pytest.importorskip("torch")
    from pytest_eagle3.worker.cpu.shim.sgl_kernel import _norm

    return _norm


def test_stand_in_arity_matches_the_table(norm_ops):
    assert set(norm_ops.NORM_OPS) == set(STANDIN_ARITY)
    for name, fn in norm_ops.NORM_OPS.items():
        assert len(inspect.signature(fn).parameters) == STANDIN_ARITY[name], name


def test_fused_add_overwrites_input_and_residual_and_returns_none(norm_ops):
    import torch

    g = torch.Generator().manual_seed(0)
    x, r, w = torch.randn(5, 16, generator=g), torch.randn(5, 16, generator=g), torch.rand(16, generator=g) + 0.5
    x0, r0 = x.clone(), r.clone()
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    assert norm_ops.fused_add_rmsnorm_cpu(x, r, w, 1e-6) is None
    total = x0 + r0
    assert x.data_ptr() == x_ptr and r.data_ptr() == r_ptr
    torch.testing.assert_close(r, total)
    torch.testing.assert_close(x, total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    y = x.clone()
    out = norm_ops.rmsnorm_cpu(y, w, 1e-6)
    assert out.data_ptr() != y.data_ptr() and torch.equal(y, x)


def test_gemma_variants_scale_by_one_plus_weight(norm_ops):
    import torch

    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    ref = lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)  # noqa: E731
    torch.testing.assert_close(norm_ops.gemma_rmsnorm_cpu(x, w, 1e-6), ref(x))
    torch.testing.assert_close(norm_ops.gemma3_rmsnorm_cpu(x.view(3, 2, 4)[..., :].reshape(3, 8), w, 1e-6), ref(x))
    xs, rs = x.clone(), r.clone()
    norm_ops.gemma_fused_add_rmsnorm_cpu(xs, rs, w, 1e-6)
    torch.testing.assert_close(rs, x + r)
    torch.testing.assert_close(xs, ref(x + r))
    torch.testing.assert_close(norm_ops.gemma4_rmsnorm_cpu(x, w, 1e-6, 1.0, True),
                               x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (w + 1.0))


def test_refuses_what_the_real_kernel_refuses(norm_ops):
    import torch

    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.ones(8)
    with pytest.raises(RuntimeError, match="not contiguous"):
        norm_ops.fused_add_rmsnorm_cpu(torch.randn(8, 4).t(), r, w, 1e-6)
    with pytest.raises(RuntimeError, match="2-D"):
        norm_ops.rmsnorm_cpu(x.view(2, 2, 8), w, 1e-6)
    with pytest.raises(RuntimeError, match="residual"):
        norm_ops.fused_add_rmsnorm_cpu(x, torch.randn(3, 8), w, 1e-6)


def test_first_call_is_logged_once(norm_ops, caplog):
    import torch

    norm_ops.CALLS.pop("layernorm_cpu", None)
    with caplog.at_level("WARNING", logger="pytest_eagle3.cpu.norm"):
        for _ in range(3):
            norm_ops.layernorm_cpu(torch.randn(2, 4), torch.ones(4), None, 1e-5)
    assert norm_ops.CALLS["layernorm_cpu"] == 3
    lines = [r.getMessage() for r in caplog.records if "layernorm_cpu called" in r.getMessage()]
    assert len(lines) == 1 and ops_called(lines[0], NORM_PROOF) == {"layernorm_cpu": {__import__("os").getpid()}}


def test_stand_ins_agree_with_sglangs_forward_native(norm_ops, sglang_location):
    """SGLang's RMSNorm.forward_native (out of place) and the in-place stand-in give one result."""
    import torch

    layernorm = pytest.importorskip("sglang.srt.layers.layernorm")
    norm = layernorm.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(16) + 0.5)
    x, r = torch.randn(6, 16), torch.randn(6, 16)
    want_x, want_r = norm.forward_native(x.clone(), r.clone())
    xi, ri = x.clone(), r.clone()
    norm_ops.fused_add_rmsnorm_cpu(xi, ri, norm.weight.data, norm.variance_epsilon)
    torch.testing.assert_close(xi, want_x)
    torch.testing.assert_close(ri, want_r)
