"""``worker/cpu/older_releases.py``: each fix fires only where its gap is, and its
stand-in computes what the kernel it replaces computes.

Fake modules stand for the older releases' files (the real 0.5.9 and 0.5.12
run in ``tox -e sglang0509`` / ``sglang0512``); the installed SGLang (0.5.23 in
this project's venv) must see no fix fire.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
torch = pytest.importorskip("torch")

from pytest_eagle3.worker.cpu import older_releases
from pytest_eagle3.worker.cpu import SHIM_DIR


class JITFunction:
    """Named like Triton's kernel type (the feature test reads the type name)."""

    def __getitem__(self, grid):
        raise AssertionError("the Triton kernel must not be launched on CPU")


def assign_req_to_token_pool_func(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                  batch_size):
    assign_req_to_token_pool[(batch_size,)](req_pool_indices)  # noqa: F821  (as 0.5.9 writes it)


def verify_tree_greedy_func(predicts, accept_index, accept_token_num, candidates, retrive_index,
                            retrive_next_token, retrive_next_sibling, target_predict, topk=-1):
    if _is_cuda:  # noqa: F821  (no branch for this device, as in 0.5.9)
        pass
    return predicts, accept_index, accept_token_num


def _spec_utils():
    m = types.ModuleType("fake_spec_utils")
    m.assign_req_to_token_pool = JITFunction()
    m.assign_req_to_token_pool_func = assign_req_to_token_pool_func
    m.assign_draft_cache_locs = JITFunction()
    m.create_extend_after_decode_spec_info = JITFunction()
    return m


def test_spec_utils_stand_ins_follow_the_triton_kernels():
    m = _spec_utils()
    older_releases.spec_utils_kernels(m)
    req_to_token = torch.zeros(3, 12, dtype=torch.int32)
    # two requests in rows 2 and 0: positions [1, 3) and [0, 2) get slots 7, 8 and 9, 10
    m.assign_req_to_token_pool_func(torch.tensor([2, 0]), req_to_token, torch.tensor([1, 0]), torch.tensor([3, 2]),
                                    torch.tensor([7, 8, 9, 10]), 2)
    assert req_to_token[2, 1:3].tolist() == [7, 8] and req_to_token[0, 0:2].tolist() == [9, 10]
    # draft cache: topk 1, 3 steps -> 3 slots per request after its seq_len (0.5.9 positional tail)
    out = torch.arange(100, 106)
    m.assign_draft_cache_locs[(2,)](torch.tensor([0, 1]), req_to_token, torch.tensor([4, 2]), None, None, out,
                                    None, None, None, None, 12, 1, 3, 1, 2, 4)
    assert req_to_token[0, 4:7].tolist() == [100, 101, 102] and req_to_token[1, 2:5].tolist() == [103, 104, 105]
    # after decode: request b accepted a_b tokens ending at seq_len_b
    positions, new_ids = torch.zeros(5, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    m.create_extend_after_decode_spec_info[(2,)](torch.tensor([11, 12, 13, 21, 22]), torch.tensor([10, 6]),
                                                 torch.tensor([3, 2]), positions, new_ids, 4)
    assert positions.tolist() == [7, 8, 9, 4, 5] and new_ids.tolist() == [13, 22]


def test_verify_accepts_both_spellings_of_the_retrieve_arguments(monkeypatch):
    """0.5.11 renamed retrive_* to retrieve_* and its callers pass them by keyword."""
    calls = []
    fake_kernel = types.ModuleType("sgl_kernel")
    fake_kernel.verify_tree_greedy_cpu = lambda *args: calls.append(args)
    monkeypatch.setitem(sys.modules, "sgl_kernel", fake_kernel)
    m = types.ModuleType("fake_eagle_utils")
    m.verify_tree_greedy_func = verify_tree_greedy_func
    older_releases.eagle_tree_kernels(m)
    assert m.verify_tree_greedy_func is not verify_tree_greedy_func
    names = ["p", "ai", "an", "c", "ri", "rn", "rs", "t"]
    out = m.verify_tree_greedy_func(predicts="p", accept_index="ai", accept_token_num="an", candidates="c",
                                    retrieve_index="ri", retrieve_next_token="rn", retrieve_next_sibling="rs",
                                    target_predict="t", topk=1)
    m.verify_tree_greedy_func(*names)
    assert calls == [tuple(names), tuple(names)] and out == ("p", "ai", "an")


def test_no_fix_fires_where_the_gap_is_absent():
    m = types.ModuleType("fake")
    m.assign_req_to_token_pool = object()
    m.assign_draft_cache_locs = lambda *a: None
    m.copy_all_layer_kv_cache_tiled = lambda *a: None
    before = dict(vars(m))
    older_releases.spec_utils_kernels(m)
    older_releases.kv_cache_copy(m)
    older_releases.eagle_tree_kernels(m)
    assert dict(vars(m)) == before


CHECK_INSTALLED = """
import importlib, sys
from pytest_eagle3.worker.cpu import fills, older_releases
fired = []
for fill in fills.FILLS:
    if fill.apply.__module__ != older_releases.__name__:
        continue
    module = fill.module
    m = importlib.import_module(module)
    before = dict(vars(m))
    classes = {k: dict(vars(v)) for k, v in before.items() if isinstance(v, type) and v.__module__ == module}
    fill.apply(m)
    after = dict(vars(m))
    if after != before or any(dict(vars(after[k])) != v for k, v in classes.items()):
        fired.append(fill.name)
print("FIRED", fired)
"""


def test_only_the_mla_draft_fix_fires_on_the_installed_sglang():
    """The project's venv has sglang 0.5.23, which has every CPU branch but one: the MLA
    EAGLE-3 draft's ``set_embed`` (``srt/models/kimi_k25_eagle3.py``) calls
    ``torch.cuda.synchronize()`` unconditionally.  Nothing else may change."""
    pytest.importorskip("sglang")
    import os

    env = {**os.environ, "PYTHONPATH": str(SHIM_DIR), "SGLANG_USE_CPU_ENGINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", CHECK_INSTALLED], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FIRED ['mla_draft_set_embed']" in out.stdout, out.stdout
