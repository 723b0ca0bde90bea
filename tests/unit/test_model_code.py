"""The rule reader (``sglang_source/model_code.py``): SGLang's own ``set_eagle3_layers_to_capture``
and capture loop, read from a model file, never from a version number.

Fakes written by these tests (``tests/fake_model_files.py``) pin each kind of
rule and each way the reader gives up; the last tests run the reader on every
model file of the installed SGLang that defines the method and compare it with
the real, imported method for several id lists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_model_files import ALWAYS, FIRST_IS_ONE, write_deepseek_file
from pytest_eagle3.conventions import (
    ALWAYS_PLUS_ONE,
    AS_GIVEN_IF_MAX_IS_L,
    PLUS_ONE_IF_FIRST_IS_ONE,
    UNKNOWN,
    predict,
)
from pytest_eagle3.sglang_source.model_code import read_rules

ARCH = "DeepseekV3ForCausalLM"
ROOT = Path(__file__).resolve().parents[2]


def _models_dir(tmp_path: Path) -> Path:
    """``<tmp>/sglang/srt/models``: where a fake SGLang package keeps its model files."""
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True, exist_ok=True)
    return models


def test_always_plus_one_and_no_layer0_capture_are_read_from_the_file(tmp_path):
    path = write_deepseek_file(tmp_path / "sglang", ALWAYS, layer0=False)
    code = read_rules(tmp_path / "sglang", ARCH)
    rule = code.rule
    assert code.file == "srt/models/deepseek_v2.py"
    assert rule.kind == ALWAYS_PLUS_ONE and rule.from_code
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "def set_eagle3_layers_to_capture" in t)
    assert rule.source == f"srt/models/deepseek_v2.py:{line} (DeepseekV2ForCausalLM.set_eagle3_layers_to_capture)"
    assert predict([0, 3, 5], 8, rule).snapshots == (1, 4, 6)
    assert rule.embedding.capturable is False
    assert "residual is None before layer 0" in rule.embedding.why


def test_first_id_rule_and_layer0_capture_in_the_layer(tmp_path):
    write_deepseek_file(tmp_path / "sglang", FIRST_IS_ONE, layer0=True)
    rule = read_rules(tmp_path / "sglang", ARCH).rule
    assert rule.kind == PLUS_ONE_IF_FIRST_IS_ONE
    assert predict([0, 3, 5], 8, rule).snapshots == (0, 3, 5)
    assert predict([1, 3, 4], 8, rule).snapshots == (2, 4, 5)
    assert rule.embedding.capturable is True
    assert not predict([0, 3, 5], 8, rule).fails_at_first_forward


def test_the_rule_runs_for_any_layer_count(tmp_path):
    write_deepseek_file(tmp_path / "sglang", ALWAYS, layer0=False)
    rule = read_rules(tmp_path / "sglang", ARCH).rule
    assert predict([2, 30, 58], 61, rule).layers_to_capture == (3, 31, 59)
    assert predict(None, 61, rule).layers_to_capture == (2, 30, 58)
    assert predict([0, 3, 5], 8, rule).embedding_fails is False  # +1: layer 0 never asked for
    assert predict([-1, 2, 4], 8, rule).embedding_fails is True  # -1 + 1 = layer 0, which fails


def test_a_fork_number_does_not_change_the_rule(tmp_path):
    """The installed code decides: a fork numbered like a new upstream release keeps its own rule."""
    from pytest_eagle3.sglang_source.install import SGLangInstall

    write_deepseek_file(tmp_path / "sglang", ALWAYS, layer0=False)
    fork = SGLangInstall("0.7.2", str(tmp_path / "sglang"), frozenset(), sys.executable)
    assert fork.id_rule(ARCH).kind == ALWAYS_PLUS_ONE
    assert predict([0, 3, 5], 8, "0.7.2").snapshots == (0, 3, 5)  # what the version table alone would say


def test_own_rule_of_a_model_file_is_named(tmp_path):
    models = _models_dir(tmp_path)
    (models / "gptlike.py").write_text(
        "class GptLikeForCausalLM:\n"
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
        "        n = self.config.num_hidden_layers\n"
        "        if layer_ids is None:\n"
        "            self.model.layers_to_capture = [2, n // 2, n - 3]\n"
        "        elif max(layer_ids) == n:\n"
        "            self.model.layers_to_capture = list(layer_ids)\n"
        "        else:\n"
        "            self.model.layers_to_capture = [v + 1 for v in layer_ids]\n"
        "EntryClass = GptLikeForCausalLM\n")
    rule = read_rules(tmp_path / "sglang", "GptLikeForCausalLM").rule
    assert rule.kind == AS_GIVEN_IF_MAX_IS_L
    assert predict([2, 4, 8], 8, rule).layers_to_capture == (2, 4, 8)
    assert rule.embedding.capturable is None  # no inner model found: unknown, measured


def test_delegation_to_the_language_model_is_followed(tmp_path):
    pkg = tmp_path / "sglang"
    write_deepseek_file(pkg, ALWAYS, layer0=False)
    (pkg / "srt" / "models" / "kimi_like.py").write_text(
        "from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM\n\n"
        "class KimiLike:\n"
        "    def __init__(self, config):\n"
        "        self.language_model = DeepseekV3ForCausalLM(config)\n\n"
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
        "        self.language_model.set_eagle3_layers_to_capture(layer_ids)\n\n"
        "EntryClass = [KimiLike]\n")
    rule = read_rules(pkg, "KimiLike").rule
    assert rule.kind == ALWAYS_PLUS_ONE
    assert rule.source.startswith("srt/models/kimi_like.py:7 (KimiLike.set_eagle3_layers_to_capture) -> "
                                  "srt/models/deepseek_v2.py:")
    assert rule.embedding.capturable is False


@pytest.mark.parametrize("case", ["unregistered", "no-method", "run-time-class", "raises", "syntax"])
def test_unreadable_code_is_unknown_with_the_reason(tmp_path, case):
    pkg = tmp_path / "sglang"
    models = pkg / "srt" / "models"
    models.mkdir(parents=True)
    arch = "X"
    text = {
        "unregistered": "class Y:\n    pass\nEntryClass = Y\n",
        "no-method": "class X:\n    pass\nEntryClass = X\n",
        "run-time-class": ("class X:\n    def __init__(self, config, arch):\n        self.model = arch(config)\n"
                           "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
                           "        self.model.set_eagle3_layers_to_capture(layer_ids)\nEntryClass = X\n"),
        "raises": ("class X:\n    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
                   "        raise RuntimeError('needs a GPU')\nEntryClass = X\n"),
        "syntax": "class X(:\nEntryClass = X\n",
    }[case]
    (models / "x.py").write_text(text)
    code = read_rules(pkg, arch)
    rule = code.rule
    assert rule.kind == UNKNOWN and not rule.known
    assert "\n" not in rule.source
    want = {"unregistered": "no file in", "no-method": "has no set_eagle3_layers_to_capture",
            "run-time-class": "cannot find", "raises": "RuntimeError: needs a GPU",
            "syntax": "no file in"}[case]
    assert want in rule.source, rule.source
    assert rule.supported is (case != "no-method")
    p = predict([0, 3, 5], 8, rule)
    assert not p.known and not p.fails_at_first_forward and p.snapshots == ()


def test_setup_failure_of_the_method_is_a_prediction(tmp_path):
    models = _models_dir(tmp_path)
    (models / "flags.py").write_text(
        "class FlagsModel:\n"
        "    def __init__(self, config):\n        self.layers = []\n"
        "    def set_eagle3_layers_to_capture(self, layers_to_capture):\n"
        "        for i in layers_to_capture:\n            setattr(self.layers[i], '_is_layer_to_capture', True)\n"
        "        self.layers_to_capture = layers_to_capture\n\n"
        "class Flags:\n"
        "    def __init__(self, config):\n        self.model = FlagsModel(config)\n"
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
        "        self.model.set_eagle3_layers_to_capture([v + 1 for v in layer_ids or [1, 3, 4]])\n"
        "EntryClass = Flags\n")
    rule = read_rules(tmp_path / "sglang", "Flags").rule
    assert rule.kind == ALWAYS_PLUS_ONE
    p = predict([2, 4, 8], 8, rule)
    assert p.setup_error is not None and p.setup_error.startswith("IndexError")
    assert p.fails_at_first_forward


def test_reading_imports_nothing(tmp_path):
    """No sglang, no torch in the process that reads the rule (a fork may crash at import)."""
    pytest.importorskip("sglang")
    code = ("import sys\n"
            "from pytest_eagle3.sglang_source.install import locate\n"
            "from pytest_eagle3.sglang_source.model_code import read_rules\n"
            "v, loc = locate(); r = read_rules(loc, 'DeepseekV3ForCausalLM').rule\n"
            "print(r.known, 'torch' in sys.modules, 'sglang' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[-3:] == ["True", "False", "False"], out


def _one_file(tmp_path, body: str, header: str = "") -> "object":
    models = _models_dir(tmp_path)
    (models / "m.py").write_text(header + "class M:\n" + body + "EntryClass = M\n")
    return read_rules(tmp_path / "sglang", "M").rule


METHOD_HEAD = "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"


@pytest.mark.parametrize("body,header", [
    ("        if helper(layer_ids):\n            self.model.layers_to_capture = list(layer_ids)\n", ""),
    ("        if isinstance(self.model, Inner):\n            self.model.layers_to_capture = list(layer_ids)\n", ""),
    ("        if _is_npu:\n            self.model.layers_to_capture = list(layer_ids)\n"
     "        else:\n            self.model.layers_to_capture = [v + 1 for v in layer_ids]\n", "_is_npu = is_npu()\n"),
    ("        import os\n        self.model.layers_to_capture = list(layer_ids)\n", ""),
])
def test_what_the_stand_in_cannot_evaluate_is_unknown_not_a_guess(tmp_path, body, header):
    rule = _one_file(tmp_path, METHOD_HEAD + body, header)
    assert rule.kind == UNKNOWN and not rule.known, rule


def test_the_method_runs_without_io(tmp_path):
    side = tmp_path / "side-effect"
    rule = _one_file(tmp_path, METHOD_HEAD + f"        open({str(side)!r}, 'w')\n"
                     "        self.model.layers_to_capture = list(layer_ids or [])\n")
    assert rule.known and not side.exists()


def test_module_literal_constants_are_their_values(tmp_path):
    rule = _one_file(tmp_path, METHOD_HEAD + "        if _is_npu:\n            self.model.layers_to_capture = list(layer_ids)\n"
                     "        else:\n            self.model.layers_to_capture = [v + 1 for v in layer_ids or []]\n",
                     "_is_npu = False\n")
    assert rule.kind == ALWAYS_PLUS_ONE


def test_a_list_filled_in_place_and_a_decorated_method(tmp_path):
    rule = _one_file(tmp_path, "    @torch.no_grad()\n" + METHOD_HEAD +
                     "        self.model.layers_to_capture = []\n"
                     "        for v in layer_ids or [1, 3, 4]:\n            self.model.layers_to_capture.append(v + 1)\n")
    assert rule.kind == ALWAYS_PLUS_ONE
    assert predict([0, 3, 5], 8, rule).snapshots == (1, 4, 6)


def test_a_base_the_reader_cannot_find_is_unknown_not_unsupported(tmp_path):
    models = _models_dir(tmp_path)
    (models / "m.py").write_text("import somewhere.models as other\nclass M(other.Base):\n    pass\nEntryClass = M\n")
    rule = read_rules(tmp_path / "sglang", "M").rule
    assert rule.kind == UNKNOWN and rule.supported, rule.source
    assert "base(s) this reader cannot find" in rule.source


def test_a_base_imported_as_a_module_is_followed(tmp_path):
    pkg = tmp_path / "sglang"
    write_deepseek_file(pkg, ALWAYS, layer0=False)
    (pkg / "srt" / "models" / "child.py").write_text(
        "import sglang.srt.models.deepseek_v2 as dsv2\n"
        "class Child(dsv2.DeepseekV2ForCausalLM):\n    pass\nEntryClass = Child\n")
    rule = read_rules(pkg, "Child").rule
    assert rule.kind == ALWAYS_PLUS_ONE and rule.embedding.capturable is False


@pytest.mark.parametrize("loop,expected", [
    # a guard inside the capture block: layer 0 works
    ("        residual = None\n        for i in range(3):\n            if i in self.layers_to_capture:\n"
     "                if residual is None:\n                    aux.append(hidden_states)\n"
     "                else:\n                    aux.append(hidden_states + residual)\n", True),
    # residual = None only after the loop: not decided
    ("        for i in range(3):\n            if i in self.layers_to_capture:\n"
     "                aux.append(hidden_states + residual)\n        residual = None\n", None),
    # an unrelated None test does not guard the add
    ("        residual = None\n        for i in range(3):\n            if i in self.layers_to_capture and x is not None:\n"
     "                aux.append(hidden_states + residual)\n", False),
])
def test_layer0_reading_of_capture_loops(tmp_path, loop, expected):
    pkg = tmp_path / "sglang"
    models = pkg / "srt" / "models"
    models.mkdir(parents=True)
    (models / "m.py").write_text(
        "class Inner:\n    def forward(self, hidden_states, x=None):\n        aux = []\n" + loop +
        "\n\nclass M:\n    def __init__(self, config):\n        self.model = Inner()\n" + METHOD_HEAD +
        "        self.model.layers_to_capture = [v + 1 for v in layer_ids or []]\nEntryClass = M\n")
    assert read_rules(pkg, "M").rule.embedding.capturable is expected


# ------------------------------------------------------------ the installed SGLang


@pytest.fixture(scope="module")
def installed_check():
    pytest.importorskip("sglang")
    pytest.importorskip("torch")
    from pytest_eagle3.engine.cpu.recipe import cpu_env

    env = {**os.environ, **cpu_env(1), "PYTHONPATH": os.pathsep.join(
        [cpu_env(1, pythonpath="")["PYTHONPATH"], str(ROOT), str(ROOT / "tests")])}
    env.pop("PYTEST_EAGLE3_SGLANG_HOOKS", None)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "model_code_check.py")], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_model_file_with_the_method_is_read(installed_check):
    from pytest_eagle3.sglang_source.install import locate
    from pytest_eagle3.sglang_source.model_code import method_files

    files = {rel for rel, _ in method_files(locate()[1])}
    checked = {e["file"] for e in installed_check["checked"]}
    not_imported = {line.split(":")[0] for line in installed_check["not_imported"]}
    assert files == checked | not_imported
    # sglang 0.5.23: 29 files define the method; on CPU 26 import and run (the
    # Qwen3.5 files need a CPU kernel the stand-in sgl_kernel does not provide).
    assert len(checked) >= 0.8 * len(files), installed_check["not_imported"]
    families = {"srt/models/deepseek_v2.py", "srt/models/llama.py", "srt/models/qwen3.py", "srt/models/qwen3_moe.py",
                "srt/models/gpt_oss.py", "srt/models/glm4_moe_lite.py", "srt/models/kimi_k25.py"}
    assert "srt/models/deepseek_v2.py" in checked and families & files <= checked


def test_the_read_rule_agrees_with_the_real_method(installed_check):
    """For every id list: the layers the reader says, or an honest "unknown" where a
    delegate's class is only chosen at run time; never a different answer."""
    wrong = [e for e in installed_check["disagree"]
             if not (isinstance(e["read"], str) and e["read"].startswith("unknown:") and "cannot find" in e["read"])]
    assert not wrong, json.dumps(wrong[:5], indent=1)
    agreeing = [e for e in installed_check["checked"] if e["real"] == e["read"]]
    assert len(agreeing) >= 0.9 * len(installed_check["checked"])


