"""The MLA EAGLE-3 draft (SGLang's ``Eagle3DeepseekV2ForCausalLM``): its config, its
math against transformers' DeepSeek-V3 attention, the shipped variants, the checks
that reject a bad one before any engine, and the planning that leaves it out where
SGLang has no such model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_eagle3.draft import Eagle3DraftError, shipped_draft_dir, validate_draft
from pytest_eagle3.draft.build import VARIANTS
from pytest_eagle3.draft.config import MLA_ARCHITECTURE, DraftConfig
from pytest_eagle3.draft.validate import tensor_shapes
from pytest_eagle3.sglang_source import id_keys
from pytest_eagle3.stack_source.files import StackFiles
from pytest_eagle3.planning import declare
from pytest_eagle3.planning.collect import collect_reason
from pytest_eagle3.target.spec import TargetSpec
from tests.safetensors_files import write_safetensors

PRESET = "tiny-dsv3"
MLA = f"{PRESET}-mla"


def _config(**changes) -> DraftConfig:
    t = TargetSpec.preset(PRESET).config
    base = DraftConfig(
        hidden_size=t["hidden_size"], target_hidden_size=t["hidden_size"], aux_layer_ids=(0, 3, 5),
        num_attention_heads=t["num_attention_heads"], num_key_value_heads=t["num_attention_heads"],
        head_dim=t["hidden_size"] // t["num_attention_heads"], intermediate_size=256,
        vocab_size=t["vocab_size"], draft_vocab_size=t["vocab_size"], rope_theta=float(t["rope_theta"]),
        max_position_embeddings=t["max_position_embeddings"], attention="mla", rope_scaling=t["rope_scaling"],
        **{k: t[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
    )
    return replace(base, **changes)


def test_config_round_trips_through_config_json() -> None:
    for flags in ({}, {"fc_norm": True}, {"norm_output": True}):
        cfg = _config(**flags)
        hf = cfg.to_hf_config()
        assert hf["architectures"] == [MLA_ARCHITECTURE] and hf["model_type"] == "deepseek_v3"
        assert "head_dim" not in hf and hf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 5]
        back = DraftConfig.from_hf_config(hf)
        assert (back.is_mla, back.fc_norm, back.norm_output) == (True, cfg.fc_norm, cfg.norm_output)
        assert back.shapes() == cfg.shapes()
    assert "fc_norm.2.weight" in _config(fc_norm=True).shapes()
    assert "layers.0.self_attn.kv_a_proj_with_mqa.weight" in _config().shapes()


def test_top_level_ids_size_the_mla_fc_only() -> None:
    """``_get_eagle_aux_layer_count`` falls back to the top-level key; the Llama draft does not."""
    hf = _config(aux_layer_ids=(0, 2, 3, 5)).to_hf_config()
    hf["eagle_aux_hidden_state_layer_ids"] = hf.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
    assert DraftConfig.from_hf_config(hf).num_aux == 4
    hf["architectures"] = ["LlamaForCausalLMEagle3"]
    assert DraftConfig.from_hf_config(hf).num_aux == 3


def test_mla_attention_equals_transformers_deepseek_v3() -> None:
    """q/k/v of :func:`mla_qkv` with the softmax scale, through causal attention and
    ``o_proj``, equal transformers' ``DeepseekV3Attention`` (yarn rope, interleaved
    pairs) whose down projections read ``2 * hidden`` (the EAGLE-3 layer's input)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    from pytest_eagle3.draft import model

    t = dict(TargetSpec.preset(PRESET).config)
    cfg, H, T = _config(), t["hidden_size"], 40
    g = torch.Generator().manual_seed(0)
    params = {n: torch.randn(s, generator=g) * 0.3 if len(s) > 1 else 1 + 0.1 * torch.randn(s, generator=g)
              for n, s in cfg.shapes().items()}
    e, h = torch.randn(T, H, generator=g), 3 * torch.randn(T, H, generator=g)
    pos = torch.arange(T)
    q, k, v, _ = model.mla_qkv(params, cfg, e, h, pos)
    scores = torch.einsum("qhd,khd->hqk", q, k) * cfg.softmax_scale
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1)[None], float("-inf"))
    ours = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(T, -1)
    ours = ours @ params["layers.0.self_attn.o_proj.weight"].T

    tc = DeepseekV3Config(**{key: value for key, value in t.items() if key != "architectures"})
    tc._attn_implementation = "eager"
    attn = ds.DeepseekV3Attention(tc, layer_idx=0).eval()
    attn.q_a_proj = torch.nn.Linear(2 * H, tc.q_lora_rank, bias=False)
    attn.kv_a_proj_with_mqa = torch.nn.Linear(2 * H, tc.kv_lora_rank + tc.qk_rope_head_dim, bias=False)
    prefix = "layers.0.self_attn."
    attn.load_state_dict({n[len(prefix):]: w for n, w in params.items() if n.startswith(prefix)}, strict=True)
    x = torch.cat((model.rms_norm(e, params["layers.0.input_layernorm.weight"], 1e-6),
                   model.rms_norm(h, params["layers.0.hidden_norm.weight"], 1e-6)), -1)[None]
    cos_sin = ds.DeepseekV3RotaryEmbedding(tc)(x, pos[None])
    with torch.no_grad():
        theirs, _ = attn(x, cos_sin, torch.triu(torch.full((T, T), float("-inf")), 1)[None, None])
    assert abs(cfg.softmax_scale - attn.scaling) < 1e-7
    assert float((ours - theirs[0]).norm() / theirs[0].norm()) < 1e-5


