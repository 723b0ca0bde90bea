"""The GPU tier without a GPU: its preset, weights layout, cache check and CUDA recipe.

What needs CUDA itself (building ``gpu-dsv3`` on the GPU, the engines) runs on
a GPU runner; here the same code is checked on CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_eagle3.engine.cuda.recipe import FALLBACK_ATTENTION, cuda_recipe, default_attention, rejects
from pytest_eagle3.sglang_source.install import SGLangInstall
from pytest_eagle3.target.spec import TargetSpec

FLAGS = frozenset({"dtype", "mem-fraction-static", "cuda-graph-max-bs", "max-running-requests",
                   "attention-backend"})


def _install(flags: frozenset[str] = FLAGS) -> SGLangInstall:
    return SGLangInstall(version="0.5.23", location="/x", python="python", flags=flags)


def test_gpu_preset_keeps_the_widths_the_kernels_check() -> None:
    spec = TargetSpec.preset("gpu-dsv3")
    c, f = spec.config, spec.facts
    assert (f.kv_lora_rank, f.qk_rope_head_dim, c["q_lora_rank"], f.num_attention_heads) == (512, 64, 1536, 128)
    assert (c["n_routed_experts"], c["n_shared_experts"], c["n_group"], c["topk_group"]) == (256, 1, 8, 4)
    assert f.num_layers >= 8 and f.torch_dtype == "bfloat16" and spec.init.build_device == "cuda"
    assert all(f.num_attention_heads % tp == 0 and f.vocab_size % tp == 0 for tp in (1, 2, 4, 8))
    # Every suite id list stays distinct on it (no collapse at the first forward).
    from pytest_eagle3.planning import cases
    from pytest_eagle3.conventions import predict

    for name in cases.case_names():
        ids = cases.resolve(name, f.num_layers, f.hidden_size, "0.5.23").ids
        if ids is not None and max(ids) >= f.num_layers:
            continue  # the last layer's output (vllm-last-layer): gpt-oss's files capture it, DeepSeek's never
        assert not predict(list(ids) if ids is not None else None, f.num_layers, "0.5.23").fails_at_first_forward


def test_gpu_preset_is_built_on_a_gpu_only(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the preset builds here")
    from pytest_eagle3.errors import Eagle3ConfigError
    from pytest_eagle3.target.checkpoint.init import make_weights

    with pytest.raises(Eagle3ConfigError, match="is built on a GPU"):
        make_weights(TargetSpec.preset("gpu-dsv3"))


def test_weights_are_written_as_bf16_shards(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors import safe_open

    from pytest_eagle3.target.checkpoint.builder import INDEX_FILE, write_weights

    weights = {f"w{i}": torch.randn(64, 64) for i in range(5)}
    weights["mlp.gate.e_score_correction_bias"] = torch.zeros(8)
    files = write_weights(weights, tmp_path, dtype="bfloat16", shard_bytes=3 * 64 * 64 * 2)
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(weights)
    with safe_open(str(tmp_path / files[0]), framework="pt") as fh:
        assert fh.get_tensor("w0").dtype == torch.bfloat16
    with safe_open(str(tmp_path / index["weight_map"]["mlp.gate.e_score_correction_bias"]), framework="pt") as fh:
        assert fh.get_tensor("mlp.gate.e_score_correction_bias").dtype == torch.float32
    again = tmp_path / "again"
    again.mkdir()
    write_weights(weights, again, dtype="bfloat16", shard_bytes=3 * 64 * 64 * 2)
    assert all((again / f).read_bytes() == (tmp_path / f).read_bytes() for f in files)


def test_cache_check_trusts_unchanged_files_without_hashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_eagle3.target.checkpoint import cache

    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    cache.write_manifest(tmp_path, "k")
    hashed: list[Path] = []
    real = cache._sha256
    monkeypatch.setattr(cache, "_sha256", lambda p: hashed.append(p) or real(p))
    assert cache.check_entry(tmp_path, "k") is None and hashed == []
    assert cache.check_entry(tmp_path, "k", full=True) is None and len(hashed) == 1
    # Same size, new bytes and a new time: hashed, and found.
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"y" * 1000)
    os.utime(path, ns=(1, 1))
    assert cache.check_entry(tmp_path, "k") == "model.safetensors: sha256 mismatch"


def test_cuda_recipe_keeps_sglang_default_for_production_widths() -> None:
    recipe = cuda_recipe(_install(), arch="sm90", kv_lora_rank=512, qk_rope_head_dim=64)
    assert recipe.args == {"dtype": "bfloat16", "mem_fraction_static": 0.5, "cuda_graph_max_bs": 8,
                           "max_running_requests": 16}
    assert recipe.describe() == "dtype bfloat16, attention sglang default (fa3 on sm90), cuda graphs on"
    assert cuda_recipe(_install(), arch="sm100", kv_lora_rank=512, qk_rope_head_dim=64).attention == "sglang default"


@pytest.mark.parametrize("arch", ["sm90", "sm100", None])
def test_cuda_recipe_falls_back_for_the_cpu_preset(arch: str | None) -> None:
    recipe = cuda_recipe(_install(), arch=arch, kv_lora_rank=128, qk_rope_head_dim=32, torch_dtype="float32")
    assert recipe.args["attention_backend"] == FALLBACK_ATTENTION and recipe.args["dtype"] == "bfloat16"
    assert recipe.why.startswith(f"fallback: {default_attention(arch)}")


def test_cuda_recipe_drops_flags_a_fork_lacks() -> None:
    recipe = cuda_recipe(_install(frozenset({"dtype"})), arch="sm90", kv_lora_rank=512, qk_rope_head_dim=64)
    assert recipe.args == {"dtype": "bfloat16"}


def test_backend_width_rules() -> None:
    assert rejects("trtllm_mla", 512, 64, "bfloat16") is None
    assert "trtllm_mla needs" in rejects("trtllm_mla", 128, 64, "bfloat16")
    assert "bf16/fp16" in rejects("fa3", 512, 64, "float32")
    assert rejects("triton", 128, 32, "float32") is None
