"""Target specs, the deterministic checkpoint builder and its keyed, atomic cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pytest_eagle3.target.checkpoint.cache import cache_key
from pytest_eagle3.target.checkpoint import builder, cache, ensure_checkpoint, entry_dir
from pytest_eagle3.target.checkpoint.builder import build_checkpoint
from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.target.spec import (
    MISSING_CONFIG_MSG,
    UNKNOWN_TARGET_MSG,
    LocalTarget,
    TargetSpec,
    list_presets,
    load_packaged_prompts,
    resolve_target,
)

TINY = "tiny-dsv3"


@pytest.fixture(scope="session")
def tiny_spec() -> TargetSpec:
    return TargetSpec.preset(TINY)


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_spec: TargetSpec, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny-dsv3 entry of a per-session cache (test_reference.py reuses the same root)."""
    return ensure_checkpoint(tiny_spec, tmp_path_factory.getbasetemp() / "eagle3-cache")


@pytest.fixture
def small_spec(tiny_spec: TargetSpec) -> TargetSpec:
    """A 2-layer variant that builds in a fraction of a second, for cache mechanics."""
    data = {
        "name": "tiny-test",
        "description": "cache tests",
        "seed": 7,
        "init": tiny_spec.init.to_dict(),
        "config": dict(tiny_spec.config, num_hidden_layers=2, vocab_size=256),
    }
    return TargetSpec.from_dict(data)


def _bytes(directory: Path) -> dict[str, bytes]:
    # The entry's bytes; .stamps.json (modification times, the fast check) differs by design.
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file() and p.name != ".stamps.json"}


# ---------------------------------------------------------------- specs


def test_tiny_preset_is_a_valid_v3_layout(tiny_spec: TargetSpec) -> None:
    assert TINY in list_presets()
    cfg = tiny_spec.config
    assert (tiny_spec.facts.num_layers, tiny_spec.facts.hidden_size, tiny_spec.facts.vocab_size) == (8, 256, 2048)
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    for tp in (1, 2, 4, 8):
        assert tiny_spec.facts.num_attention_heads % tp == 0
        assert tiny_spec.facts.vocab_size % tp == 0
    assert cfg["num_nextn_predict_layers"] == 0 and cfg["tie_word_embeddings"] is False
    assert (cfg["scoring_func"], cfg["topk_method"]) == ("sigmoid", "noaux_tc")
    rs = cfg["rope_scaling"]
    assert rs["type"] == "yarn"
    # transformers derives the yarn factor from this ratio when "factor" is absent; keep them equal.
    assert cfg["max_position_embeddings"] == rs["factor"] * rs["original_max_position_embeddings"]
    assert tiny_spec.init.pinned_experts >= cfg["num_experts_per_tok"]


def test_prompts_cover_every_tp8_vocab_shard(tiny_spec: TargetSpec) -> None:
    prompts = load_packaged_prompts(vocab_size=tiny_spec.facts.vocab_size)
    assert 5 <= min(map(len, prompts)) and max(map(len, prompts)) <= 40
    shard = tiny_spec.facts.vocab_size // 8
    for ids in prompts:
        if len(ids) >= 8:
            assert {t // shard for t in ids} == set(range(8)), ids


def test_cache_key_covers_what_determines_bytes(tiny_spec: TargetSpec) -> None:
    data = json.loads(tiny_spec.source.read_text())  # type: ignore[union-attr]
    again = TargetSpec.from_dict(data)
    assert cache_key(again) == cache_key(tiny_spec) and len(cache_key(tiny_spec)) == 64
    assert cache_key(TargetSpec.from_dict(dict(data, description="other"))) == cache_key(tiny_spec)
    assert cache_key(TargetSpec.from_dict(dict(data, seed=data["seed"] + 1))) != cache_key(tiny_spec)
    changed = dict(data, config=dict(data["config"], hidden_size=128))
    assert cache_key(TargetSpec.from_dict(changed)) != cache_key(tiny_spec)


def test_unknown_preset_message() -> None:
    with pytest.raises(Eagle3ConfigError) as info:
        resolve_target("no-such-target")
    msg = str(info.value)
    assert msg == UNKNOWN_TARGET_MSG.format(value="no-such-target", known=", ".join(list_presets()))
    assert "tiny-dsv3" in msg and "config.json" in msg and "\n" not in msg


def test_resolve_directory_and_spec_file(tmp_path: Path, tiny_spec: TargetSpec) -> None:
    with pytest.raises(Eagle3ConfigError, match="has no config.json") as info:
        resolve_target(str(tmp_path))
    assert str(info.value) == MISSING_CONFIG_MSG.format(path=tmp_path.resolve())
    (tmp_path / "config.json").write_text(json.dumps(tiny_spec.config))
    local = resolve_target(str(tmp_path))
    assert isinstance(local, LocalTarget) and local.checkpoint_dir == tmp_path.resolve()
    assert local.facts.num_layers == 8
    spec_file = tmp_path / "mine.json"
    spec_file.write_text(tiny_spec.source.read_text())  # type: ignore[union-attr]
    assert cache_key(resolve_target(str(spec_file))) == cache_key(tiny_spec)  # type: ignore[union-attr]


def test_bad_spec_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "config": {"hidden_size": 8}, "init": {"nope": 1}}))
    with pytest.raises(Eagle3ConfigError, match="invalid"):
        TargetSpec.from_file(bad)


# ---------------------------------------------------------------- builder


