"""Which EAGLE-3 model files of an SGLang the suite runs (``target/family_coverage.py``),
and what each file says (``sglang_source/family_files.py``): fakes pin each capture
site and need; the last tests read the installed SGLang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_eagle3.sglang_source.capture_loop import SITE_APPEND, SITE_BOUNDARY, SITE_FLAGS
from pytest_eagle3.sglang_source.family_files import read_family_files
from pytest_eagle3.target.family_coverage import NOT_RUN, RUN, coverage, preset_architectures, summary

#: A causal-LM class with SGLang's always-+1 rule around an inner model whose
#: forward captures as ``{capture}`` says.
TEMPLATE = '''
{imports}
import torch


class {arch}Model(torch.nn.Module):
    def __init__(self, config):
        self.layers = []
        self.layers_to_capture = []

    def forward(self, input_ids, positions, forward_batch):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        aux_hidden_states = []
        for i in range(len(self.layers)):
            layer = self.layers[i]
{capture}
        return hidden_states, aux_hidden_states


class {arch}(torch.nn.Module):
    def __init__(self, config):
        self.config = config
        self.model = {arch}Model(config)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None:
            num_layers = self.config.num_hidden_layers
            self.model.layers_to_capture = [2, num_layers // 2, num_layers - 3]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]


EntryClass = [{arch}]
'''

BOUNDARY = '''            hidden_states, residual = layer(
                hidden_states, residual,
                capture_output=aux_hidden_states.capture if i in self.layers_to_capture else None)'''
APPEND = '''            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states)
            hidden_states, residual = layer(hidden_states, residual)'''
FLAGS = '''            hidden_states = layer(
                hidden_states,
                captured_last_layer_outputs=aux_hidden_states
                if getattr(layer, "_is_layer_to_capture", False) else None)'''


def _write(models: Path, name: str, arch: str, capture: str, imports: str = "") -> None:
    (models / f"{name}.py").write_text(TEMPLATE.format(arch=arch, capture=capture, imports=imports), encoding="utf-8")


@pytest.fixture()
def fake_sglang(tmp_path: Path) -> Path:
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    _write(models, "qwen2", "Qwen2ForCausalLM", BOUNDARY)
    _write(models, "gemma_like", "FakeAppendForCausalLM", APPEND)
    _write(models, "moe_like", "FakeFlagsForCausalLM", FLAGS,
           imports="from sglang.kernels.ops.moe.ep_moe_kernels import zero_experts_compute_triton")
    (models / "no_eagle.py").write_text("class Plain:\n    pass\n\nEntryClass = [Plain]\n", encoding="utf-8")
    return tmp_path / "sglang"


def test_every_file_with_the_method_is_read_with_its_site_and_needs(fake_sglang: Path):
    files = {f.file: f for f in read_family_files(fake_sglang)}
    assert sorted(files) == ["srt/models/gemma_like.py", "srt/models/moe_like.py", "srt/models/qwen2.py"]
    boundary, append, flags = (files[f"srt/models/{n}.py"] for n in ("qwen2", "gemma_like", "moe_like"))
    assert boundary.site[0] == SITE_BOUNDARY and "aux_hidden_states.capture" in boundary.site[2]
    assert append.site[0] == SITE_APPEND and append.site[2] == "hidden_states"
    assert flags.site[0] == SITE_FLAGS and "_is_layer_to_capture" in flags.site[2]
    assert boundary.rule.kind == "always +1"
    assert boundary.default_ids_text() == "layers_to_capture [2, 4, 5] on 8 layers"
    assert [n[0] for n in flags.needs] == ["zero-experts"]
    assert flags.needs[0][1] == "srt/models/moe_like.py:2"
    assert boundary.needs == () and append.needs == ()


NAMED = '''            capture_output = (
                aux_hidden_states.capture if i in self.layers_to_capture else None)
            hidden_states = layer(hidden_states, capture_output=capture_output)'''


def test_a_wrapper_whose_language_model_class_is_a_parameter_default_is_read(tmp_path: Path):
    """0.5.23 ``srt/models/qwen3_vl.py``: ``self.model = language_model_cls(...)`` with
    ``language_model_cls=Qwen3LLMModel``, and the loop names the capture choice before
    handing it to the layer."""
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    text = TEMPLATE.format(arch="FakeVL", capture=NAMED, imports="")
    text = text.replace("    def __init__(self, config):\n        self.config = config\n        self.model = FakeVLModel(config)",
                        "    def __init__(self, config, language_model_cls=FakeVLModel):\n"
                        "        self.config = config\n        self.model = language_model_cls(config)")
    assert "language_model_cls(config)" in text
    (models / "fake_vl.py").write_text(text, encoding="utf-8")
    (found,) = read_family_files(tmp_path / "sglang")
    assert found.rule.known and found.rule.kind == "always +1"
    assert found.site[0] == SITE_BOUNDARY and found.site[2].startswith("capture_output=aux_hidden_states.capture if")


def test_a_body_held_in_a_class_attribute_and_a_subclass_default_are_followed(tmp_path: Path):
    """0.5.23 ``srt/models/qwen3_5_text.py``: ``self.model = self.body_cls(...)`` with
    ``body_cls = body.FakeBody`` (another file); ``srt/models/qwen3_5.py``: a subclass
    whose ``__init__`` only sets ``language_model_cls`` and hands it to its base's."""
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (models / "body.py").write_text(TEMPLATE.format(arch="FakeBody", capture=FLAGS, imports=""), encoding="utf-8")
    (models / "text.py").write_text(
        "import torch\nfrom sglang.srt.models import body\n\n\n"
        "class FakeText(torch.nn.Module):\n    body_cls = body.FakeBodyModel\n\n"
        "    def __init__(self, config):\n        self.config = config\n"
        "        self.model = self.body_cls(config)\n\n"
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
        "        self.model.layers_to_capture = [v + 1 for v in (layer_ids or [1, 3, 4])]\n\n\n"
        "EntryClass = [FakeText]\n", encoding="utf-8")
    base = TEMPLATE.format(arch="FakeVL", capture=BOUNDARY, imports="").replace(
        "    def __init__(self, config):\n        self.config = config\n        self.model = FakeVLModel(config)",
        "    def __init__(self, config, language_model_cls=FakeVLModel):\n"
        "        self.config = config\n        self.model = language_model_cls(config)")
    (models / "vl.py").write_text(base, encoding="utf-8")
    (models / "sub.py").write_text(
        "from sglang.srt.models.vl import FakeVL\nfrom sglang.srt.models.body import FakeBodyModel\n\n\n"
        "class FakeSub(FakeVL):\n"
        "    def __init__(self, config, language_model_cls=FakeBodyModel):\n"
        "        super().__init__(config, language_model_cls)\n\n\n"
        "class Inner:  # the file defines the method elsewhere, as qwen3_5.py's body does\n"
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n        pass\n\n\n"
        "EntryClass = [FakeSub]\n", encoding="utf-8")
    files = {f.file: f for f in read_family_files(tmp_path / "sglang")}
    assert files["srt/models/text.py"].site[0] == SITE_FLAGS
    assert files["srt/models/vl.py"].site[0] == SITE_BOUNDARY
    assert files["srt/models/sub.py"].site[0] == SITE_FLAGS  # the subclass's default, not the base's


