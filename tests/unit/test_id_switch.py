"""The aux layer id switch: one capture-only engine per TP size serves every id
list on cpu (worker/id_switch.py in the worker, CaptureRunner on the host).  The
real engine switches in every e2e run of the suite on cpu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_eagle3.capture import api
from pytest_eagle3.settings import Settings
from pytest_eagle3.target.spec import TargetSpec
from pytest_eagle3.worker import id_switch


class FakeInstall:
    location = "/fake/sglang"

    def __init__(self, registry: bool = True) -> None:
        self.registry = registry

    def source(self, rel: str) -> str | None:
        return "class HookRegistry: ..." if self.registry and rel == "srt/plugins/hook_registry.py" else None


FACTS = TargetSpec.preset("tiny-dsv3").facts


@pytest.mark.parametrize(("settings", "install", "ids", "draft", "switches"), [
    (Settings(device="cpu"), FakeInstall(), [1, 3, 4], None, True),
    (Settings(device="cpu"), FakeInstall(), None, None, True),  # SGLang's default list
    (Settings(device="cpu", id_switch=False), FakeInstall(), [1, 3, 4], None, False),  # --eagle3-no-id-switch
    (Settings(device="cuda"), FakeInstall(), [1, 3, 4], None, False),  # a CUDA graph keeps its layers
    (Settings(device="cpu"), FakeInstall(), [1, 3, 4], "/draft", False),  # a draft's ids come from its config
    (Settings(device="cpu"), FakeInstall(), [1, 3], None, False),  # the packer width is the default list's
    (Settings(device="cpu"), FakeInstall(registry=False), [1, 3, 4], None, False),  # no HookRegistry
    # The user's own ids (--sglang-arg) win: SGLang must capture what they name.
    (Settings(device="cpu", sglang_args=(("return_aux_hidden_state_layer_ids", [1, 4, 6]),)), FakeInstall(),
     [0, 3, 5], None, False),
])
def test_which_engines_switch_ids(settings, install, ids, draft, switches) -> None:
    assert api.switches_ids(install, settings, FACTS, ids, draft) is switches


class FakeInner:
    layers_to_capture = [2, 4, 5]


class FakeModel:
    """Stands in for DeepseekV2ForCausalLM: SGLang 0.5.23's rule, +1 when the first id is 1."""

    def __init__(self) -> None:
        self.model = FakeInner()
        self.calls: list = []

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.calls.append(layer_ids)
        if layer_ids is None:
            self.model.layers_to_capture = [2, 4, 5]
        elif layer_ids[0] == 1:
            self.model.layers_to_capture = [v + 1 for v in layer_ids]
        else:
            self.model.layers_to_capture = list(layer_ids)


def test_the_worker_applies_a_new_id_list_once_and_proves_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(id_switch.RECORD_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(id_switch, "_seen", None)
    monkeypatch.setattr(id_switch.recorder_hook, "tp_rank_and_size", lambda: (1, 2))
    model = FakeModel()
    id_switch._after_set_layers(None, model, None)  # SGLang's own call at startup
    id_switch._before_forward()
    assert model.calls == []  # no IDS file: the startup list stays
    (tmp_path / id_switch.IDS_FILE).write_text(json.dumps([1, 3, 4]))
    id_switch._before_forward()
    id_switch._before_forward()  # unchanged file: applied once
    assert model.calls == [[1, 3, 4]] and model.model.layers_to_capture == [2, 4, 5]
    applied = json.loads((tmp_path / id_switch.APPLIED_FILE.format(rank=1)).read_text())
    assert applied == {"ids": [1, 3, 4], "layers_to_capture": [2, 4, 5]}
    (tmp_path / id_switch.IDS_FILE).write_text("null")
    id_switch._before_forward()
    assert model.calls[-1] is None


def test_captures_of_a_rank_that_did_not_switch_are_refused(tmp_path: Path) -> None:
    from pytest_eagle3.capture.runner import IDS_NOT_SWITCHED, CaptureRunner
    from pytest_eagle3.engine.config import EngineConfig
    from pytest_eagle3.errors import Eagle3EngineError
    from pytest_eagle3.worker.env import ID_SWITCH_ENV

    class Pool:
        def record_dir(self, config):
            return tmp_path

        def log_path(self, config):
            return tmp_path / "engine.log"

    runner = CaptureRunner(pool=Pool(), install=None, checkpoint=tmp_path, options=Settings(), tp=2, prompts=[[1]])
    runner.last_config = EngineConfig("/m", 2, "cpu", (), ((ID_SWITCH_ENV, "1"),))
    (tmp_path / id_switch.APPLIED_FILE.format(rank=0)).write_text(json.dumps({"ids": [1, 3, 4]}))
    (tmp_path / id_switch.APPLIED_FILE.format(rank=1)).write_text(json.dumps({"ids": [0, 3, 5]}))
    with pytest.raises(Eagle3EngineError) as err:
        runner._prove_ids_switched([1, 3, 4])
    assert str(err.value) == IDS_NOT_SWITCHED.format(engine=runner.last_config.name, rank=1, ids=[1, 3, 4],
                                                     applied=[0, 3, 5], log=tmp_path / "engine.log")
    (tmp_path / id_switch.APPLIED_FILE.format(rank=1)).write_text(json.dumps({"ids": [1, 3, 4]}))
    runner._prove_ids_switched([1, 3, 4])
