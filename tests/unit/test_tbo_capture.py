"""Two-batch overlap through the DeepEP stand-in, without an engine: the stand-in's
all-to-all over two gloo ranks and its expert GEMMs (worker/cpu/deepep.py), the
``tbo-capture-per-microbatch`` fix's merge and its faults (worker/tbo_capture.py),
and the ``[tbo-uncaptured]`` explanation (engine/tbo_start.py).

On the real engine: ``tests/e2e/test_tbo.py``.
"""

from __future__ import annotations

import multiprocessing
import socket
import types

import pytest

from pytest_eagle3.engine import tbo_start
from pytest_eagle3.worker import tbo_capture, tbo_proof
from tests.unit.test_batch_overlap import LOCATION, _config, needs_tbo_file

HIDDEN, TOPK, EXPERTS, RANKS = 4, 2, 4, 2


def _tokens(rank: int):
    import torch

    gen = torch.Generator().manual_seed(rank)
    count = 3 + rank  # ranks with different token counts
    x = torch.randn(count, HIDDEN, generator=gen)
    idx = torch.randint(0, EXPERTS, (count, TOPK), generator=gen)
    idx[0, 1] = -1  # a slot with no expert
    return x, idx, torch.rand(count, TOPK, generator=gen)


def _expected(x, idx, w):
    """Expert ``e`` multiplies by ``e + 1``; slot ``-1`` adds nothing."""
    import torch

    scale = torch.where(idx >= 0, (idx + 1).float() * w, torch.zeros_like(w))
    return x * scale.sum(dim=1, keepdim=True)


def _rank(rank: int, port: int, out: multiprocessing.Queue) -> None:
    import torch
    import torch.distributed as dist

    from pytest_eagle3.worker.cpu.deepep import _standin_module

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    try:
        buffer = _standin_module().Buffer(dist.group.WORLD, low_latency_mode=True)
        x, idx, w = _tokens(rank)
        local = EXPERTS // RANKS
        # normal mode: rows carry local expert ids; the expert rank weights its experts' outputs
        _, _, per_expert, _, _ = buffer.get_dispatch_layout(idx, EXPERTS)
        recv_x, ids, weights, counts, handle, _ = buffer.dispatch(x, topk_idx=idx, topk_weights=w)
        scale = torch.where(ids >= 0, (ids + rank * local + 1).float() * weights, torch.zeros_like(weights))
        normal, _, _ = buffer.combine(recv_x * scale.sum(dim=1, keepdim=True), handle)
        # low-latency mode: rows per local expert; the token's own rank weights them
        packed, received, handle, _, _ = buffer.low_latency_dispatch(x, idx, 8, EXPERTS)
        outputs = packed * torch.arange(rank * local + 1, rank * local + local + 1).float()[:, None, None]
        low_latency, _, _ = buffer.low_latency_combine(outputs, idx, w, handle)
        out.put((rank, (normal - _expected(x, idx, w)).abs().max().item(),
                 (low_latency - _expected(x, idx, w)).abs().max().item(),
                 int(per_expert.sum()), sum(counts), int(received.sum())))
    finally:
        dist.destroy_process_group()