def test_fc_norm_and_norm_output() -> None:
    torch = pytest.importorskip("torch")
    from pytest_eagle3.draft import model

    cfg = _config(fc_norm=True, norm_output=True)
    g = torch.Generator().manual_seed(1)
    params = {n: torch.randn(s, generator=g) for n, s in cfg.shapes().items()}
    aux = torch.randn(5, cfg.fc_in, generator=g)
    scaled = aux * torch.tensor([1.0, 10.0, 100.0]).repeat_interleave(cfg.target_hidden_size)
    # One norm per slot: scaling a slot changes nothing.
    assert torch.allclose(model.project(params, cfg, aux), model.project(params, cfg, scaled), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(model.project(params, replace(cfg, fc_norm=False), aux),
                              model.project(params, replace(cfg, fc_norm=False), scaled))
    attn = torch.randn(5, cfg.num_attention_heads * int(cfg.v_head_dim), generator=g)
    resid = torch.randn(5, cfg.hidden_size, generator=g)
    normed, plain = model.finish(params, cfg, attn, resid), model.finish(params, replace(cfg, norm_output=False), attn, resid)
    assert torch.equal(normed.logits, plain.logits)
    assert torch.allclose(normed.prenorm, model.rms_norm(plain.prenorm, params["norm.weight"], cfg.rms_norm_eps))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_shipped_mla_drafts_are_valid_and_powerful(variant: str) -> None:
    """Each shipped MLA draft fits tiny-dsv3, declares its flags, and its stored
    offline quality clears the gate by at least 2x the best miswiring."""
    path = shipped_draft_dir(f"{PRESET}-{variant}")
    t = TargetSpec.preset(PRESET).config
    cfg = validate_draft(path, t["hidden_size"], t["vocab_size"],
                         target_mla={"kv_lora_rank": t["kv_lora_rank"], "qk_rope_head_dim": t["qk_rope_head_dim"]})
    assert cfg.is_mla and cfg.fc_norm == VARIANTS[variant].get("fc_norm", False)
    assert cfg.norm_output == VARIANTS[variant].get("norm_output", False)
    quality = json.loads((path / "quality.json").read_text())
    assert quality["settings"]["attention"] == "mla"
    assert quality["gates"]["power_ratio"] >= 2.0, quality["gates"]
    assert quality["quality"]["correct"]["accept_length"] >= quality["gates"]["min_accept_length"]


def _fake_mla(tmp: Path, *, config: dict | None = None, drop: tuple[str, ...] = (), flags: dict | None = None) -> Path:
    """A header-only MLA draft directory (tensor shapes only)."""
    cfg = _config(**(flags or {}))
    hf = cfg.to_hf_config()
    hf.update(config or {})
    tensors = {n: ("F32", list(s)) for n, s in cfg.shapes().items() if n not in drop}
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(hf))
    write_safetensors(tmp / "model.safetensors", tensors)
    return tmp


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_mla_widths_must_match_the_target(tmp_path: Path) -> None:
    d = _fake_mla(tmp_path / "d", config={"kv_lora_rank": 64})
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(d, 256, 2048, target_mla={"kv_lora_rank": 128, "qk_rope_head_dim": 32})
    msg = _one_line(exc)
    assert str(d) in msg and "kv_lora_rank = 64" in msg and "is 128" in msg


