"""The CPU stand-in ``sgl_kernel`` ops for speculative decoding, and the metrics reader.

No SGLang needed: each op is checked against a direct computation of what
sgl-kernel's CPU kernel documents (``csrc/cpu/decode.cpp``, ``extend.cpp``,
``speculative_decoding.cpp``).
"""

from __future__ import annotations

import importlib
import sys

import pytest

torch = pytest.importorskip("torch")

from pytest_eagle3.capture.spec_metrics import (  # noqa: E402
    Eagle3NoSpecMetrics,
    aggregate,
    read_spec_metrics,
)
from pytest_eagle3.worker.cpu import SHIM_DIR  # noqa: E402


@pytest.fixture(scope="module")
def sk():
    sys.path.insert(0, str(SHIM_DIR))
    try:
        sys.modules.pop("sgl_kernel", None)
        module = importlib.import_module("sgl_kernel")
        assert getattr(module, "PYTEST_EAGLE3_STANDIN", False)
        yield module
    finally:
        sys.path.remove(str(SHIM_DIR))
        sys.modules.pop("sgl_kernel", None)


def _naive(q, k, v, scale, causal_from=None):
    """q [m,H,D], k [n,Hkv,D], v [n,Hkv,Dv]; query i sits at position causal_from + i."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2])
    for i in range(q.shape[0]):
        n = k.shape[0] if causal_from is None else causal_from + i + 1
        s = torch.einsum("hd,nhd->hn", q[i], k[:n]) * scale
        out[i] = torch.einsum("hn,nhd->hd", s.softmax(-1), v[:n])
    return out


def test_torch_ops_exposed_and_amx_probe_stays_off(sk):
    assert torch.ops.sgl_kernel.decode_attention_cpu.__wrapped__ is sk.decode_attention_cpu
    assert torch.ops.sgl_kernel.extend_attention_cpu.__wrapped__ is sk.extend_attention_cpu
    # SGLang's AMX probe for linear/MoE/norm layers looks for this op: it must stay absent.
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")


def test_unimplemented_op_fails_loudly(sk):
    with pytest.raises(NotImplementedError, match="does not implement 'fused_experts_cpu'"):
        sk.fused_experts_cpu(None)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
def test_decode_attention_writes_kv_then_attends(sk, heads, kv_heads):
    g = torch.Generator().manual_seed(0)
    D, slots = 8, 32
    kb = torch.randn(slots, kv_heads, D, generator=g)
    vb = torch.randn(slots, kv_heads, D, generator=g)
    req_to_token = torch.arange(64, dtype=torch.int32).view(2, 32) % slots
    req_to_token[1] = torch.randperm(slots, generator=g).int()
    seq_lens = torch.tensor([5, 9])
    rows = torch.tensor([0, 1])
    loc = torch.stack([req_to_token[0, 4], req_to_token[1, 8]]).long()
    q = torch.randn(2, heads, D, generator=g)
    key = torch.randn(2, kv_heads, D, generator=g)
    value = torch.randn(2, kv_heads, D, generator=g)
    out = torch.empty(2, heads, D)
    logits = torch.zeros(2, heads, 8, D + 1)
    sk.decode_attention_cpu(q, kb, vb, 1.0, 1.0, out, key, value, loc, logits, req_to_token, rows,
                            seq_lens, 0.3, 0.0, False, 0, None, None)
    assert torch.equal(kb[loc], key) and torch.equal(vb[loc], value)
    for b in range(2):
        idx = req_to_token[b, : seq_lens[b]].long()
        want = _naive(q[b : b + 1], kb[idx], vb[idx], 0.3)
        torch.testing.assert_close(out[b : b + 1], want)


def test_torch_op_accepts_the_argument_list_without_kv_scales(sk):
    """sglang 0.5.9-0.5.12 call the op without k_scale/v_scale (sgl-kernel 0.3.21):
    same result as the new list with unit scales; a wrong list is not silently accepted."""
    g = torch.Generator().manual_seed(2)
    D, slots = 8, 16
    kb = torch.randn(slots, 2, D, generator=g)
    req_to_token = torch.arange(16, dtype=torch.int32).view(1, 16)
    q = torch.randn(1, 2, D, generator=g)
    outs = []
    for old in (True, False):
        out = torch.empty(1, 2, D)
        common = (out, None, None, torch.tensor([0]), torch.zeros(1, 2, 8, D + 1), req_to_token,
                  torch.tensor([0]), torch.tensor([6]), 0.4, 0.0)
        args = (q, kb, kb) + ((1.0, 1.0) if not old else ()) + common
        torch.ops.sgl_kernel.decode_attention_cpu(*args)
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1])
    with pytest.raises(TypeError):
        torch.ops.sgl_kernel.decode_attention_cpu(q, kb, kb, out)


def test_kvcacheio_submodule_is_a_loud_stub(sk):
    import importlib

    kvcacheio = importlib.import_module("sgl_kernel.kvcacheio")
    with pytest.raises(NotImplementedError, match="kvcacheio.transfer_kv_per_layer"):
        kvcacheio.transfer_kv_per_layer(None)
    with pytest.raises(ImportError):
        importlib.import_module("sgl_kernel.no_such_submodule")


def test_decode_attention_mla_shared_buffer(sk):
    """MLA: one KV head, value = first Dv channels of the key, v_buffer a view of k_buffer."""
    g = torch.Generator().manual_seed(1)
    D, Dv, slots = 12, 8, 16
    kb = torch.randn(slots, 1, D, generator=g)
    vb = kb[..., :Dv]
    req_to_token = torch.arange(16, dtype=torch.int32).view(1, 16)
    key = torch.randn(1, 1, D, generator=g)
    q = torch.randn(1, 4, D, generator=g)
    out = torch.empty(1, 4, Dv)
    sk.decode_attention_cpu(q, kb, vb, 1.0, 1.0, out, key, key[..., :Dv], torch.tensor([6]),
                            torch.zeros(1, 4, 8, Dv + 1), req_to_token, torch.tensor([0]),
                            torch.tensor([7]), 0.5, 0.0, False, 0, None, None)
    assert torch.equal(kb[6], key[0])
    torch.testing.assert_close(out, _naive(q, kb[:7], kb[:7, :, :Dv], 0.5))


def test_extend_attention_prefix_plus_causal_new_tokens(sk):
    g = torch.Generator().manual_seed(2)
    H, Hkv, D, slots = 4, 2, 8, 40
    kb = torch.randn(slots, Hkv, D, generator=g)
    vb = torch.randn(slots, Hkv, D, generator=g)
    req_to_token = torch.randperm(slots, generator=g).int().view(1, slots)
    prefix, ext = [3, 0], [4, 2]
    req_to_token = torch.stack([req_to_token[0], req_to_token[0].roll(7)])
    q = torch.randn(6, H, D, generator=g)
    k = torch.randn(6, Hkv, D, generator=g)
    v = torch.randn(6, Hkv, D, generator=g)
    out = torch.empty(6, H, D)
    sk.extend_attention_cpu(q, k, v, out, kb, vb, 1.0, 1.0, req_to_token, torch.tensor([0, 1]),
                            torch.tensor([7, 2]), torch.tensor([4, 2]), torch.tensor([0, 4]), 4, 0.4, 0.0,
                            False, 0, None, None, None, True)
    for b, start in enumerate([0, 4]):
        idx = req_to_token[b, : prefix[b]].long()
        kk = torch.cat([kb[idx], k[start : start + ext[b]]])
        vv = torch.cat([vb[idx], v[start : start + ext[b]]])
        want = _naive(q[start : start + ext[b]], kk, vv, 0.4, causal_from=prefix[b])
        torch.testing.assert_close(out[start : start + ext[b]], want)


def test_extend_attention_tree_mask_replaces_causal_among_new_tokens(sk):
    """A token tree's verify (QLEN_ONLY mask, one ext x ext block per sequence): node i sees
    the whole cached prefix and the draft nodes its mask row allows, nothing else."""
    g = torch.Generator().manual_seed(3)
    H, Hkv, D, slots, n = 4, 1, 8, 40, 4
    kb = torch.randn(slots, Hkv, D, generator=g)
    req_to_token = torch.randperm(slots, generator=g).int().view(2, 20)
    prefix = [5, 3]
    # Request 0: root 0 with children 1 and 2, node 3 a child of 2; request 1: a chain.
    tree0 = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    tree1 = torch.tril(torch.ones(n, n, dtype=torch.bool))
    q = torch.randn(2 * n, H, D, generator=g)
    out = torch.empty(2 * n, H, D)
    # MLA-style verify: no new K/V passed, the buffers already hold the draft nodes.
    sk.extend_attention_cpu(q, None, None, out, kb, kb, 1.0, 1.0, req_to_token, torch.tensor([0, 1]),
                            torch.tensor([prefix[0] + n, prefix[1] + n]), torch.tensor([n, n]),
                            torch.tensor([0, n]), n, 0.4, 0.0, False, 0, None, None,
                            torch.cat([tree0.reshape(-1), tree1.reshape(-1)]), True)
    for b, tree in enumerate((tree0, tree1)):
        idx = req_to_token[b, : prefix[b] + n].long()
        for i in range(n):
            seen = list(range(prefix[b])) + [prefix[b] + j for j in range(n) if tree[i, j]]
            want = _naive(q[b * n + i : b * n + i + 1], kb[idx[seen]], kb[idx[seen]], 0.4)
            torch.testing.assert_close(out[b * n + i : b * n + i + 1], want)
    # Node 2 of request 0 does not see its sibling, node 1: a causal mask would give another output.
    causal = torch.empty_like(out)
    sk.extend_attention_cpu(q, None, None, causal, kb, kb, 1.0, 1.0, req_to_token, torch.tensor([0, 1]),
                            torch.tensor([prefix[0] + n, prefix[1] + n]), torch.tensor([n, n]),
                            torch.tensor([0, n]), n, 0.4, 0.0, False, 0, None, None, None, True)
    assert not torch.allclose(causal[2], out[2]) and torch.allclose(causal[1], out[1])
    torch.testing.assert_close(causal[n:], out[n:])


def test_extend_attention_refuses_bit_packed_and_short_tree_masks(sk):
    with pytest.raises(NotImplementedError, match="bit packed tree mask"):
        sk.extend_attention_cpu(*([None] * 11), None, None, 4, 1.0, 0.0, False, 0, None, None,
                                torch.ones(4, dtype=torch.uint8), True)
    kb = torch.zeros(8, 1, 4)
    with pytest.raises(ValueError, match="one ext x ext block per sequence"):
        sk.extend_attention_cpu(torch.zeros(4, 1, 4), None, None, torch.zeros(4, 1, 4), kb, kb, 1.0, 1.0,
                                torch.arange(8).int().view(1, 8), torch.tensor([0]), torch.tensor([6]),
                                torch.tensor([4]), torch.tensor([0]), 4, 1.0, 0.0, False, 0, None, None,
                                torch.ones(15, dtype=torch.bool), True)


def _chain(bs=1, n=4):
    """EAGLE topk 1, 3 steps: parent_list [-1, 0, 1], selected [0, 1, 2] (a chain)."""
    parent = torch.tensor([[-1, 0, 1]] * bs)
    sel = torch.tensor([[0, 1, 2]] * bs)
    buf = torch.full((3, bs, n), -1, dtype=torch.long)
    return parent, sel, buf


def test_build_tree_chain_qlen_only(sk):
    parent, sel, (ri, rnt, rns) = _chain(bs=2)
    mask = torch.full((2 * 16,), True)
    pos = torch.empty(8, dtype=torch.long)
    sk.build_tree_kernel_efficient_cpu(parent, sel, torch.tensor([5, 9]), mask, pos, ri, rnt, rns, 1, 3, 4, 1)
    assert ri.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rnt.tolist() == [[1, 2, 3, -1]] * 2
    assert rns.tolist() == [[-1] * 4] * 2
    assert pos.tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    tri = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    assert torch.equal(mask.view(2, 4, 4), torch.stack([tri, tri]))


def test_build_tree_two_branches_full_mask(sk):
    """topk 2, 2 steps, 3 draft tokens: both first-step candidates chosen -> root has two children."""
    parent = torch.tensor([[-1, 0, 1]])  # topk*(depth-1)+1 = 3
    sel = torch.tensor([[0, 1]])          # the two first-step candidates
    ri, rnt, rns = torch.full((3, 1, 3), -1, dtype=torch.long)
    seq = 2
    mask = torch.full((seq * 3 + 9,), True)
    pos = torch.empty(3, dtype=torch.long)
    sk.build_tree_kernel_efficient_cpu(parent, sel, torch.tensor([seq]), mask, pos, ri, rnt, rns, 2, 2, 3, 0)
    assert rnt.tolist() == [[1, -1, -1]]    # root's first child: node 1 (inserted last)
    assert rns.tolist() == [[-1, 2, -1]]    # node 1's sibling: node 2
    assert pos.tolist() == [2, 3, 3]
    rows = mask.view(3, seq + 3)[:, seq:]
    assert rows.tolist() == [[True, False, False], [True, True, False], [True, False, True]]


def test_verify_tree_greedy_chain(sk):
    parent, sel, (ri, rnt, rns) = _chain(bs=2)
    mask = torch.full((32,), True)
    pos = torch.empty(8, dtype=torch.long)
    sk.build_tree_kernel_efficient_cpu(parent, sel, torch.tensor([5, 9]), mask, pos, ri, rnt, rns, 1, 3, 4, 1)
    candidates = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    # Request 0: target agrees with drafts 11 and 12, not 13 -> 2 accepted, bonus 99.
    # Request 1: target disagrees at once -> 0 accepted, bonus 77.
    target = torch.tensor([[11, 12, 99, 50], [77, 1, 2, 3]])
    predicts = torch.zeros(8, dtype=torch.int32)
    accept_index = torch.full((2, 4), -1, dtype=torch.int32)
    accept_num = torch.empty(2, dtype=torch.int32)
    sk.verify_tree_greedy_cpu(predicts, accept_index, accept_num, candidates, ri, rnt, rns, target)
    assert accept_num.tolist() == [2, 0]
    assert accept_index.tolist() == [[0, 1, 2, -1], [4, -1, -1, -1]]
    assert predicts[[0, 1, 2, 4]].tolist() == [11, 12, 99, 77]


def test_cache_loc_and_bonus_helpers(sk):
    req_to_token = torch.arange(40, dtype=torch.int32).view(2, 20) + 100
    out = torch.empty(6, dtype=torch.long)
    sk.assign_draft_cache_locs_contiguous_cpu(torch.tensor([1, 0]), req_to_token, torch.tensor([4, 7]), out,
                                              20, 1, 3)
    assert out.tolist() == [124, 125, 126, 107, 108, 109]
    out = torch.empty(5, dtype=torch.long)
    sk.assign_extend_cache_locs_cpu(torch.tensor([0, 1]), req_to_token, torch.tensor([2, 5]),
                                    torch.tensor([4, 8]), out, 20)
    assert out.tolist() == [102, 103, 125, 126, 127]
    meta = sk.build_draft_decode_metadata_cpu(req_to_token, torch.tensor([1]), torch.tensor([3]), 1, 2, 20)
    assert meta[0, :5].tolist() == [120, 121, 122, 123, 124]
    bonus = torch.empty(2, dtype=torch.int32)
    sk.fill_bonus_tokens_cpu(torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]], dtype=torch.int32),
                             torch.tensor([3, 1], dtype=torch.int32), bonus, 4)
    assert bonus.tolist() == [7, 9]
    acc = torch.full((4,), -7, dtype=torch.long)
    sk.fill_accept_out_cache_loc_cpu(torch.tensor([0, 2, -1, 5], dtype=torch.int32),
                                     torch.arange(10, 20), acc)
    assert acc[:3].tolist() == [10, 12, 15]


def test_copy_all_layer_kv_cache_moves_slots_in_every_buffer(sk):
    bufs = [torch.arange(24, dtype=torch.float32).view(6, 4) + 100 * i for i in range(3)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs])
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    before = [b.clone() for b in bufs]
    # 1 -> 0 and 0 -> 1 at once: every source is read before any target is written.
    sk.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([0, 1, 5]), torch.tensor([1, 0, 2]))
    for b, old in zip(bufs, before):
        assert torch.equal(b[0], old[1]) and torch.equal(b[1], old[0]) and torch.equal(b[5], old[2])


# -- speculative metrics ------------------------------------------------------

META_0523 = {
    "completion_tokens": 12, "spec_accept_rate": 0.0, "spec_accept_length": 1.0909090909090908,
    "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 33, "spec_verify_ct": 11,
    "spec_correct_drafts_histogram": [11],
}


def test_metrics_of_sglang_0523():
    m = read_spec_metrics({"meta_info": META_0523})
    assert (m.verify_count, m.completion_tokens, m.accept_rate, m.correct_drafts, m.proposed_drafts) == (
        11, 12, 0.0, 0, 33)
    assert m.accept_length == pytest.approx(12 / 11) and m.histogram == (11,)
    assert m.sources["accept_length"] == "spec_accept_length"


def test_metrics_fallback_to_completion_over_verify():
    m = read_spec_metrics({"completion_tokens": 20, "spec_verify_ct": 5})
    assert m.accept_length == 4.0 and m.sources["accept_length"] == "derived" and m.accept_rate is None
    m = read_spec_metrics({"completion_tokens": 20, "spec_verify_ct": 5, "spec_accept_token_num": 12,
                           "spec_draft_token_num": 15})
    assert m.accept_rate == pytest.approx(0.8) and m.sources["accept_rate"] == "derived"


def test_metrics_missing_and_aggregate():
    with pytest.raises(Eagle3NoSpecMetrics, match="no spec_verify_ct"):
        read_spec_metrics({"completion_tokens": 3})
    a = read_spec_metrics(META_0523)
    b = read_spec_metrics({"completion_tokens": 20, "spec_verify_ct": 5, "spec_num_correct_drafts": 15,
                           "spec_num_proposed_drafts": 15})
    total = aggregate([a, b])
    assert total.accept_length == pytest.approx(32 / 16) and total.accept_rate == pytest.approx(15 / 48)


# -- the speculative CPU recipe -------------------------------------------------

def _install(*extra: str):
    from pytest_eagle3.sglang_source.install import SGLangInstall

    base = {"model-path", "tp-size", "skip-tokenizer-init", "disable-radix-cache", "random-seed", "device",
            "attention-backend", "dtype", "disable-custom-all-reduce", "disable-cuda-graph",
            "mem-fraction-static", "max-total-tokens", "skip-server-warmup", "speculative-algorithm",
            "enable-return-aux-hidden-states", "return-aux-hidden-state-layer-ids"}
    return SGLangInstall("0.5.23", "/fake/sglang", frozenset(base | set(extra)), "python")


SPEC_FLAGS = ("speculative-draft-model-path", "speculative-num-steps", "speculative-eagle-topk",
              "speculative-num-draft-tokens", "enable-return-hidden-states")


def test_speculative_server_args_and_missing_flags():
    from pytest_eagle3.engine.config import speculative_server_args
    from pytest_eagle3.errors import Eagle3ConfigError

    args = speculative_server_args(_install(*SPEC_FLAGS), "/d", steps=3, topk=1)
    assert args == {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/d",
                    "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    with pytest.raises(Eagle3ConfigError, match="no --speculative-draft-model-path"):
        speculative_server_args(_install(), "/d")


def test_cpu_recipe_switches_attention_only_for_a_draft():
    from pytest_eagle3.capture.draft_path import draft_path_server_args
    from pytest_eagle3.engine.config import build_engine_config
    from pytest_eagle3.worker.env import AMX_ATTENTION_ENV

    inst = _install(*SPEC_FLAGS)
    plain = build_engine_config(inst, model_path="/m", tp=2, device="cpu")
    capture_only = build_engine_config(inst, model_path="/m", tp=2, device="cpu", test_args={
        "enable_return_aux_hidden_states": True, "speculative_algorithm": "EAGLE3"})
    spec = build_engine_config(inst, model_path="/m", tp=2, device="cpu",
                               test_args=draft_path_server_args(inst, "/d"))
    for cfg in (plain, capture_only):
        assert cfg.args()["attention_backend"] == "torch_native" and AMX_ATTENTION_ENV not in cfg.env_dict()
    assert spec.args()["attention_backend"] == "intel_amx" and spec.env_dict()[AMX_ATTENTION_ENV] == "1"
    assert spec.args()["enable_return_hidden_states"] is True
    # A user's attention backend wins, and then nothing forces AMX on.
    user = build_engine_config(inst, model_path="/m", tp=1, device="cpu",
                               test_args=draft_path_server_args(inst, "/d"),
                               user_args=[("attention-backend", "triton")])
    assert user.args()["attention_backend"] == "triton" and AMX_ATTENTION_ENV not in user.env_dict()


def test_cpu_recipe_runs_tree_drafts_only_where_sglang_hands_over_the_tree_mask(tmp_path):
    from pytest_eagle3.capture.draft_path import draft_path_server_args
    from pytest_eagle3.engine.config import build_engine_config
    from pytest_eagle3.errors import Eagle3ConfigError
    from pytest_eagle3.sglang_source.install import SGLangInstall

    inst = _install(*SPEC_FLAGS)  # no intel_amx_backend.py to read: chains only
    with pytest.raises(Eagle3ConfigError, match="hands no tree mask to extend_attention_cpu.*topk 1 only"):
        build_engine_config(inst, model_path="/m", tp=1, device="cpu",
                            test_args=draft_path_server_args(inst, "/d", steps=2, topk=2))
    backend = tmp_path / "srt" / "layers" / "attention" / "intel_amx_backend.py"
    backend.parent.mkdir(parents=True)
    backend.write_text("if spec_info.tree_topk != 1:\n    tree_mask = spec_info.custom_mask\n")
    tree = SGLangInstall("0.5.23", str(tmp_path), inst.flags, "python")
    assert tree.cpu_tree_mask and not inst.cpu_tree_mask
    cfg = build_engine_config(tree, model_path="/m", tp=1, device="cpu",
                              test_args=draft_path_server_args(tree, "/d", steps=5, topk=4, num_draft_tokens=8))
    assert (cfg.args()["speculative_eagle_topk"], cfg.args()["speculative_num_draft_tokens"]) == (4, 8)


def test_tbo_sm_count_stands_in_for_the_device_query_only() -> None:
    """Two-batch overlap's SM-count query (operations_strategy.py:106) on CPU: the
    stand-in device properties, DeepEP's communication SMs, every other torch
    attribute torch's own; the installed SGLang's module when there is one."""
    from types import ModuleType

    from pytest_eagle3.worker.cpu.patches import STANDIN_COMM_SMS, STANDIN_SMS, tbo_sm_count

    if torch.cuda.is_available():
        pytest.skip("the fill is a no-op where CUDA is available")
    module = ModuleType("operations_strategy_stand_in")
    module.torch = torch
    tbo_sm_count(module)
    props = module.torch.cuda.get_device_properties(device="cuda")
    assert props.multi_processor_count - module.DeepEPConfig.get_instance().num_sms == STANDIN_SMS - STANDIN_COMM_SMS
    assert module.torch.zeros is torch.zeros and module.torch.cuda.is_available is torch.cuda.is_available
    from pytest_eagle3.sglang_source.install import sglang_location_and_version

    location, _ = sglang_location_and_version()
    source = location / "srt/batch_overlap/operations_strategy.py" if location is not None else None
    if source is None or not source.is_file():
        pytest.skip("needs an installed SGLang with srt/batch_overlap/operations_strategy.py")
    text = source.read_text()
    assert "torch.cuda.get_device_properties" in text and "DeepEPConfig.get_instance().num_sms" in text


def test_each_cpu_rank_runs_one_openmp_thread_unless_the_user_says(monkeypatch):
    """A second OpenMP thread per rank only spins between the tiny targets' ops."""
    from pytest_eagle3.engine.cpu.recipe import cpu_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu_env(2)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert cpu_env(2)["OMP_NUM_THREADS"] == "4"