def test_the_deepep_standin_sends_each_token_to_its_experts_and_back() -> None:
    pytest.importorskip("torch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(RANKS)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    for rank, normal_err, ll_err, _, _, _ in results:
        assert normal_err < 1e-5 and ll_err < 1e-5, (rank, normal_err, ll_err)
    routed = sum(r[3] for r in results)  # every (token, slot) with an expert, counted on the token's rank
    assert routed == sum(r[5] for r in results)  # ... arrives at exactly one expert (low-latency)
    assert sum(r[4] for r in results) >= routed // TOPK  # normal mode: a row per (token, expert rank)


def test_the_expert_gemms_match_silu_and_mul_on_both_layouts() -> None:
    torch = pytest.importorskip("torch")
    deepep = pytest.importorskip("sglang.srt.layers.moe.token_dispatcher.deepep")
    from pytest_eagle3.worker.cpu import deepep as standin

    if torch.cuda.is_available():
        pytest.skip("a no-op where CUDA is available")

    class DeepEPMoE:
        quant_config = None
        w13_weight = torch.randn(2, 6, HIDDEN)  # 2 local experts, intermediate 3
        w2_weight = torch.randn(2, HIDDEN, 3)

        def run_moe_core(self, dispatch_output):
            raise NotImplementedError("SGLang's own: unquantized experts need DeepGEMM")

    module = types.SimpleNamespace(DeepEPMoE=DeepEPMoE)
    standin.expert_core(module)
    layer = DeepEPMoE()

    def mlp(e, x):
        gate, up = (x @ layer.w13_weight[e].t()).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ layer.w2_weight[e].t()

    x = torch.randn(3, HIDDEN)
    ids = torch.tensor([[0, 1], [1, -1], [-1, 0]])
    w = torch.rand(3, 2)
    normal = layer.run_moe_core(deepep.DeepEPNormalDispatchOutput(x, None, ids, w, [2, 2]))
    want = torch.stack([w[0, 0] * mlp(0, x[0]) + w[0, 1] * mlp(1, x[0]), w[1, 0] * mlp(1, x[1]),
                        w[2, 1] * mlp(0, x[2])])
    assert isinstance(normal, deepep.DeepEPNormalCombineInput)
    assert torch.allclose(normal.hidden_states, want, atol=1e-5)
    packed = torch.randn(2, 4, HIDDEN)
    ll = layer.run_moe_core(deepep.DeepEPLLDispatchOutput(packed, None, ids, w, torch.tensor([2, 1]), 2))
    assert torch.allclose(ll.hidden_states[0, :2], mlp(0, packed[0, :2]), atol=1e-5)
    assert torch.allclose(ll.hidden_states[1, :1], mlp(1, packed[1, :1]), atol=1e-5)
    assert not ll.hidden_states[1, 1:].any()  # rows past the expert's count stay empty
    with pytest.raises(NotImplementedError):  # any other layout keeps SGLang's own code
        layer.run_moe_core(object())


def test_the_merge_puts_each_micro_batch_at_its_token_range() -> None:
    torch = pytest.importorskip("torch")
    a = torch.full((3, 2), 1.0)  # 2 tokens padded to 3
    b = torch.full((3, 2), 2.0)
    parts = [(a, (0, 2)), (b, (2, 5))]
    assert tbo_capture.merge(parts, 5)[:, 0].tolist() == [1, 1, 2, 2, 2]
    assert tbo_capture.merge(parts, 5, "tbo-microbatch-dropped")[:, 0].tolist() == [1, 1, 0, 0, 0]
    assert tbo_capture.merge(parts, 5, "tbo-microbatches-swapped")[:, 0].tolist() == [2, 2, 2, 1, 1]
    assert tbo_capture.merge([(a[:0], (0, 0)), (b[:0], (0, 0))], 0).shape == (0, 2)  # an IDLE rank


DEATH = "RuntimeError: captured 1 of 3 aux hidden states (sglang/srt/layers/aux_hidden_states.py:87)"


@needs_tbo_file
def test_tbo_uncaptured_is_named_from_the_proof_and_the_packer() -> None:
    config = _config(enable_two_batch_overlap=True, moe_a2a_backend="deepep",
                     return_aux_hidden_state_layer_ids=[0, 3, 5])
    proof = tbo_proof.PROOF_LINE.format(mode="EXTEND", tokens=24, seq=1, a=12, b=12, first=1, last=7, pid=1)
    key, line = tbo_start.explain_start(config, DEATH, proof, str(LOCATION))
    assert line.startswith("[tbo-uncaptured] under two-batch overlap, layers from first_k_dense_replace=1 on")
    assert "ids 3 and 5 of [0, 3, 5] lie at or after layer 1" in line and "got 1 of 3 captures" in line
    assert "deepseek_v2.py:" in line and "PR #32680" in line and DEATH in line
    assert "EXTEND 24 tokens -> 12 + 12" in line and "tbo-capture-per-microbatch" in line
    assert key.startswith("[tbo-uncaptured]") and DEATH not in key
    assert tbo_start.explain_start(config, DEATH, "no proof line", str(LOCATION)) is None  # TBO never proven
    assert tbo_start.explain_start(config, "RuntimeError: x (y.py:1)", proof, str(LOCATION)) is None


def _captures(rows_of):
    """Reference ``[L+2, T, H]`` of 8 layers, and a capture of ids (0, 3, 5) whose slots 1 and 2
    have the rows ``rows_of(want)`` (slot 0, before the split, is right)."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(10, 4, HIDDEN, generator=gen)
    cap = torch.cat([ref[0], rows_of(ref[3]), rows_of(ref[5])], dim=-1)
    return cap, ref


def _diagnose(cap, ref, split):
    from pytest_eagle3.verdicts.compare import compare_slots
    from pytest_eagle3.verdicts.evidence import Evidence

    return compare_slots(cap, ref, expected=[0, 3, 5], num_layers=8, hidden_size=HIDDEN, tol=1e-4,
                         evidence=Evidence(tbo_split=split))


def test_a_lost_or_misplaced_micro_batch_is_named_from_its_rows() -> None:
    torch = pytest.importorskip("torch")
    dropped = lambda want: torch.cat([want[:2], torch.zeros_like(want[2:])])  # noqa: E731
    swapped = lambda want: torch.cat([want[2:], want[:2]])  # noqa: E731
    report = _diagnose(*_captures(dropped), split=1)
    assert report.kinds[0] == "tbo-microbatch-dropped", report.message().splitlines()
    line = next(x for x in report.message().splitlines() if "[tbo-microbatch-dropped]" in x)
    assert "slots 1, 2 (layers 3, 5: from first_k_dense_replace=1 on" in line and "rows 2..3 of 4" in line
    assert "slot 0 (before the split) is right" in line
    assert not any("[unreduced-embedding]" in x or "[zero-rows]" in x for x in report.message().splitlines())
    report = _diagnose(*_captures(swapped), split=1)
    assert report.kinds[0] == "tbo-microbatches-swapped", report.message().splitlines()
    # Without two-batch overlap the same rows are no TBO verdict.
    assert "tbo-microbatch-dropped" not in _diagnose(*_captures(dropped), split=None).kinds
    # A slot before the split that is wrong too: not the merge of the split layers.
    cap, ref = _captures(dropped)
    cap[:, :HIDDEN] = 0
    assert "tbo-microbatch-dropped" not in _diagnose(cap, ref, split=1).kinds


@needs_tbo_file
def test_tbo_uncaptured_names_an_empty_packer_too() -> None:
    config = _config(enable_two_batch_overlap=True, moe_a2a_backend="deepep")
    proof = tbo_proof.PROOF_LINE.format(mode="EXTEND", tokens=1, seq=0, a=0, b=1, first=1, last=7, pid=1)
    death = ("ValueError: not enough values to unpack (expected 2, got 1) "
             "(sglang/srt/models/deepseek_v2.py:3419)")
    key, line = tbo_start.explain_start(config, death, proof, str(LOCATION))
    assert "every asked-for layer lies at or after layer 1" in line and "packer got none" in line, line
    assert key.startswith("[tbo-uncaptured]")


def test_the_split_layer_is_first_k_dense_replace_only_where_tbo_splits() -> None:
    from types import SimpleNamespace

    from pytest_eagle3.suite.support import tbo_split

    on = {"enable_two_batch_overlap": True}
    assert tbo_split(on, SimpleNamespace(first_k_dense_replace=1)) == 1
    assert tbo_split(on, SimpleNamespace(first_k_dense_replace=0)) is None  # SGLang splits no layer then
    assert tbo_split({}, SimpleNamespace(first_k_dense_replace=1)) is None