def test_mla_field_missing(tmp_path: Path) -> None:
    d = _fake_mla(tmp_path / "d")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["qk_rope_head_dim"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(d, 256, 2048)
    assert "lacks qk_rope_head_dim" in _one_line(exc)


def test_fc_norm_weights_missing(tmp_path: Path) -> None:
    d = _fake_mla(tmp_path / "d", flags={"fc_norm": True}, drop=("fc_norm.1.weight",))
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(d, 256, 2048)
    msg = _one_line(exc)
    assert "fc_norm.1.weight" in msg and "sets fc_norm" in msg


def test_fake_mla_draft_is_valid(tmp_path: Path) -> None:
    assert validate_draft(_fake_mla(tmp_path / "d", flags={"fc_norm": True}), 256, 2048).fc_norm
    assert tensor_shapes(shipped_draft_dir(MLA))["midlayer.self_attn.q_a_proj.weight"] == (128, 512)


# --- which keys each side reads (installed code, read with ast) -------------------------

NESTED_ONLY = '''
def resolve(draft_model_config):
    eagle_config = getattr(draft_model_config.hf_config, "eagle_config", None)
    ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
'''
BOTH = '''
def count(config):
    eagle_config = getattr(config, "eagle_config", None)
    layer_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    if layer_ids is None:
        layer_ids = getattr(config, "eagle_aux_hidden_state_layer_ids", None)
'''


def test_key_reads_from_source() -> None:
    nested = id_keys.reads(NESTED_ONLY, "a.py")
    assert (nested.nested_line, nested.top_line) == (4, None)
    both = id_keys.reads(BOTH, "b.py")
    assert (both.nested_line, both.top_line) == (4, 6)
    assert "else the top-level one" in both.describe() and "b.py:6" in both.describe()
    assert not id_keys.reads("x = 1", "c.py").found


def test_key_reads_of_the_installed_sglang() -> None:
    """sglang 0.5.23: the target side reads only eagle_config's key; the MLA draft
    sizes fc from it, else from the top-level key (the trap)."""
    from pytest_eagle3.sglang_source.install import sglang_location_and_version

    location, _ = sglang_location_and_version()
    if location is None or not id_keys.has_draft_model(location, MLA_ARCHITECTURE):
        pytest.skip("needs an installed SGLang with srt/models/kimi_k25_eagle3.py")
    target = id_keys.target_reads(location)
    assert target is not None and target.reads_nested and not target.reads_top_level
    draft = id_keys.draft_reads(location, MLA_ARCHITECTURE)
    assert draft is not None and draft.reads_nested and draft.reads_top_level


def test_planning_leaves_mla_drafts_out_where_sglang_has_no_mla_draft(tmp_path: Path) -> None:
    """One line, read from the installed files, never from a version number."""
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.settings import Settings

    (tmp_path / "srt" / "models").mkdir(parents=True)
    fake = SGLangInstall(version="9.9.9", location=str(tmp_path), flags=frozenset(), python="python")
    facts = TargetSpec.preset(PRESET).facts
    need = declare.acceptance_need(variant="mla")
    reason = collect_reason(need, declare.NeedContext(Settings(tp=1, device="cpu"), 1, fake, facts))
    assert reason is not None and "kimi_k25_eagle3.py" in reason and "Eagle3DeepseekV2ForCausalLM" in reason
    slow = collect_reason(declare.acceptance_need(variant="mla-fc-norm"),
                                  declare.NeedContext(Settings(tp=1, device="cpu"), 1, None, facts))
    assert slow is not None and "--eagle3-slow" in slow


def test_speculators_format_is_refused_with_the_conversion(tmp_path: Path) -> None:
    """A speculators 0.9.0 config (``Eagle3Speculator``) given to SGLang: one line,
    before any engine, with the fields to convert and the ids to declare."""
    d = tmp_path / "spec"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "speculators_config": {"algorithm": "eagle3"}, "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
        "draft_vocab_size": 2048, "target_hidden_size": 256,
        "transformer_layer_config": {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8,
                                     "intermediate_size": 256, "vocab_size": 2048},
    }))
    write_safetensors(d / "model.safetensors", {"fc.weight": ("F32", [256, 768])})
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(d, 256, 2048)
    msg = _one_line(exc)
    assert "speculators format" in msg and "SGLang cannot load it" in msg and "LlamaForCausalLMEagle3" in msg
    assert "hidden_size, intermediate_size, num_attention_heads" in msg and "[2, 4, 5]" in msg
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in msg


