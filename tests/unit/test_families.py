"""The model-family presets (Llama, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, gpt-oss, Gemma 3, Gemma 4,
GLM-4.5, GLM-4.7-Flash, MiniMax-M2):
their checkpoints, the CPU pieces they need, the Gemma 3 diagnosis, ``--eagle3-target families``.

Checkpoints are built with transformers (a subprocess per build); nothing here
starts SGLang (tests/e2e/test_family_suites.py does).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pytest_eagle3.engine.cpu import recipe  # noqa: E402
from pytest_eagle3.worker.cpu import SHIM_DIR  # noqa: E402
from pytest_eagle3.errors import Eagle3ConfigError  # noqa: E402
from pytest_eagle3.plugin.families import child_args, family_presets, worst  # noqa: E402
from pytest_eagle3.target.checkpoint import builder  # noqa: E402
from pytest_eagle3.target.checkpoint.cache import ensure_checkpoint  # noqa: E402
from pytest_eagle3.target.checkpoint.families import FAMILIES  # noqa: E402
from pytest_eagle3.target.spec import TargetSpec  # noqa: E402
from pytest_eagle3.verdicts.diagnose import diagnose_slot  # noqa: E402
from pytest_eagle3.verdicts.evidence import Evidence  # noqa: E402

FAMILY_PRESETS = ["tiny-apertus", "tiny-exaone-moe", "tiny-gemma3", "tiny-gemma3-mm", "tiny-gemma4", "tiny-gemma4-mm", "tiny-glm4-moe",
                  "tiny-glm4-moe-lite", "tiny-gpt-oss", "tiny-llama", "tiny-minimax-m2", "tiny-qwen2", "tiny-qwen2-5-vl",
                  "tiny-qwen2-moe", "tiny-qwen3", "tiny-qwen3-5", "tiny-qwen3-5-mm", "tiny-qwen3-moe", "tiny-qwen3-next", "tiny-qwen3-vl"]


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("family-cache")


def test_every_family_has_a_preset_and_families_lists_them():
    assert family_presets() == FAMILY_PRESETS
    types = {TargetSpec.preset(p).config["model_type"] for p in FAMILY_PRESETS}
    assert types == set(FAMILIES)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_family_build_is_deterministic(tmp_path: Path):
    spec = TargetSpec.preset("tiny-gpt-oss")
    builder.build_checkpoint(spec, tmp_path / "a")
    builder.build_checkpoint(spec, tmp_path / "b")
    assert _sha(tmp_path / "a" / "model.safetensors") == _sha(tmp_path / "b" / "model.safetensors")
    info = json.loads((tmp_path / "a" / "build_info.json").read_text())
    assert len(info["branch_scales"]) == spec.config["num_hidden_layers"]
    assert not (tmp_path / "a" / "scales.json").exists()


#: One preset per kind of layer stack the init scales (dense, MoE, MLA, hybrid linear
#: attention, sandwich norms, sinks): the rest run with --eagle3-slow (each loads its model, ~6 s).
TOLD_APART_IN_CI = ("tiny-llama", "tiny-qwen3-moe", "tiny-glm4-moe-lite", "tiny-qwen3-next", "tiny-gemma3",
                    "tiny-gpt-oss")


@pytest.mark.parametrize("preset", [p if p in TOLD_APART_IN_CI else pytest.param(
    p, marks=pytest.mark.slow(reason="one preset per layer stack runs by default")) for p in FAMILY_PRESETS])
def test_family_layers_can_be_told_apart(preset: str, cache_root: Path):
    """The distinguishable-layers init holds on every family: any two residual-stream
    snapshots of a prompt differ by relative L2 >= 0.4 (docs/design.md,
    "Reduced-layer targets that can tell layers apart")."""
    from transformers import AutoConfig

    from pytest_eagle3.target.checkpoint.family_worker import model_class

    path = ensure_checkpoint(TargetSpec.preset(preset), cache_root)
    cls = model_class(AutoConfig.from_pretrained(str(path)))
    model = cls.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    tokens = torch.randint(0, 2048, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hs = model(input_ids=tokens, output_hidden_states=True).hidden_states
    worst_rel = min(float((hs[i] - hs[j]).norm() / hs[j].norm())
                    for i in range(len(hs) - 1) for j in range(i + 1, len(hs) - 1))
    assert worst_rel >= 0.4, f"{preset}: two snapshots are {worst_rel:.3f} apart"


@pytest.mark.parametrize("preset", ["tiny-gemma3-mm", "tiny-qwen2-5-vl"])
def test_a_multimodal_checkpoint_holds_the_processor_sglang_loads(preset: str, cache_root: Path):
    """A multimodal wrapper's checkpoint carries the processor SGLang loads at start
    (AutoProcessor on the model path), its special tokens at the config's ids, and
    the weights under the names SGLang's loader reads."""
    from safetensors import safe_open
    from transformers import AutoProcessor

    from pytest_eagle3.target.checkpoint.families import language_config
    from pytest_eagle3.verdicts.evidence import layer_norms

    spec = TargetSpec.preset(preset)
    path = ensure_checkpoint(spec, cache_root)
    processor = AutoProcessor.from_pretrained(str(path))
    family = FAMILIES[spec.config["model_type"]]
    assert type(processor).__name__ == family.processor.cls
    for _attr, token, key in family.processor.tokens:
        assert processor.tokenizer.convert_tokens_to_ids(token) == spec.config[key]
    assert processor.tokenizer.convert_tokens_to_ids("<t7>") == 7
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert not [n for n in names if n.startswith("vision_tower.") and ".vision_model." not in n]
    norms, _eps = layer_norms(path)
    assert norms.shape == (language_config(spec.config)["num_hidden_layers"], 256)


