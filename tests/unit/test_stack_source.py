"""The stack readers: a recorded fact read again from a stack's files (installed,
wheel or folder), and a changed file reported with the place and text expected
and what was found (``pytest_eagle3/stack_source``, ``pytest-eagle3 stacks``)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pytest_eagle3.cli.main import main
from pytest_eagle3.stack_source import catalog, report
from pytest_eagle3.stack_source.facts import CHANGED, HOLDS, MOVED, OLDER, check
from pytest_eagle3.stack_source.files import StackFilesError, folder, open_path, wheel
from pytest_eagle3.stack_source.readers import AssignedLiteral, Contains, KeysRead, Order, Returns, read

RUNNER = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
KEYS_FACT = next(f for f in catalog.VLLM_FACTS if isinstance(f.reader, KeysRead))

#: A stand-in for the runner's reader, written for these tests: the keys in the recorded order.
RUNNER_SOURCE = '''\
"""Stand-in runner module."""


def set_eagle3_aux_hidden_state_layers(model, spec_config):
    aux_layers = get_eagle3_aux_layers_from_config(spec_config)
    if not aux_layers:
        aux_layers = eagle3_model.get_eagle3_default_aux_hidden_state_layers()
    return aux_layers


def get_eagle3_aux_layers_from_config(spec_config):
    hf_config = spec_config.draft_model_config.hf_config
    layer_ids = getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None)
    dflash_config = getattr(hf_config, "dflash_config", None)
    layer_ids = layer_ids or dflash_config.get("target_layer_ids")
    dspark = getattr(hf_config, "dspark_target_layer_ids", None)
    kind = getattr(hf_config, "model_type", None)
    target = getattr(hf_config, "target_layer_ids", None)
    for drafter_config in (dflash_config,):
        layer_ids = layer_ids or drafter_config.get("layer_ids")
    return layer_ids
'''


def _vllm_folder(root: Path, source: str = RUNNER_SOURCE, version: str = "9.9.9", v1_runner: bool = False) -> Path:
    (root / f"vllm-{version}.dist-info").mkdir(parents=True)
    (root / f"vllm-{version}.dist-info" / "METADATA").write_text(f"Name: vllm\nVersion: {version}\n")
    (root / RUNNER).parent.mkdir(parents=True)
    (root / RUNNER).write_text(source)
    if v1_runner:
        (root / "vllm/v1/worker/gpu_model_runner.py").write_text("class GPUModelRunner:\n    pass\n")
    return root


def test_each_reader_reads_its_anchor() -> None:
    source = '''
class Model:
    def forward(self, hidden_states, residual, layers):
        out = []
        for idx, layer in enumerate(layers):
            aux = hidden_states + residual
            out.append(aux)
            hidden_states, residual = layer(hidden_states, residual)
        ids = [2, n // 2, n - 3]
        return (2, n // 2,
                n - 3)  # a line break and a comment do not count
'''
    assert read(source, Returns("Model.forward")).text == "(2, n // 2, n - 3)"
    assert read(source, AssignedLiteral("Model.forward", "ids")).text == "[2, n // 2, n - 3]"
    found = read(source, Order("Model.forward", "aux = hidden_states + residual", "= layer("))
    assert found.text == "`aux = hidden_states + residual` before `= layer(`" and found.lines == "3-11"
    assert read(source, Order("Model.forward", "= layer(", "out.append(aux)")).text.endswith("after `out.append(aux)`")
    assert read(source, Contains("Model.forward", ("out.append(aux)", "out.extend(aux)"), "out")).text == \
        "out.append(aux); no `out.extend(aux)`"
    assert read(source, Returns("Model.backward")) is None  # the anchor is gone


def test_keys_read_in_source_order() -> None:
    found = read(RUNNER_SOURCE, KeysRead("get_eagle3_aux_layers_from_config"))
    assert found is not None and found.text == KEYS_FACT.text


def test_a_renamed_key_fails_with_the_expected_and_found_text(tmp_path: Path) -> None:
    """A copy of the runner whose reader renamed the key: the fact is CHANGED and the
    message names the file:lines expected, the recorded text and the text found."""
    renamed = RUNNER_SOURCE.replace('"eagle_aux_hidden_state_layer_ids"', '"aux_hidden_state_layer_ids"')
    reading = check(KEYS_FACT, folder(_vllm_folder(tmp_path, renamed)))
    assert reading.status == CHANGED and reading.broken
    text = reading.describe()
    assert f"expected {KEYS_FACT.text!r} at {RUNNER}:103-140 (vllm 0.34.0" in text
    assert "found 'hf_config.aux_hidden_state_layer_ids, hf_config.dflash_config" in text
    assert f"at {RUNNER}:11-21" in text
    assert "relied on by contracts/servers.py vllm_v2_ids" in text


def test_moved_older_and_gone(tmp_path: Path) -> None:
    copy = folder(_vllm_folder(tmp_path / "a", v1_runner=True))
    keys = check(KEYS_FACT, copy)
    assert keys.status == MOVED and "holds at other lines" in keys.describe() and ":11-21" in keys.where
    v1 = check(catalog.V1_RUNNER_REMOVED, copy)
    assert v1.status == OLDER and "as in vllm 0.33.0" in v1.describe()
    assert check(catalog.V1_RUNNER_REMOVED, folder(_vllm_folder(tmp_path / "b"))).status == HOLDS
    default = next(f for f in catalog.VLLM_FACTS if f.name == "default aux layer ids")
    gone = check(default, copy)
    assert gone.status == CHANGED and "found nothing: the file or its anchor is gone" in gone.describe()


def test_a_wheel_is_read_in_place(tmp_path: Path) -> None:
    path = tmp_path / "specforge-7.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("specforge-7.0.0.dist-info/METADATA",
                     "Name: specforge\nVersion: 7.0.0\nRequires-Dist: sglang==0.5.99\nRequires-Dist: torch\n")
        whl.writestr("specforge/__init__.py", "")
    files = open_path(path)
    assert (files.name, files.version) == ("specforge", "7.0.0") and files.text("specforge/__init__.py") == ""
    assert files.text("specforge/missing.py") is None
    pin = next(f for f in catalog.SPECFORGE_FACTS if f.file == "METADATA")
    reading = check(pin, files)
    assert reading.status == CHANGED and "found 'sglang==0.5.99'" in reading.describe()
    with pytest.raises(StackFilesError, match="not a readable wheel"):
        wheel(tmp_path / "missing.whl")
    with pytest.raises(StackFilesError, match="not a .whl file or a folder"):
        open_path(tmp_path / "nothing-here")


def test_the_catalog_cites_every_fact() -> None:
    for stack, facts in catalog.FACTS.items():
        assert facts and all(f.stack == stack and f.relied_on_by and f.version for f in facts)
        for fact in facts:
            assert (fact.reader is None) == (not fact.lines), fact.name


def test_the_stacks_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 0 when the facts hold (here: the runner's keys, on a stand-in copy), 1 with
    the CHANGED line when one does not, and info names where each stack's facts come from."""
    monkeypatch.setitem(report.FACTS, "vllm", (KEYS_FACT,))
    assert main(["stacks", str(_vllm_folder(tmp_path / "ok"))]) == 0
    assert "vllm 9.9.9 (folder" in capsys.readouterr().out
    bad = RUNNER_SOURCE.replace('"model_type"', '"architectures"')
    assert main(["stacks", str(_vllm_folder(tmp_path / "bad", bad))]) == 1
    out = capsys.readouterr().out
    assert "1 of 1 facts CHANGED" in out and "hf_config.architectures" in out and "1 fact(s) changed" in out
    assert "recorded constants, read from the specforge 0.2.0 wheel" in report.provenance("specforge") or \
        "read from the installed files" in report.provenance("specforge")