def test_build_is_deterministic(tiny_spec: TargetSpec, tiny_checkpoint: Path, tmp_path: Path) -> None:
    build_checkpoint(tiny_spec, tmp_path / "again")
    cached = _bytes(tiny_checkpoint)
    cached.pop(cache.MANIFEST_FILE)
    assert _bytes(tmp_path / "again") == cached


def test_weights_use_real_v3_names_and_pinned_routing(tiny_spec: TargetSpec, tiny_checkpoint: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(tiny_checkpoint / builder.WEIGHTS_FILE), "pt") as f:
        names = set(f.keys())
        bias = {n: f.get_tensor(n) for n in names if n.endswith("e_score_correction_bias")}
        dtypes = {f.get_slice(n).get_dtype() for n in names}
    assert dtypes == {"F32"}
    attn = "model.layers.3.self_attn."
    for part in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                 "kv_a_layernorm", "kv_b_proj", "o_proj"):
        assert f"{attn}{part}.weight" in names
    for proj in ("gate_proj", "up_proj", "down_proj"):
        assert f"model.layers.0.mlp.{proj}.weight" in names  # dense layer
        assert f"model.layers.5.mlp.experts.7.{proj}.weight" in names
        assert f"model.layers.5.mlp.shared_experts.{proj}.weight" in names
    assert {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"} <= names
    assert not any(n.startswith("model.layers.8.") for n in names)  # no MTP layer
    assert len(bias) == tiny_spec.facts.num_layers - 1
    experts = tiny_spec.config["n_routed_experts"]
    for j, layer in enumerate(range(1, tiny_spec.facts.num_layers)):
        b = bias[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"]
        pinned = sorted(int(i) for i in (b == tiny_spec.init.router_bias).nonzero().flatten())
        assert pinned == sorted({(2 * j) % experts, (2 * j + 1) % experts})
        assert int((b != 0).sum()) == 2


# ---------------------------------------------------------------- cache


def test_cache_reuse_keeps_sentinel(small_spec: TargetSpec, tmp_path: Path) -> None:
    first = ensure_checkpoint(small_spec, tmp_path)
    assert first == entry_dir(small_spec, tmp_path)
    assert first.name == f"tiny-test-{cache_key(small_spec)[:16]}"
    assert cache.check_entry(first, cache_key(small_spec)) is None
    (first / "sentinel").write_text("kept")
    assert ensure_checkpoint(small_spec, tmp_path) == first
    assert (first / "sentinel").read_text() == "kept"


def test_rebuild_flag_replaces_entry(small_spec: TargetSpec, tmp_path: Path) -> None:
    first = ensure_checkpoint(small_spec, tmp_path)
    before = _bytes(first)
    (first / "sentinel").write_text("dropped")
    assert ensure_checkpoint(small_spec, tmp_path, rebuild=True) == first
    assert not (first / "sentinel").exists()
    assert _bytes(first) == {k: v for k, v in before.items() if k != "sentinel"}
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("damage", ["truncate-weights", "delete-manifest", "flip-byte", "delete-config"])
def test_corrupt_entry_is_rebuilt(small_spec: TargetSpec, tmp_path: Path, damage: str) -> None:
    entry = ensure_checkpoint(small_spec, tmp_path)
    good = _bytes(entry)
    weights = entry / builder.WEIGHTS_FILE
    if damage == "truncate-weights":
        with weights.open("r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    elif damage == "delete-manifest":
        (entry / cache.MANIFEST_FILE).unlink()
    elif damage == "flip-byte":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    else:
        (entry / builder.CONFIG_FILE).unlink()
    assert cache.check_entry(entry) is not None
    (entry / "sentinel").write_text("x")
    assert ensure_checkpoint(small_spec, tmp_path) == entry
    assert _bytes(entry) == good and not (entry / "sentinel").exists()


def test_build_failure_leaves_nothing(small_spec: TargetSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(spec: TargetSpec, out_dir: Path) -> None:
        out_dir.mkdir(parents=True)
        (out_dir / builder.CONFIG_FILE).write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(builder, "build_checkpoint", broken)
    with pytest.raises(Eagle3ConfigError) as info:
        ensure_checkpoint(small_spec, tmp_path)
    assert "No space left on device" in str(info.value) and "\n" not in str(info.value)
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == [f"{entry_dir(small_spec, tmp_path).name}.lock"]


def test_unwritable_cache_root_message(small_spec: TargetSpec, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(Eagle3ConfigError) as info:
        ensure_checkpoint(small_spec, blocker / "cache")
    msg = str(info.value)
    assert msg.startswith(f"cannot write the checkpoint cache at {blocker / 'cache' / 'checkpoints'}")
    assert "--eagle3-cache" in msg and "\n" not in msg
    assert blocker.read_text() == "not a directory"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_cache_root_message(small_spec: TargetSpec, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(Eagle3ConfigError, match="cannot write the checkpoint cache"):
            ensure_checkpoint(small_spec, ro)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_concurrent_ensure_builds_once(small_spec: TargetSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = builder.build_checkpoint

    def counting(spec: TargetSpec, out_dir: Path) -> None:
        calls.append(1)
        real(spec, out_dir)

    monkeypatch.setattr(builder, "build_checkpoint", counting)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_checkpoint(small_spec, tmp_path)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [entry_dir(small_spec, tmp_path)] * 3


def test_imports_stay_light() -> None:
    code = (
        "import sys, pytest_eagle3.target.spec, pytest_eagle3.target.checkpoint, pytest_eagle3.target.reference, "
        "pytest_eagle3.errors; "
        "bad = [m for m in ('torch', 'transformers', 'sglang', 'safetensors') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
