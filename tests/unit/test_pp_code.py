"""Pipeline parallelism read from the installed SGLang's files: the startup gates,
SGLang's own layer split, which stage captures (``sglang_source/pp_code.py``), and
``--eagle3-pp`` on an SGLang that refuses it: one reason, no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_eagle3.planning import collect, declare
from pytest_eagle3.settings import GpuProbe, Settings
from pytest_eagle3.sglang_source import install
from pytest_eagle3.sglang_source.install import sglang_location_and_version
from pytest_eagle3.sglang_source.pp_code import EARLIER_STAGE_ISSUE, read_pp_code
from pytest_eagle3.target.spec import TargetSpec

LOCATION, VERSION = sglang_location_and_version()
needs_validation_hook = pytest.mark.skipif(
    LOCATION is None or not (LOCATION / "srt/arg_groups/validation_hook.py").is_file(),
    reason="needs an installed SGLang with srt/arg_groups/validation_hook.py (0.5.23)")


@needs_validation_hook
def test_the_installed_gates_split_and_stage_check() -> None:
    pp = read_pp_code(LOCATION)
    assert pp.eagle_gate is not None and pp.eagle_gate.file == "srt/arg_groups/validation_hook.py"
    assert "only supports EAGLE (non-multi-layer)" in pp.eagle_gate.text
    assert pp.capture_gate is not None and "pp_size == 1" in pp.capture_gate.text
    assert pp.earlier_stages_capture is False and str(pp.stage_check).startswith("srt/models/deepseek_v2.py:")
    assert pp.stages(8, 2) == [(0, 4), (4, 8)]
    assert pp.stages(61, 4) == [(0, 15), (15, 30), (30, 45), (45, 61)]  # the last stage gets the extra layer
    text = pp.describe()
    assert text.startswith("this SGLang refuses EAGLE-3 with pipeline parallelism at startup (srt/arg_groups/")
    assert EARLIER_STAGE_ISSUE in text and "with the gate lifted a layer of an earlier stage is never captured" in text
    lines = pp.split_lines(2, 8, [0, 3, 5])
    assert lines[1:] == ["  stage 0: layers 0-3: layers 0, 3 never captured (not the last stage)",
                         "  stage 1: layers 4-7: captures layer 5"]


def test_an_sglang_without_the_gates(tmp_path: Path) -> None:
    """No validation hook, no split function, no model file: nothing is claimed."""
    (tmp_path / "srt").mkdir()
    pp = read_pp_code(tmp_path)
    assert pp.eagle_gate is None and pp.capture_gate is None and pp.stages(8, 2) is None
    assert pp.earlier_stages_capture is None
    assert pp.describe().startswith("no startup check refusing EAGLE-3 with pipeline parallelism was found")


@needs_validation_hook
def test_pp_on_a_gated_sglang_leaves_every_engine_test_out_with_one_reason() -> None:
    facts = TargetSpec.preset("tiny-dsv3").facts
    sglang = install.probe(None)
    settings = Settings(tp=1, pp=2, device="cpu", gpu=GpuProbe(0, "test"))
    reasons = {collect.collect_reason(need, declare.NeedContext(settings, 1, sglang, facts))
               for need in declare.case_needs()}
    (reason,) = reasons
    assert reason == collect.PP_GATE.format(pp=2, why=read_pp_code(sglang.location).describe())


@needs_validation_hook
def test_inspect_and_info_say_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    """``inspect --pp 2`` on the shipped draft (ids [0, 3, 5]) and ``info --pp 2``: the
    gate as what it means, and the stage of each layer SGLang would capture."""
    from pytest_eagle3.cli.main import main

    draft = Path(__file__).resolve().parents[2] / "fixtures" / "drafts" / "tiny-dsv3"
    main(["inspect", "--draft", str(draft), "--stack", "specforge", "--layers", "8", "--pp", "2"])
    out = capsys.readouterr().out
    described = read_pp_code(LOCATION).describe()
    assert f"pp:        {described}" in out
    assert "stage 0: layers 0-3: layers 0, 3 never captured (not the last stage)" in out
    assert main(["info", "--layers", "8", "--pp", "2"]) == 0
    out = capsys.readouterr().out
    assert f"pipeline parallelism: {described}" in out and "  stage 1: layers 4-7" in out
    assert main(["info", "--layers", "2", "--pp", "4"]) == 2  # more stages than layers


def test_each_model_files_stage_check(tmp_path: Path) -> None:
    """Model files sorted by their ``set_eagle3_layers_to_capture``: returns unless the last
    stage, no stage test, or hands the ids on."""
    from pytest_eagle3.sglang_source.pp_code import read_family_stage_checks

    models = tmp_path / "srt" / "models"
    models.mkdir(parents=True)
    (models / "early.py").write_text(
        "class A:\n    def set_eagle3_layers_to_capture(self, ids=None):\n        '''doc'''\n"
        "        if not self.pp_group.is_last_rank:\n            return\n        self.model.layers_to_capture = ids\n")
    (models / "every.py").write_text(
        "class B:\n    def set_eagle3_layers_to_capture(self, ids=None):\n        self.model.layers_to_capture = ids\n")
    (models / "wrapper.py").write_text(
        "class C:\n    def set_eagle3_layers_to_capture(self, ids=None):\n"
        "        self.language_model.set_eagle3_layers_to_capture(ids)\n")
    checks = read_family_stage_checks(tmp_path)
    assert checks.last_stage_only == ("early.py:2",) and checks.every_stage == ("every.py:2",)
    assert checks.delegating == ("wrapper.py:2",)
    assert checks.describe().startswith("1 model file: captures on the last stage only")
    if LOCATION is not None and (LOCATION / "srt/arg_groups/validation_hook.py").is_file():
        installed = read_family_stage_checks(LOCATION)
        assert any(w.startswith("deepseek_v2.py:") for w in installed.last_stage_only)
        assert any(w.startswith("llama.py:") for w in installed.last_stage_only)