def test_an_unreadable_rule_is_measured_not_guessed(tmp_path):
    """Collection keeps the tests that measure the rule or judge a contract, and leaves
    out with one line those that compare with a prediction nobody could read."""
    from pytest_eagle3.planning import declare
    from pytest_eagle3.planning.collect import collect_reason
    from pytest_eagle3.planning.request import resolve
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.settings import Settings
    from pytest_eagle3.target.spec import TargetSpec

    models = _models_dir(tmp_path)
    (models / "deepseek_v2.py").write_text(
        "class DeepseekV3ForCausalLM:\n"
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
        "        raise RuntimeError('reads a CUDA property')\n"
        "EntryClass = [DeepseekV3ForCausalLM]\n")
    flags = frozenset({"enable-return-aux-hidden-states", "enable-return-hidden-states"})
    install = SGLangInstall("0.5.23", str(tmp_path / "sglang"), flags, sys.executable)
    ctx = declare.NeedContext(Settings(tp=2, device="cpu"), 1, install, TargetSpec.preset("tiny-dsv3").facts)
    order = declare.case_needs(["kimi-embedding-first"], measures_rule=True)[0]
    contract = declare.case_needs(["kimi-embedding-first"], needs_contract=True)[0]
    embedding = declare.case_needs(["kimi-embedding-first"], needs_embedding=True)[0]
    assert collect_reason(order, ctx) is None
    assert collect_reason(contract, ctx) is None
    reason = collect_reason(embedding, ctx)
    assert reason is not None and "\n" not in reason
    assert "could not be read" in reason and "RuntimeError: reads a CUDA property" in reason
    request = resolve(contract, ctx)
    assert request.predicted == () and request.xfail_reason is None  # no known incompatibility from a guess


def test_inspect_says_unknown_when_the_rule_cannot_be_read(tmp_path):
    from pytest_eagle3.cli.inspection import UNKNOWN_VERDICT
    from pytest_eagle3.cli.preflight import inspect_draft
    from pytest_eagle3.suite.support import write_draft_config

    rule = _one_file(tmp_path, METHOD_HEAD + "        if helper():\n            pass\n")
    draft = write_draft_config(tmp_path / "draft", [0, 3, 5], 64)
    result = inspect_draft(draft, num_layers=8, sglang_version="0.7.2", rule=rule,
                           contract_text="[embedding, out(L2), out(L4)]")
    assert result.verdict == UNKNOWN_VERDICT and result.exit_code == 1 and result.fix is None
    assert "could not be read" in result.reason and "helper" in result.reason
    assert not any("the installed code decides" in n for n in result.notes)