def test_a_processor_with_clashing_or_out_of_range_token_ids_is_refused(tmp_path: Path):
    from pytest_eagle3.target.checkpoint.family_worker import write_processor

    spec = TargetSpec.preset("tiny-gemma3-mm")
    processor = FAMILIES["gemma3"].processor
    for bad in ({"boi_token_index": spec.config["eoi_token_index"]}, {"image_token_index": 2048}):
        with pytest.raises(ValueError, match="must be distinct integers below the vocabulary size 2048"):
            write_processor(processor, {**spec.config, **bad}, tmp_path)
    assert not list(tmp_path.iterdir())


def test_gpt_oss_routing_is_pinned_through_the_router_bias(cache_root: Path):
    from safetensors.torch import load_file

    spec = TargetSpec.preset("tiny-gpt-oss")
    sd = load_file(str(ensure_checkpoint(spec, cache_root) / "model.safetensors"))
    bias = sd["model.layers.1.mlp.router.bias"]
    assert sorted(bias.nonzero().flatten().tolist()) == [2, 3] and float(bias.max()) == spec.init.router_bias
    assert float(sd["model.layers.1.mlp.router.weight"].abs().max()) < 0.1
    sinks = sd["model.layers.0.self_attn.sinks"]
    assert torch.equal(sinks, sinks.to(torch.bfloat16).float())  # SGLang keeps sinks in bf16


def test_unknown_family_is_one_line(tmp_path: Path):
    from pytest_eagle3.target.spec import targets_dir

    data = json.loads((targets_dir() / "tiny-llama.json").read_text())
    data["config"].update(model_type="mamba", architectures=["MambaForCausalLM"])
    spec = TargetSpec.from_dict(data)
    with pytest.raises(Eagle3ConfigError, match="no family 'mamba'.*families.py"):
        builder.build_checkpoint(spec, tmp_path / "x")


# --- the CPU stand-in's sliding window and sinks --------------------------------


@pytest.fixture(scope="module")
def sk():
    sys.path.insert(0, str(SHIM_DIR))
    try:
        sys.modules.pop("sgl_kernel", None)
        yield importlib.import_module("sgl_kernel")
    finally:
        sys.path.remove(str(SHIM_DIR))
        sys.modules.pop("sgl_kernel", None)


