"""A SpecForge 0.2 output directory: the draft's ``config.json`` (SpecForge writes
none with ids: ``specforge export`` copies the user's draft config) beside the
run's checkpoints, whose ``training_state.pt`` holds the provenance record
(``specforge_model_provenance``, a tuple of ``(key, value)`` pairs with
``capture_layers``; SpecForge 0.2.0 ``training/provenance.py:285-289``,
``algorithms/common/providers.py:37``, ``training/checkpoint.py``).  ``inspect``
reads the ids from the record, names the stack, and says what SGLang and vLLM
would feed; a record and a config that disagree are refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_eagle3.cli import main as cli
from pytest_eagle3.contracts.draft import PROVENANCE_IDS_KEY, load_draft
from pytest_eagle3.errors import Eagle3ContractError
from tests.safetensors_files import write_safetensors

torch = pytest.importorskip("torch")

DRAFT_CONFIG = {  # SpecForge's in-memory default draft config (training/model_loading.py:211-258): no eagle_config
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8,
    "vocab_size": 2048, "draft_vocab_size": 2048, "tie_word_embeddings": False,
}


def specforge_run(root: Path, capture_layers: list[int] | None, config: dict | None = None) -> Path:
    """A SpecForge 0.2 output directory: two checkpoints, ``-latest`` -> the second."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config or DRAFT_CONFIG))
    write_safetensors(root / "model.safetensors", {"fc.weight": ("F32", [256, 3 * 256])})
    for step, layers in ((100, [9, 9, 9]), (200, capture_layers)):
        d = root / f"specforge-run-step{step}"
        d.mkdir()
        prov = {"capture_layers": None if layers is None else tuple(layers), "target_model": "tiny-dsv3",
                "torch_dtype": "bfloat16", "source_identity_format": "stat-v2"}
        torch.save({"draft_state_dict": {"fc.weight": torch.zeros(2, 2)}, "global_step": step,
                    "specforge_model_provenance": tuple((k, prov[k]) for k in sorted(prov))},
                   d / "training_state.pt")
    os.symlink("specforge-run-step200", root / "specforge-run-latest")
    return root


def test_ids_come_from_the_latest_record(tmp_path: Path) -> None:
    info = load_draft(specforge_run(tmp_path / "run", [1, 3, 4]))
    assert info.config_format == "specforge" and info.ids == (1, 3, 4) and info.ids_key == PROVENANCE_IDS_KEY
    assert not info.sglang_reads_ids


def test_inspect_a_specforge_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Trained on [1, 3, 4] with SGLang 0.5.14 (hs[2, 4, 5]); config.json declares
    nothing, so SGLang 0.5.23 and vLLM 0.34.0 both use their default [2, 4, 5]: the same
    layers, by luck of SpecForge's default list."""
    run = specforge_run(tmp_path / "run", [1, 3, 4])
    code = cli.main(["inspect", "--draft", str(run), "--target", "tiny-dsv3", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["stack"] == "specforge" and result["stack_source"].startswith("SpecForge 0.2 run")
    assert result["contract"]["entries"] == [2, 4, 5] and result["by_default"]
    assert code == 0 and result["verdict"] == "match"
    assert [r["captures"] for r in result["vllm"]] == [[2, 4, 5]]
    assert "SpecForge provenance record" in result["reason"]


def test_undeclared_ids_that_the_default_does_not_cover(tmp_path: Path, capsys) -> None:
    run = specforge_run(tmp_path / "run", [0, 3, 5])
    code = cli.main(["inspect", "--draft", str(run), "--target", "tiny-dsv3", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and result["verdict"] == "mismatch"
    assert "declares no ids" in result["reason"] and "eagle_config.eagle_aux_hidden_state_layer_ids" in result["reason"]


def test_record_and_config_disagree(tmp_path: Path) -> None:
    config = {**DRAFT_CONFIG, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}}
    run = specforge_run(tmp_path / "run", [1, 3, 4], config=config)
    with pytest.raises(Eagle3ContractError) as exc:
        load_draft(run)
    msg = str(exc.value)
    assert "\n" not in msg and "[2, 4, 5]" in msg and "[1, 3, 4]" in msg and "specforge-run-latest" in msg