def _vllm_copy(root: Path, version: str, v1_runner: bool) -> StackFiles:
    """A folder standing in for an installed vLLM: its METADATA, and Model Runner V1's file or not."""
    from pytest_eagle3.stack_source.files import folder

    (root / f"vllm-{version}.dist-info").mkdir(parents=True)
    (root / f"vllm-{version}.dist-info" / "METADATA").write_text(f"Name: vllm\nVersion: {version}\n")
    if v1_runner:
        (root / "vllm/v1/worker").mkdir(parents=True)
        (root / "vllm/v1/worker/gpu_model_runner.py").write_text("class GPUModelRunner:\n    pass\n")
    return folder(root)


def test_vllm_runners_read_different_keys(tmp_path: Path) -> None:
    """vLLM 0.34.0 (one runner) ignores eagle_config's key and serves its default,
    with a verdict that says so; 0.33's V1 read it, modelled only where the
    installed vLLM's files still hold that runner (whatever its version number);
    the top-level key is read; id 0 fails on DeepSeek; id L is the pre-norm final state."""
    from pytest_eagle3.contracts.servers import NESTED_IGNORED, nested_ids_ignored, vllm_reads, vllm_v1_ids, vllm_v2_ids

    nested = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}}
    assert vllm_v2_ids(nested) == (None, None)
    assert vllm_v1_ids(nested) == ((1, 3, 4), "eagle_config.eagle_aux_hidden_state_layer_ids")
    top = {"eagle_aux_hidden_state_layer_ids": [2, 4, 8]}
    (only,) = vllm_reads(top, 8, installed=None)
    assert only.server == "vllm 0.34.0" and only.snapshots == (2, 4, 9) and only.note is None  # 9 = final_prenorm
    (only,) = vllm_reads(nested, 8, installed=_vllm_copy(tmp_path / "a", "0.34.0", v1_runner=False))
    assert only.key is None and only.snapshots == (2, 4, 5)
    assert only.note == nested_ids_ignored(nested, 8) == NESTED_IGNORED.format(
        since=">= 0.34", key="eagle_aux_hidden_state_layer_ids", ids=[1, 3, 4], default=[2, 4, 5])
    with_v1 = _vllm_copy(tmp_path / "b", "0.33.0", v1_runner=True)
    v2, v1 = vllm_reads(nested, 8, installed=with_v1)
    assert v2.server == "vllm 0.33.0 V2 (default; installed)" and v2.snapshots == (2, 4, 5) and v2.note
    assert v1.server == "vllm 0.33.0 V1 (installed)" and v1.snapshots == (1, 3, 4) and v1.note is None
    assert vllm_reads({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 5]}}, 8,
                      installed=with_v1)[1].fails
    fork = vllm_reads(nested, 8, installed=_vllm_copy(tmp_path / "c", "0.35.0+fork", v1_runner=True))
    assert [r.server for r in fork] == ["vllm 0.35.0+fork V2 (default; installed)", "vllm 0.35.0+fork V1 (installed)"]
    assert nested_ids_ignored({**nested, **top}, 8) is None  # the top-level key is read
    assert vllm_v2_ids({"target_layer_ids": [1, 2]}) == ((2, 3), "target_layer_ids (+1)")
    assert vllm_v2_ids({"eagle_config": {"layer_ids": [1, 2]}}) == ((1, 2), "eagle_config.layer_ids")


def test_a_flag_the_installed_draft_model_never_reads_is_refused(tmp_path: Path) -> None:
    """``norm_before_fc`` on the MLA draft: 0.5.23's kimi_k25_eagle3.py never reads it,
    so SGLang would serve the draft without the norm it was trained with."""
    from pytest_eagle3.sglang_source.install import sglang_location_and_version

    location, _ = sglang_location_and_version()
    if location is None or not id_keys.has_draft_model(location, MLA_ARCHITECTURE):
        pytest.skip("needs an installed SGLang with srt/models/kimi_k25_eagle3.py")
    assert "norm_before_fc" not in id_keys.flags_read(location, MLA_ARCHITECTURE)
    assert {"fc_norm", "norm_output"} <= id_keys.flags_read(location, MLA_ARCHITECTURE)
    d = _fake_mla(tmp_path / "d", config={"norm_before_fc": True})
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(d, 256, 2048, sglang_location=location)
    msg = _one_line(exc)
    assert "sets norm_before_fc" in msg and "srt/models/kimi_k25_eagle3.py" in msg
    assert validate_draft(_fake_mla(tmp_path / "ok", flags={"fc_norm": True}), 256, 2048, sglang_location=location)