def _naive(q, k, v, scale, positions, window, sinks):
    """Direct softmax per query: query i at positions[i] sees keys p - window < key <= p."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2])
    for i, p in enumerate(positions):
        lo = max(0, p - window + 1) if window else 0
        s = torch.einsum("hd,nhd->hn", q[i], k[lo:p + 1]) * scale
        if sinks is not None:
            s = torch.cat([s, sinks[:, None]], dim=1)
        w = s.softmax(-1)[:, : p + 1 - lo]
        out[i] = torch.einsum("hn,nhd->hd", w, v[lo:p + 1])
    return out


@pytest.mark.parametrize("window,use_sinks", [(4, False), (0, True), (4, True)])
def test_extend_and_decode_honour_window_and_sinks(sk, window: int, use_sinks: bool):
    g = torch.Generator().manual_seed(3)
    H, Hkv, D, n = 4, 2, 8, 11
    kb, vb = torch.zeros(32, Hkv, D), torch.zeros(32, Hkv, D)
    k, v, q = torch.randn(n, Hkv, D, generator=g), torch.randn(n, Hkv, D, generator=g), torch.randn(n, H, D, generator=g)
    sinks = torch.randn(H, generator=g) if use_sinks else None
    req_to_token = torch.arange(32).int().view(1, 32)
    out = torch.empty(n, H, D)
    kb[:n], vb[:n] = k, v
    sk.extend_attention_cpu(q, k, v, out, kb, vb, 1.0, 1.0, req_to_token, torch.tensor([0]), torch.tensor([n]),
                            torch.tensor([n]), torch.tensor([0]), n, 0.5, 0.0, False, window, None, sinks, None, True)
    torch.testing.assert_close(out, _naive(q, k, v, 0.5, list(range(n)), window, sinks))
    one = torch.empty(1, H, D)
    sk.decode_attention_cpu(q[-1:], kb, vb, 1.0, 1.0, one, None, None, torch.tensor([n - 1]), None, req_to_token,
                            torch.tensor([0]), torch.tensor([n]), 0.5, 0.0, False, window, None, sinks)
    torch.testing.assert_close(one, _naive(q[-1:], k, v, 0.5, [n - 1], window, sinks))


def test_plain_attention_refusal_is_read_from_the_installed_code(tmp_path: Path):
    hook = tmp_path / "srt" / "arg_groups" / "model_hook.py"
    hook.parent.mkdir(parents=True)
    hook.write_text('x = 1\nassert ok, (\n    f"GptOssForCausalLM requires one of {b} attention backend"\n)\n')
    assert recipe.refuses_plain_attention(tmp_path, "GptOssForCausalLM") == "srt/arg_groups/model_hook.py:3"
    assert recipe.refuses_plain_attention(tmp_path, "LlamaForCausalLM") is None
    assert recipe.refuses_plain_attention(tmp_path / "missing", "GptOssForCausalLM") is None
    # Gemma 4's form (0.5.23 model_hook.py:636-659): a branch on model_arch in (...) asserting a backend list.
    hook.write_text(
        'if model_arch in ("X",):\n    pass\n'
        'elif model_arch in ("Gemma4ForCausalLM", "Y"):\n'
        '    accepted = ("triton", "intel_amx")\n'
        '    assert b in accepted, "Gemma4 only supports ..."\n'
        'elif model_arch in ("LlamaForCausalLM",):\n'
        '    accepted = ("torch_native", "intel_amx")\n'
        '    assert b in accepted\n')
    assert recipe.refuses_plain_attention(tmp_path, "Gemma4ForCausalLM") == "srt/arg_groups/model_hook.py:5"
    assert recipe.refuses_plain_attention(tmp_path, "LlamaForCausalLM") is None  # torch_native is accepted
    assert recipe.refuses_plain_attention(tmp_path, "X") is None  # no assertion
    args = recipe.cpu_server_args(amx_attention=True)
    assert args["attention_backend"] == recipe.SPECULATIVE_ATTENTION


def test_linear_attention_engines_are_read_from_the_config_and_the_installed_code(tmp_path: Path):
    """A hybrid delta-net config gets a float32 conv window and, where the installed
    SGLang refuses the mamba cache's extra buffer off GPU, the overlap schedule off."""
    hybrid = {"layer_types": ["linear_attention", "full_attention"]}
    wrapper = {"text_config": hybrid}
    assert recipe.has_linear_attention(hybrid) and recipe.has_linear_attention(wrapper)
    assert not recipe.has_linear_attention({"layer_types": ["full_attention", "sliding_attention"]})
    assert recipe.linear_attention_env(hybrid) == {recipe.MAMBA_CONV_DTYPE_ENV: "float32"}
    assert recipe.linear_attention_env({}) == {}
    hook = tmp_path / "srt" / "arg_groups" / "mamba_hook.py"
    hook.parent.mkdir(parents=True)
    hook.write_text('def f():\n    assert ok, (\n        "extra_buffer requires platform support for Mamba cache."\n    )\n')
    assert recipe.refuses_mamba_overlap(tmp_path, hybrid) == "srt/arg_groups/mamba_hook.py:3"
    assert recipe.refuses_mamba_overlap(tmp_path, {}) is None
    assert recipe.refuses_mamba_overlap(tmp_path / "missing", hybrid) is None


