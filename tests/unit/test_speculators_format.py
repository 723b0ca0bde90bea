"""A draft directory written by speculators 0.9.0's own code, for the tiny target:
``pytest-eagle3 inspect`` says which layers the installed SGLang and vLLM 0.33.0's
V1/V2 runners would feed it, and the acceptance path refuses it before any engine
(SGLang has no model class for the format).  Needs the ``speculators`` extra
(``pip install -e '.[speculators]'``, speculators 0.9.0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_eagle3.cli import main as cli
from pytest_eagle3.draft import Eagle3DraftError, validate_draft
from tests.safetensors_files import write_safetensors

IDS = [1, 4, 6]


@pytest.fixture(scope="module")
def speculators_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``Eagle3SpeculatorConfig(...).save_pretrained`` for tiny-dsv3 (8 layers, hidden
    256): ids ``[1, 4, 6]`` at the top level, a Llama layer, no ``eagle_config``;
    plus an ``fc.weight`` header of the right shape."""
    speculators = pytest.importorskip("speculators")
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(hidden_size=256, intermediate_size=256, num_attention_heads=8, num_key_value_heads=8,
                        vocab_size=2048, num_hidden_layers=1, head_dim=32)
    config = speculators.Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=2048, norm_before_residual=False, target_hidden_size=256,
        eagle_aux_hidden_state_layer_ids=IDS,
        speculators_config=speculators.SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=speculators.VerifierConfig(name_or_path="tiny-dsv3", architectures=["DeepseekV3ForCausalLM"]),
        ),
    )
    out = tmp_path_factory.mktemp("speculators") / "draft"
    config.save_pretrained(str(out))
    write_safetensors(out / "model.safetensors", {"fc.weight": ("F32", [256, 3 * 256])})
    return out


def test_written_format_is_what_the_readers_expect(speculators_draft: Path) -> None:
    cfg = json.loads((speculators_draft / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_version"] == "0.9.0"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == IDS and "eagle_config" not in cfg


def test_inspect_says_what_each_server_feeds(speculators_draft: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """speculators trained id v as hs[v]: vLLM 0.34.0's runner reads the top-level ids
    and feeds exactly that; SGLang reads only eagle_config's key, so it feeds its default."""
    code = cli.main(["inspect", "--draft", str(speculators_draft), "--target", "tiny-dsv3", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["stack"] == "speculators" and result["draft"]["config_format"] == "speculators"
    assert result["contract"]["entries"] == IDS
    assert result["by_default"] and result["sglang"]["ids_read"] is None
    assert code == 1 and result["verdict"] == "mismatch"
    (vllm,) = result["vllm"]
    assert vllm["server"] == "vllm 0.34.0" and vllm["key"] == "eagle_aux_hidden_state_layer_ids"
    assert vllm["captures"] == IDS and vllm["note"] is None


def test_sglang_refuses_the_format_before_any_engine(speculators_draft: Path) -> None:
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(speculators_draft, 256, 2048)
    msg = str(exc.value)
    assert "\n" not in msg and "speculators format" in msg and "[1, 4, 6]" in msg


def test_our_reader_agrees_with_speculators_own(speculators_draft: Path) -> None:
    """``contracts/draft.load_draft`` reads the format with speculators' own
    ``from_pretrained`` where the extra is installed, by hand elsewhere; both must
    give the same ids, widths and flags."""
    import speculators

    from pytest_eagle3.contracts.draft import TOP_LEVEL_KEY, load_draft

    from pytest_eagle3.contracts import draft as draft_module

    theirs = speculators.Eagle3SpeculatorConfig.from_pretrained(str(speculators_draft))
    assert draft_module.speculators_reading(speculators_draft)[TOP_LEVEL_KEY] == IDS  # their code, used by load_draft
    ours = load_draft(speculators_draft)
    assert ours.config_format == "speculators" and ours.ids_key == TOP_LEVEL_KEY
    assert list(ours.ids) == list(theirs.eagle_aux_hidden_state_layer_ids)
    assert ours.target_hidden_size == theirs.target_hidden_size
    for flag in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual"):
        assert bool(ours.config.get(flag)) == bool(getattr(theirs, flag)), flag