def test_a_file_is_run_where_a_preset_serves_its_architecture_else_it_says_why(fake_sglang: Path):
    assert "tiny-qwen2" in preset_architectures()["Qwen2ForCausalLM"]
    items = {c.family.file: c for c in coverage(fake_sglang)}
    qwen2 = items["srt/models/qwen2.py"]
    assert qwen2.status == RUN and qwen2.reason() == ""
    assert qwen2.lines()[0].startswith("srt/models/qwen2.py [Qwen2ForCausalLM]: run: --eagle3-target tiny-qwen2")
    flags = items["srt/models/moe_like.py"]
    assert flags.status == NOT_RUN
    assert "zero-compute experts" in flags.reason() and "(srt/models/moe_like.py:2)" in flags.reason()
    assert "defines none of FakeFlagsForCausalLM: no reference" in flags.reason()
    assert summary(list(items.values())) == (
        "the suite runs 1 of 3 EAGLE-3 model files of this SGLang (set_eagle3_layers_to_capture)")


def _installed() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("SGLang is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def test_the_installed_sglang_lists_every_file_that_defines_the_method():
    location = _installed()
    defining = sorted(f"srt/models/{p.name}" for p in (location / "srt" / "models").glob("*.py")
                      if "def set_eagle3_layers_to_capture" in p.read_text(encoding="utf-8"))
    items = coverage(location)
    assert [c.family.file for c in items] == defining
    for c in items:
        assert c.status == RUN or c.reason(), c.family.file
    presets = preset_architectures()
    for c in items:
        assert (c.status == RUN) == any(a in presets for a in c.family.architectures)


def test_info_families_prints_every_file():
    _installed()
    proc = subprocess.run([sys.executable, "-m", "pytest_eagle3.cli.main", "info", "--families"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "EAGLE-3 model files of this SGLang" in proc.stdout
    assert "srt/models/deepseek_v2.py [" in proc.stdout and ": run: --eagle3-target" in proc.stdout
    assert "\n    capture site: " in proc.stdout