def test_delta_net_fills_touch_only_their_names():
    if torch.cuda.is_available():
        pytest.skip("the fills apply only where CUDA is absent")
    from pytest_eagle3.worker.cpu import family_kernels

    seen = {}

    class Net:
        def __init__(self) -> None:
            seen["module"] = torch.get_device_module()

    module = types.SimpleNamespace(__name__="sglang.srt.models.qwen3_next", Qwen3GatedDeltaNet=Net)
    outside = torch.get_device_module()
    family_kernels.delta_net_device(module)
    family_kernels.delta_net_device(module)  # idempotent
    Net()
    assert seen["module"] is torch.cpu and torch.get_device_module() is outside
    assert Net.__init__._pytest_eagle3_cpu_device
    norm = types.SimpleNamespace(__name__="sglang.kernels.ops.attention.fla.fused_norm_gate", _use_cpu=False)
    family_kernels.delta_net_norm(norm)
    assert norm._use_cpu is True
    other = types.SimpleNamespace(__name__="x")
    family_kernels.delta_net_norm(other)
    family_kernels.delta_net_device(other)
    assert not hasattr(other, "_use_cpu")


# --- the Gemma 3 diagnosis ---------------------------------------------------------


def test_reference_details_name_gemmas_normed_mlp_branch(cache_root: Path):
    from pytest_eagle3.target.reference_worker import run_details

    path = ensure_checkpoint(TargetSpec.preset("tiny-gemma3"), cache_root)
    out, meta = run_details(path, [[1, 2, 3, 4, 5]], "float32", tp=2)
    assert meta["mlp_what"] == "the MLP output of layer {layer} after its post_feedforward_layernorm"
    assert meta["tp"] == "1" and "partial_0000" not in out  # no rank shares through a norm
    assert out["mlp_0000"].shape == (8, 5, 256)


def test_diagnosis_says_a_slot_holds_the_normed_mlp_branch():
    g = torch.Generator().manual_seed(0)
    L, T, H = 4, 5, 16
    reference = torch.randn(L + 2, T, H, generator=g)
    mlp = torch.randn(L, T, H, generator=g)
    what = "the MLP output of layer {layer} after its post_feedforward_layernorm"
    found = diagnose_slot(mlp[1].clone(), reference, 2, num_layers=L, tol=1e-4,
                          evidence=Evidence(mlp=mlp, mlp_what=what))
    assert found is not None
    kind, text, why, err = found
    assert kind == "no-residual" and text == "the MLP output of layer 1 after its post_feedforward_layernorm"
    assert "keeps the residual separate" in why and err < 1e-6


def test_worst_exit_status_of_the_family_runs():
    assert worst([0, 0]) == 0
    assert worst([0, 1, 5]) == 1
    assert worst([1, 4]) == 4
    assert worst([5, 5]) == 5
    assert worst([]) == 5
    assert worst([0, -9]) == 3 and worst([137]) == 3  # killed by a signal


def test_a_family_the_installed_transformers_lacks_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from dataclasses import replace

    from pytest_eagle3.target.checkpoint import families

    monkeypatch.setitem(families.FAMILIES, "llama", replace(FAMILIES["llama"], transformers_dir="no_such_model"))
    with pytest.raises(Eagle3ConfigError, match=r"tiny-llama \(llama\) needs transformers' models/no_such_model/"):
        builder.build_checkpoint(TargetSpec.preset("tiny-llama"), tmp_path / "x")


def _plan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_EAGLE3_")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "pytest_eagle3.suite", "--eagle3-plan",
                           "-p", "no:cacheprovider", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_families_runs_one_pytest_per_family_preset(tmp_path: Path):
    pytest.importorskip("sglang")
    proc = _plan("--eagle3-target", "families", "--tp", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for i, preset in enumerate(FAMILY_PRESETS, 1):
        assert f"=== eagle3 family {preset} ({i}/{len(FAMILY_PRESETS)}):" in proc.stdout
        assert re.search(rf"^eagle3 family {preset}: passed \(exit 0, \d+ s\)$", proc.stdout, re.M), proc.stdout[-2000:]
    # The Qwen files that set per-layer flags reject an id = L list at setup: one line, no engine.
    assert "fails at engine setup (IndexError: list index out of range in srt/models/qwen3_moe.py" in proc.stdout
    # Before the children: how many of the installed SGLang's EAGLE-3 model files the presets
    # cover, and one line per file they do not, with why.
    assert re.search(r"^eagle3 families: the suite runs \d+ of \d+ EAGLE-3 model files", proc.stdout, re.M)
    assert re.search(r"^eagle3 family file not run: srt/models/mindspore.py: needs MindSpore", proc.stdout, re.M)


def test_an_architecture_without_eagle3_capture_is_one_line(tmp_path: Path):
    pytest.importorskip("sglang")
    from pytest_eagle3.target.spec import targets_dir

    config = json.loads((targets_dir() / "tiny-llama.json").read_text())["config"]
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    proc = _plan("--eagle3-target", str(tmp_path / "ckpt"), "--tp", "1", cwd=tmp_path)
    assert "eagle3: GPT2LMHeadModel has no EAGLE-3 aux capture in this SGLang: srt/models/gpt2.py" in proc.stdout
    assert re.search(r"^\d+ left out: sglang \S+ \(.*\) cannot serve EAGLE-3 for GPT2LMHeadModel", proc.stdout, re.M)


def test_the_recorder_hooks_the_forward_that_captures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each family's capturing forward is read from the installed model file and
    handed to the per-rank recorder through the engine's environment."""
    sglang = pytest.importorskip("sglang")
    from pytest_eagle3.engine.config import build_engine_config
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.sglang_source.model_code import read_rules
    from pytest_eagle3.worker.env import RECORD_TARGET_ENV
    from pytest_eagle3.target.spec import targets_dir

    location = str(Path(sglang.__file__).parent)
    want = {"Gemma3ForCausalLM": "sglang.srt.models.gemma3_causal.Gemma3TextModel.forward",
            "Qwen3MoeForCausalLM": "sglang.srt.models.qwen2_moe.Qwen2MoeModel.forward",
            "GptOssForCausalLM": "sglang.srt.models.gpt_oss.GptOssModel.forward",
            "DeepseekV3ForCausalLM": "sglang.srt.models.deepseek_v2.DeepseekV2Model.forward"}
    for arch, forward in want.items():
        assert read_rules(location, arch).capture_forward == forward
    flags = frozenset({"model-path", "tp-size", "device", "attention-backend", "dtype"})
    inst = SGLangInstall("0.5.23", location, flags, sys.executable)
    for preset, expected in (("tiny-gemma3", want["Gemma3ForCausalLM"]), ("tiny-dsv3", None)):
        ckpt = tmp_path / preset
        ckpt.mkdir()
        (ckpt / "config.json").write_text(json.dumps(json.loads((targets_dir() / f"{preset}.json").read_text())["config"]))
        env = build_engine_config(inst, model_path=str(ckpt), tp=1, device="cpu").env_dict()
        assert env.get(RECORD_TARGET_ENV) == expected  # DeepSeek keeps the recorder's default (same engine key)


ONE_CAUSE_TESTS = '''
import pytest
from types import SimpleNamespace
from pytest_eagle3.suite.outcome import fail_if_bad


def report(layer):
    line = f"slot 0 holds the MLP output of layer {layer} after its post_feedforward_layernorm (rel.err 3e-07): why"
    diag = SimpleNamespace(slot_lines={0: line}, pattern_lines=(), kinds=("no-residual",))
    return SimpleNamespace(ok=False, diagnosis=diag, wrong=[SimpleNamespace(slot=0)],
                           message=lambda verbose=False: "aux hidden states: 1 of 1 slots wrong\\n" + line)


def rank_report():
    return SimpleNamespace(ok=False, slot_reports=[report(5), report(5)], message=lambda verbose=False: "ranks")


def other():
    diag = SimpleNamespace(slot_lines={0: "slot 0 holds something else (rel.err 1e-07): why"}, pattern_lines=(),
                           kinds=("x",))
    return SimpleNamespace(ok=False, diagnosis=diag, wrong=[SimpleNamespace(slot=0)],
                           message=lambda verbose=False: "other cause")


def test_a(pytestconfig):
    fail_if_bad(report(1), config=pytestconfig)


def test_b(pytestconfig):
    fail_if_bad(report(3), config=pytestconfig)


def test_c(pytestconfig):
    fail_if_bad(rank_report(), config=pytestconfig)


def test_d(pytestconfig):
    fail_if_bad(other(), config=pytestconfig)
'''


def test_one_root_cause_one_failure(pytester: pytest.Pytester):
    """The first test with a named capture defect reports it in full; later ones
    with the same defect (other layers, other ranks) point to it; another defect
    is reported in full."""
    pytester.makepyfile(test_causes=ONE_CAUSE_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(failed=4)
    out = result.stdout.str()
    assert "aux hidden states: 1 of 1 slots wrong" in out  # test_a in full
    # count the failure sections' lines: the short summary is cut to the
    # terminal width except on CI (pytest's running_on_ci), so counting it
    # would pass here and fail there
    pointers = [line for line in result.outlines
                if line.startswith("same cause as test_causes.py::test_a, which reports it in full")]
    assert len(pointers) == 2, out  # test_b, test_c
    assert "other cause" in out  # test_d in full


def test_last_layer_capture_is_read_from_the_model_file():
    """gpt-oss and Gemma 3 capture layer index L (the last layer's output); the
    others never reach it.  gpt-oss keeps [5, 6, 8] as given, so 8 is final_prenorm."""
    sglang = pytest.importorskip("sglang")
    from pytest_eagle3.conventions import predict
    from pytest_eagle3.sglang_source.model_code import read_rules

    location = str(Path(sglang.__file__).parent)
    rules = {a: read_rules(location, a).rule for a in ("GptOssForCausalLM", "Gemma3ForCausalLM",
                                                      "LlamaForCausalLM", "DeepseekV3ForCausalLM")}
    assert rules["GptOssForCausalLM"].last_layer.startswith("srt/models/gpt_oss.py:")
    assert rules["Gemma3ForCausalLM"].last_layer.startswith("srt/models/gemma3_causal.py:")
    assert rules["LlamaForCausalLM"].last_layer == rules["DeepseekV3ForCausalLM"].last_layer == ""
    gpt = predict([5, 6, 8], 8, rules["GptOssForCausalLM"])
    assert gpt.snapshots == (5, 6, 9) and not gpt.fails_at_first_forward  # 9 = final_prenorm on 8 layers
    assert predict([5, 6, 8], 8, rules["DeepseekV3ForCausalLM"]).missing == (8,)
    assert predict([5, 6, 8], 8, rules["Gemma3ForCausalLM"]).missing == (9,)  # +1 asks layer 9 of 8


def test_each_family_child_writes_its_own_output_files(pytester: pytest.Pytester):
    """``--junitxml`` (and ``--eagle3-report``) get the preset in their name in
    each child, so the six families do not overwrite one file."""
    config = pytester.parseconfig("--eagle3-target", "families", "--junitxml", "out/junit.xml", "-q")
    args = child_args(config, "tiny-llama", Path("r/report.json"))
    invoked = list(config.invocation_params.args)  # pytester adds --basetemp
    assert args[:len(invoked)] == invoked
    assert args[len(invoked):] == ["--eagle3-target", "tiny-llama", "--eagle3-report", "r/report-tiny-llama.json",
                                   "--junitxml=out/junit-tiny-llama.xml"]
    plain = pytester.parseconfig("--eagle3-target", "families")
    assert child_args(plain, "tiny-qwen3", None) == [*plain.invocation_params.args, "--eagle3-target", "tiny-qwen3"]
