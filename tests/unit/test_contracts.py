"""Training contracts: human form, every stack's translator, draft loading, fixtures.

Worked examples cite the stack's own documentation or code (read in the commits
named in the translators of ``pytest_eagle3/contracts/stacks_*.py``).  No torch: fake drafts get a
hand-written safetensors file holding only ``fc.weight``.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.safetensors_files import write_safetensors
from pytest_eagle3.contracts import (
    FINAL_PRENORM,
    STACKS,
    Contract,
    Eagle3ContractError,
    contract_for_draft,
    load_contract_fixture,
    load_contract_fixtures,
    load_draft,
    read_safetensors_header,
    translate,
)
from pytest_eagle3.contracts import catalog, contract as contract_mod, draft as draft_mod, draft_contract, stacks
from pytest_eagle3.contracts.stacks_fixed import eagle, raw
from pytest_eagle3.contracts.stacks_specforge import specforge_hf, specforge_sglang
from pytest_eagle3.contracts.stacks_vllm import speculators, vllm
from pytest_eagle3.errors import Eagle3ConfigError

# ----------------------------------------------------------------------------------------
# Contract: human form and validation
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "num_layers"),
    [
        ("[embedding, out(L2), out(L30)]", None),
        ("[embedding, out(L2), out(L30)]", 61),
        ("[out(L1), out(L3), out(L4)] + verifier: out(L7, pre-norm)", 8),
        ("[out(L1), out(L3), out(L4)] + verifier: out(L7, pre-norm)", None),
        ("[out(L0), final-norm]", 8),
        ("[embedding, out(L60, pre-norm)]", 61),
        ("[final-prenorm, out(L5)]", None),
    ],
)
def test_parse_print_round_trip(text: str, num_layers: int | None) -> None:
    c = Contract.parse(text, num_layers=num_layers)
    assert str(c) == text
    assert Contract.parse(str(c), num_layers=c.num_layers) == c


def test_parse_meaning() -> None:
    """out(Lk) = output of layer k = hs[k+1]; the pre-norm output of the last layer is final_prenorm."""
    c = Contract.parse("[embedding, out(L2), out(L30)]", num_layers=61, hidden_size=7168)
    assert c.entries == (0, 3, 31)
    assert c.to_snapshot_indices() == [0, 3, 31]
    assert c.fc_input_width == 3 * 7168
    assert c.labels() == ["hs[0] (embedding)", "hs[3] (input of layer 3)", "hs[31] (input of layer 31)"]
    pre = Contract.parse("[out(L1)] + verifier: out(L60, pre-norm)")
    assert pre.num_layers == 61  # implied by the pre-norm entry
    assert pre.verifier_last == FINAL_PRENORM
    assert pre.verifier_snapshot_index() == 62  # snapshots.prenorm_index(61)
    assert Contract.parse("[out(L0), final-norm]", num_layers=8).to_snapshot_indices() == [1, 8]
    assert Contract.parse("[embedding, out(L7, pre-norm)]").to_snapshot_indices() == [0, 9]


def test_parse_aliases() -> None:
    c = Contract.parse("[hs[0], in(L3), final_prenorm]", num_layers=8)
    assert c.entries == (0, 3, FINAL_PRENORM)
    assert str(c) == "[embedding, out(L2), out(L7, pre-norm)]"


@pytest.mark.parametrize(
    ("text", "num_layers", "needle"),
    [
        ("embedding, out(L2)", None, "bracketed"),
        ("[]", None, "empty"),
        ("[embedding, layer 3]", None, "unknown entry"),
        ("[out(L7)]", 8, "out(L7, pre-norm)"),  # last layer: pre- or post-norm?
        ("[final-norm]", None, "num_layers"),
        ("[out(L5, pre-norm)]", 8, "L7"),
        ("[out(L1)] + verifier: out(L2) + verifier: out(L3)", None, "more than one"),
    ],
)
def test_parse_errors(text: str, num_layers: int | None, needle: str) -> None:
    with pytest.raises(Eagle3ContractError, match="cannot parse contract") as info:
        Contract.parse(text, num_layers=num_layers)
    assert needle in str(info.value)
    assert "[embedding, out(L2), out(L30)]" in str(info.value)  # shows the form


def test_contract_validation() -> None:
    with pytest.raises(Eagle3ContractError, match="at least one entry"):
        Contract(entries=())
    with pytest.raises(Eagle3ContractError, match="twice"):
        Contract(entries=(2, 4, 2))
    with pytest.raises(Eagle3ContractError, match="outside hs\\[0\\]..hs\\[8\\]"):
        Contract(entries=(2, 9), num_layers=8)
    for bad in (True, -1, "hs[2]", 2.0):
        with pytest.raises(Eagle3ContractError, match="not an hs index"):
            Contract(entries=(bad,))
    with pytest.raises(Eagle3ContractError, match="positive int"):
        Contract(entries=(1,), hidden_size=0)
    with pytest.raises(Eagle3ContractError, match=contract_mod.NO_HIDDEN_MSG):
        _ = Contract(entries=(1,)).fc_input_width
    with pytest.raises(Eagle3ContractError, match="num_layers"):
        Contract(entries=(1, FINAL_PRENORM)).to_snapshot_indices()
    with pytest.raises(Eagle3ContractError, match="made for 8 layers, not 6"):
        Contract(entries=(1,), num_layers=8).to_snapshot_indices(6)
    assert Contract(entries=[1, 2]).entries == (1, 2)  # lists are frozen to tuples
    assert issubclass(Eagle3ContractError, Eagle3ConfigError)


def test_contract_helpers() -> None:
    a = Contract.parse("[out(L1), out(L3)]", num_layers=8, hidden_size=256)
    b = Contract(entries=(2, 4), stack="vllm", num_layers=8)
    assert a.same_slots(b) and a != b  # same slots, different provenance
    assert not a.same_slots(Contract(entries=(4, 2), num_layers=8))
    d = a.to_dict()
    assert d["human"] == "[out(L1), out(L3)]" and d["snapshot_indices"] == [2, 4] and d["fc_input_width"] == 512
    json.dumps(d)
    assert a.with_num_layers(8) == a
    assert Contract(entries=(2,)).with_num_layers(8).num_layers == 8


# ----------------------------------------------------------------------------------------
# Translators: one worked example per stack
# ----------------------------------------------------------------------------------------


def test_speculators_docs_full_example() -> None:
    """speculators ``docs/cli/launch_vllm.md`` "Full Example": Llama-3.1-70B-Instruct (80 layers),
    ``launch_vllm.py --target-layer-ids 5 20 40 80``; training takes ``--target-layer-ids 5 20 40``
    ("excluding the final layer"), and ``train/data.py::ArrowDataset._get_raw_data`` sends
    ``hidden_states[:, :-1]`` to fc and ``[:, -1]`` (layer 80: pre-norm, PR #313) as verifier state."""
    c = speculators([5, 20, 40], num_layers=80, hidden_size=8192)
    assert c.entries == (5, 20, 40)  # vLLM: id v = input of layer v = hs[v]
    assert c.verifier_last == FINAL_PRENORM
    assert str(c) == "[out(L4), out(L19), out(L39)] + verifier: out(L79, pre-norm)"
    assert c.fc_input_width == 3 * 8192
    assert c.declares_ids


def test_speculators_default_and_layer_order() -> None:
    """``models/utils.py::resolve_target_layer_ids``: no ids -> ``[2, L//2, L-3]`` (Llama-3.1-8B: 32 layers);
    vLLM captures in layer order, so an unsorted list still fills fc in layer order."""
    c = speculators(None, num_layers=32, hidden_size=4096)
    assert c.entries == (2, 16, 29) and not c.declares_ids
    assert any("declares no layer ids" in n for n in c.notes)
    u = speculators([29, 2, 16], num_layers=32, hidden_size=4096)
    assert u.entries == (2, 16, 29) and any("not in layer order" in n for n in u.notes)


def test_speculators_custom_worker_era() -> None:
    """Before PR #353 ``data_generation/custom_worker.py`` appended ``hidden_states + residual`` after
    layer v (``hs[v+1]``) for ``VllmHiddenStatesGenerator``'s default ``[2, L//2, L-3, L-1]``;
    ``standardize_data_v1`` split off the last as verifier state (``L-1`` -> pre-norm output)."""
    c = speculators(None, num_layers=32, hidden_size=4096, datagen="custom_worker")
    assert c.entries == (3, 17, 30)
    assert c.verifier_last == FINAL_PRENORM
    with pytest.raises(Eagle3ContractError, match="at least 2"):
        speculators([5], num_layers=32, hidden_size=1, datagen="custom_worker")
    with pytest.raises(Eagle3ContractError, match="unknown datagen"):
        speculators(None, num_layers=32, hidden_size=1, datagen="hf")


def test_speculators_rejects_verifier_layer() -> None:
    with pytest.raises(Eagle3ContractError, match="verifier's last hidden state"):
        speculators([5, 20, 80], num_layers=80, hidden_size=1)


def test_specforge_hf_deepseek_config() -> None:
    """SpecForge ``configs/deepseek-v3-671b-eagle3.json`` declares ``[1, 29, 57]`` for DeepSeek-V3 (61 layers)
    = SpecForge's default ``[1, L//2-1, L-4]``; the HF backend hooks the output of ``layers[v]``."""
    c = specforge_hf([1, 29, 57], num_layers=61, hidden_size=7168)
    assert c.entries == (2, 30, 58)
    assert str(c) == "[out(L1), out(L29), out(L57)]"
    assert specforge_hf(None, num_layers=61, hidden_size=7168).entries == c.entries


def test_specforge_hf_listed_order_and_last_layer() -> None:
    """``HFEagle3TargetEngine.generate_eagle3_data`` concatenates captures in the listed order; the last
    layer's hook output is pre-norm, while the pre-PR-#346 ``outputs.hidden_states[v+1]`` was post-norm."""
    assert specforge_hf([57, 1, 29], num_layers=61, hidden_size=1).entries == (58, 2, 30)
    assert specforge_hf([1, 29, 60], num_layers=61, hidden_size=1).entries == (2, 30, FINAL_PRENORM)
    old = specforge_hf([1, 29, 60], num_layers=61, hidden_size=1, capture="output_hidden_states")
    assert old.entries == (2, 30, 61) and str(old) == "[out(L1), out(L29), final-norm]"
    with pytest.raises(Eagle3ContractError, match="exactly 3"):
        specforge_hf([1, 29], num_layers=61, hidden_size=1)
    with pytest.raises(Eagle3ContractError, match="outside 0..60"):
        specforge_hf([1, 29, 61], num_layers=61, hidden_size=1)
    with pytest.raises(Eagle3ContractError, match="unknown capture"):
        specforge_hf(None, num_layers=61, hidden_size=1, capture="magic")


def test_specforge_sglang_follows_sglang_version() -> None:
    """SpecForge's SGLang backend calls SGLang's ``set_eagle3_layers_to_capture``: the DeepSeek config's
    ``[1, 29, 57]`` gets +1 on every version (first id 1); ``[2, 30, 58]`` only before 0.5.13 (PR #25454)."""
    for version in ("0.5.8", "0.5.23"):
        c = specforge_sglang([1, 29, 57], num_layers=61, hidden_size=7168, sglang_version=version)
        assert c.entries == (2, 30, 58)
    assert specforge_sglang([2, 30, 58], num_layers=61, hidden_size=1, sglang_version="0.5.12").entries == (3, 31, 59)
    assert specforge_sglang([2, 30, 58], num_layers=61, hidden_size=1, sglang_version="0.5.23").entries == (2, 30, 58)
    # Captures come out in layer order, whatever order the ids are in.
    assert specforge_sglang([57, 1, 29], num_layers=61, hidden_size=1, sglang_version="0.5.8").entries == (2, 30, 58)
    # No ids: SpecForge's default (or SGLang's, in the older offline backend) -> the same layers.
    assert specforge_sglang(None, num_layers=61, hidden_size=1, sglang_version="0.5.23").entries == (2, 30, 58)


def test_specforge_sglang_data_generation_would_fail() -> None:
    with pytest.raises(Eagle3ContractError, match="never reached") as info:
        specforge_sglang([1, 4, 7], num_layers=8, hidden_size=1, sglang_version="0.5.23")
    assert "layers_to_capture [2, 5, 8]" in str(info.value)


def test_eagle_original_llama3_8b() -> None:
    """SafeAILab/EAGLE ``eagle/traineagle3/modeling_llama_kv.py::LlamaModel.forward`` keeps the input of
    layers 2, L//2 and L-3; for Llama-3.1-8B-Instruct (32 layers, EAGLE3-LLaMA3.1-Instruct-8B) that is
    hs[2], hs[16], hs[29]; ``cnets.py`` builds ``fc`` with 3 * hidden inputs."""
    c = eagle(None, num_layers=32, hidden_size=4096)
    assert c.entries == (2, 16, 29)
    assert c.fc_input_width == 3 * 4096
    declared = eagle([1, 15, 28], num_layers=32, hidden_size=4096)  # ids added for a server
    assert declared.entries == c.entries and declared.declared_ids == (1, 15, 28)
    assert any("takes none" in n for n in declared.notes)
    with pytest.raises(Eagle3ContractError, match="only 2 distinct"):
        eagle(None, num_layers=6, hidden_size=1)


def test_vllm_deepseek_default_and_final_layer() -> None:
    """vLLM ``deepseek_v2.py``: ``get_eagle3_aux_hidden_state_layers`` = ``(2, L//2, L-3)`` when the draft
    config names none (``eagle3_utils.get_eagle3_aux_layers_from_config``); PR #50170's example,
    Llama-3.3-70B (80 layers), falls back to ``(2, 40, 77)``.  Id ``L`` = last layer before the norm
    since PR #46973."""
    assert vllm(None, num_layers=80, hidden_size=8192).entries == (2, 40, 77)
    ds = vllm(None, num_layers=61, hidden_size=7168)
    assert ds.entries == (2, 30, 58) and not ds.declares_ids
    final = vllm([2, 30, 58, 61], num_layers=61, hidden_size=7168)
    assert final.entries == (2, 30, 58, FINAL_PRENORM)
    with pytest.raises(Eagle3ContractError, match="PR #46973"):
        vllm([2, 30, 61], num_layers=61, hidden_size=1, final_layer=False)
    with pytest.raises(Eagle3ContractError, match="outside 0..61"):
        vllm([2, 30, 62], num_layers=61, hidden_size=1)
    emb = vllm([0, 3, 31], num_layers=61, hidden_size=1)
    assert str(emb) == "[embedding, out(L2), out(L30)]" and any("None residual" in n for n in emb.notes)


def test_raw() -> None:
    assert raw([0, 3, 31], num_layers=61, hidden_size=7168).entries == (0, 3, 31)
    assert raw([2, FINAL_PRENORM], num_layers=8, hidden_size=1).entries == (2, FINAL_PRENORM)
    parsed = raw("[embedding, out(L2), out(L30)]", num_layers=61, hidden_size=7168)
    assert parsed.entries == (0, 3, 31) and parsed.stack == "raw"
    with pytest.raises(Eagle3ContractError, match="needs entries"):
        raw(None, num_layers=8, hidden_size=1)
    with pytest.raises(Eagle3ContractError, match="outside"):
        raw([0, 9], num_layers=8, hidden_size=1)


def test_translate_registry() -> None:
    assert set(STACKS) == {"speculators", "specforge", "specforge-hf", "specforge-sglang", "eagle", "vllm", "raw"}
    assert translate("vllm", [1, 4, 6], num_layers=8, hidden_size=256).entries == (1, 4, 6)
    with pytest.raises(Eagle3ContractError, match="unknown training stack 'specforge-0.1'") as info:
        translate("specforge-0.1", [1, 3, 4], num_layers=8, hidden_size=256)
    assert "specforge-hf" in str(info.value) and "speculators" in str(info.value)
    # SpecForge 0.2 captures through its pinned SGLang 0.5.14: [1, 3, 4] -> +1 -> hs[2, 4, 5]
    assert translate("specforge", [1, 3, 4], num_layers=8, hidden_size=256).entries == (2, 4, 5)
    with pytest.raises(Eagle3ContractError, match="exactly 3 capture layers"):
        translate("specforge", [1, 3], num_layers=8, hidden_size=256)
    with pytest.raises(Eagle3ContractError, match="takes no option 'datagen'; its options: capture"):
        translate("specforge-hf", None, num_layers=8, hidden_size=256, datagen="x")
    assert stacks.stack_options("speculators") == ["datagen"]


@pytest.mark.parametrize("stack", sorted(set(STACKS) - {"raw", "eagle"}))
def test_every_stack_rejects_duplicates_and_bad_ids(stack: str) -> None:
    opts = {"sglang_version": "0.5.23"} if stack == "specforge-sglang" else {}
    with pytest.raises(Eagle3ContractError, match="more than once"):
        translate(stack, [1, 3, 3], num_layers=8, hidden_size=1, **opts)
    for bad in ([1, -1, 3], [1, True, 3], "1,2,3", [1.0, 2, 3]):
        with pytest.raises(Eagle3ContractError, match="non-negative ints"):
            translate(stack, bad, num_layers=8, hidden_size=1, **opts)
    with pytest.raises(Eagle3ContractError, match="empty"):
        translate(stack, [], num_layers=8, hidden_size=1, **opts)
    with pytest.raises(Eagle3ContractError, match="outside|never reached"):
        translate(stack, [1, 3, 40], num_layers=8, hidden_size=1, **opts)


def test_same_ids_mean_different_layers() -> None:
    """The table in ``stacks.py``: ``[1, 4, 6]`` on 8 layers."""
    got = {
        s: translate(s, [1, 4, 6], num_layers=8, hidden_size=1,
                     **({"sglang_version": "0.5.23"} if s == "specforge-sglang" else {})).entries
        for s in ("speculators", "vllm", "specforge-hf", "specforge-sglang", "eagle", "raw")
    }
    assert got == {
        "speculators": (1, 4, 6), "vllm": (1, 4, 6), "specforge-hf": (2, 5, 7),
        "specforge-sglang": (2, 5, 7), "eagle": (2, 4, 5), "raw": (1, 4, 6),
    }


# ----------------------------------------------------------------------------------------
# Draft checkpoints
# ----------------------------------------------------------------------------------------


def make_draft(
    tmp_path: Path,
    config: dict,
    fc: tuple[int, int] | None = (16, 48),
    fc_name: str = "fc.weight",
    name: str = "draft",
) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if fc is not None:
        write_safetensors(
            d / "model.safetensors",
            {fc_name: ("BF16", list(fc)), "midlayer.self_attn.q_proj.weight": ("BF16", [16, 32])},
        )
    return d


def hf_config(ids: list[int] | None, hidden: int = 16, **extra) -> dict:
    """The layout of SpecForge's ``configs/*-eagle3.json`` (eagle_config holds the ids)."""
    cfg: dict = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": hidden, "torch_dtype": "bfloat16",
                 "num_hidden_layers": 1, "draft_vocab_size": 32}
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    cfg.update(extra)
    return cfg


def test_safetensors_header_matches_the_library(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "x.safetensors", {"fc.weight": ("F32", [4, 12])})
    header = read_safetensors_header(tmp_path / "x.safetensors")
    assert header["fc.weight"]["shape"] == [4, 12]
    safetensors = pytest.importorskip("safetensors")
    pytest.importorskip("numpy")
    with safetensors.safe_open(str(tmp_path / "x.safetensors"), framework="numpy") as f:
        assert f.get_slice("fc.weight").get_shape() == [4, 12]


def test_load_draft_hf(tmp_path: Path) -> None:
    d = make_draft(tmp_path, hf_config([1, 3, 4]))
    info = load_draft(d)
    assert info.ids == (1, 3, 4) and info.ids_key == draft_mod.EAGLE_CONFIG_KEY and info.sglang_reads_ids
    assert info.target_hidden_size == 16 and info.hidden_size_key == "hidden_size"
    assert info.fc_name == "fc.weight" and info.fc_shape == (16, 48) and info.fc_input_width == 48
    assert info.fc_dtype == "BF16" and info.config_format == "hf" and info.dtype == "bfloat16"
    c = contract_for_draft(d, "specforge-hf", num_layers=8)
    assert str(c) == "[out(L1), out(L3), out(L4)]" and c.hidden_size == 16 and c.declared_ids == (1, 3, 4)
    assert str(d) in c.source


def test_load_draft_speculators_format(tmp_path: Path) -> None:
    """``Eagle3SpeculatorConfig``: ids at top level, draft width in ``transformer_layer_config``."""
    cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
           "eagle_aux_hidden_state_layer_ids": [2, 4, 5], "target_hidden_size": None,
           "transformer_layer_config": {"model_type": "llama", "hidden_size": 16},
           "speculators_config": {"algorithm": "eagle3"}}
    d = make_draft(tmp_path, cfg)
    info = load_draft(d)
    assert info.config_format == "speculators" and info.ids == (2, 4, 5)
    assert info.ids_key == draft_mod.TOP_LEVEL_KEY and not info.sglang_reads_ids
    assert info.hidden_size_key == "transformer_layer_config.hidden_size"
    c = contract_for_draft(d, "speculators", num_layers=8)
    assert str(c) == "[out(L1), out(L3), out(L4)] + verifier: out(L7, pre-norm)"
    assert draft_contract.TOP_LEVEL_ONLY_NOTE in c.notes


def test_target_hidden_size_wins(tmp_path: Path) -> None:
    d = make_draft(tmp_path, hf_config([1, 3, 4], hidden=8, target_hidden_size=16))
    assert contract_for_draft(d, "specforge-hf", num_layers=8, target_hidden_size=16).fc_input_width == 48
    with pytest.raises(Eagle3ContractError, match="target hidden size 16, but the target has hidden size 32"):
        contract_for_draft(d, "specforge-hf", num_layers=8, target_hidden_size=32)


def test_no_ids_is_a_labelled_verdict(tmp_path: Path) -> None:
    """An original EAGLE-3 release declares no ids: not an error, a contract marked as such."""
    d = make_draft(tmp_path, hf_config(None))
    c = contract_for_draft(d, "eagle", num_layers=8)
    assert not c.declares_ids and c.declared_ids is None
    assert str(c) == "[out(L1), out(L3), out(L4)]"
    assert "no ids" in c.source
    s = contract_for_draft(d, "speculators", num_layers=8)
    assert any("declares no layer ids" in n and "default [2, 4, 5]" in n for n in s.notes)


def test_fc_width_disagrees(tmp_path: Path) -> None:
    d = make_draft(tmp_path, hf_config([1, 3, 4]), fc=(16, 64))
    with pytest.raises(Eagle3ContractError) as info:
        contract_for_draft(d, "specforge-hf", num_layers=8)
    msg = str(info.value)
    assert "input width 64" in msg and "= 48" in msg and "3 slots" in msg and "4 slots of 16" in msg
    # No ids: the default's 3 slots are checked too.
    d2 = make_draft(tmp_path, hf_config(None), fc=(16, 32), name="two")
    with pytest.raises(Eagle3ContractError, match="input width 32"):
        contract_for_draft(d2, "eagle", num_layers=8)


@pytest.mark.parametrize(
    ("ids", "stack", "needle"),
    [
        ([1, 3, 9], "specforge-hf", "outside 0..7"),
        ([1, 3, 3], "vllm", "more than once"),
        ([1, 3, 4], "specforge-0.1", "unknown training stack"),
    ],
)
def test_bad_draft_ids(tmp_path: Path, ids: list[int], stack: str, needle: str) -> None:
    d = make_draft(tmp_path, hf_config(ids))
    with pytest.raises(Eagle3ContractError, match=needle):
        contract_for_draft(d, stack, num_layers=8)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (hf_config([]), "empty list"),
        (hf_config([1, "3", 4]), "non-negative ints"),
        (hf_config([1, 3, 4], eagle_aux_hidden_state_layer_ids=[2, 4, 5]), "two different id lists"),
    ],
)
def test_bad_draft_configs(tmp_path: Path, config: dict, needle: str) -> None:
    d = make_draft(tmp_path, config)
    with pytest.raises(Eagle3ContractError, match=needle):
        load_draft(d)


def test_same_ids_in_both_places_are_fine(tmp_path: Path) -> None:
    d = make_draft(tmp_path, hf_config([1, 3, 4], eagle_aux_hidden_state_layer_ids=[1, 3, 4]))
    assert load_draft(d).ids_key == draft_mod.EAGLE_CONFIG_KEY


def test_draft_dir_problems(tmp_path: Path) -> None:
    with pytest.raises(Eagle3ContractError, match="not a directory"):
        load_draft(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(Eagle3ContractError, match="no config.json"):
        load_draft(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(Eagle3ContractError, match="is invalid: "):
        load_draft(bad)
    d = make_draft(tmp_path, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}}, name="nohidden")
    with pytest.raises(Eagle3ContractError, match="no target_hidden_size or hidden_size"):
        contract_for_draft(d, "specforge-hf", num_layers=8)
    noaux = make_draft(tmp_path, hf_config([1, 3, 4], eagle_config={"use_aux_hidden_state": False}), name="noaux")
    with pytest.raises(Eagle3ContractError, match="use_aux_hidden_state = false"):
        contract_for_draft(noaux, "specforge-hf", num_layers=8)


def test_weights_missing_or_unreadable(tmp_path: Path) -> None:
    d = make_draft(tmp_path, hf_config([1, 3, 4]), fc=None)
    assert load_draft(d).weights_note == "the draft directory has no weight files"
    c = contract_for_draft(d, "specforge-hf", num_layers=8)
    assert any(n.startswith("fc width not checked") for n in c.notes)
    (d / "pytorch_model.bin").write_bytes(b"PK")
    assert "pytorch_model.bin" in load_draft(d).weights_note
    (d / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(Eagle3ContractError, match="not a readable safetensors file"):
        load_draft(d)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 50) + b"{}")
    with pytest.raises(Eagle3ContractError, match="header says 50 bytes"):
        load_draft(d)


def test_fc_names(tmp_path: Path) -> None:
    d = make_draft(tmp_path, hf_config([1, 3, 4]), fc_name="model.fc.weight")
    assert load_draft(d).fc_name == "model.fc.weight"
    d2 = make_draft(tmp_path, hf_config([1, 3, 4]), fc_name="lm_head.weight", name="nofc")
    with pytest.raises(Eagle3ContractError, match="no fc weight"):
        load_draft(d2)
    d3 = tmp_path / "many"
    d3.mkdir()
    (d3 / "config.json").write_text(json.dumps(hf_config([1, 3, 4])))
    write_safetensors(d3 / "model.safetensors", {"a.fc.weight": ("F16", [16, 48]), "b.fc.weight": ("F16", [16, 48])})
    with pytest.raises(Eagle3ContractError, match="several fc weights"):
        load_draft(d3)


def test_sharded_draft(tmp_path: Path) -> None:
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf_config([1, 3, 4])))
    write_safetensors(d / "model-00001-of-00002.safetensors", {"embed_tokens.weight": ("BF16", [32, 16])})
    write_safetensors(d / "model-00002-of-00002.safetensors", {"fc.weight": ("BF16", [16, 48])})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "embed_tokens.weight": "model-00001-of-00002.safetensors", "fc.weight": "model-00002-of-00002.safetensors"}}))
    info = load_draft(d)
    assert info.fc_file == "model-00002-of-00002.safetensors" and info.fc_shape == (16, 48)


def test_specforge_sglang_draft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_draft(tmp_path, hf_config([2, 4, 5]))
    assert contract_for_draft(d, "specforge-sglang", num_layers=8, sglang_version="0.5.8").entries == (3, 5, 6)
    assert contract_for_draft(d, "specforge-sglang", num_layers=8, sglang_version="0.5.23").entries == (2, 4, 5)
    monkeypatch.setattr(draft_contract, "installed_sglang_rule", lambda: None)
    with pytest.raises(Eagle3ContractError, match="pass sglang_version"):
        contract_for_draft(d, "specforge-sglang", num_layers=8)
    # Default: the installed SGLang's rule, read from its model file (an always +1 fork here).
    from fake_model_files import ALWAYS, write_deepseek_file
    from pytest_eagle3.sglang_source.model_code import read_rules

    write_deepseek_file(tmp_path / "fork" / "sglang", ALWAYS, layer0=False)
    fork_rule = read_rules(tmp_path / "fork" / "sglang", "DeepseekV3ForCausalLM").rule
    monkeypatch.setattr(draft_contract, "installed_sglang_rule", lambda: fork_rule)
    contract = contract_for_draft(d, "specforge-sglang", num_layers=8)
    assert contract.entries == (3, 5, 6) and any("srt/models/deepseek_v2.py:" in n for n in contract.notes)


def test_tiny_dsv3_sized_draft(tmp_path: Path) -> None:
    """A draft for tiny-dsv3 (8 layers, hidden 256) with the Kimi-style embedding-first ids."""
    d = make_draft(tmp_path, hf_config([0, 3, 5], hidden=256), fc=(256, 768))
    c = contract_for_draft(d, "raw", num_layers=8, target_hidden_size=256)
    assert str(c) == "[embedding, out(L2), out(L4)]" and c.fc_input_width == 768


# ----------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------


def test_fixtures_for_tiny_dsv3() -> None:
    fixtures = load_contract_fixtures(catalog.FIXTURE_NUM_LAYERS, hidden_size=256)
    names = {f.name for f in fixtures}
    assert {"specforge-default-ids", "speculators-default-ids", "kimi-embedding-first",
            "vllm-first-id-1", "default-no-ids"} <= names
    for f in fixtures:
        assert f.error is None, f.error
        assert f.contract is not None and str(f.contract) == f.expected, f.name
        assert f.contract.fc_input_width == f.contract.k * 256
    by = {f.name: f for f in fixtures}
    assert by["default-no-ids"].ids is None and not by["default-no-ids"].declares_ids
    assert by["vllm-first-id-1"].ids == (1, 4, 6)
    assert by["kimi-embedding-first"].contract.entries[0] == 0


def test_fixtures_scale_to_other_targets() -> None:
    by = {f.name: f for f in load_contract_fixtures(61, hidden_size=7168)}
    assert str(by["kimi-embedding-first"].contract) == "[embedding, out(L2), out(L30)]"  # the story's layout
    assert by["specforge-default-ids"].ids == (1, 29, 57)  # SpecForge's DeepSeek-V3 config
    small = {f.name: f for f in load_contract_fixtures(6)}
    assert small["default-no-ids"].contract is None and "only 2 distinct" in small["default-no-ids"].error


def test_fixture_files_are_checked(tmp_path: Path) -> None:
    good = {"name": "x", "stack": "vllm", "ids": [1, "L-2"], "expected": "[out(L0), out(L5)]"}
    (tmp_path / "x.json").write_text(json.dumps(good))
    assert load_contract_fixture(tmp_path / "x.json", 8).contract.entries == (1, 6)
    for bad, needle in (
        ({**good, "idz": 1}, "unknown keys"),
        ({k: v for k, v in good.items() if k != "expected"}, "missing keys"),
        ({**good, "ids": "1,2"}, "list or null"),
        ({**good, "ids": [1, "__import__('os')"]}, "expression in L"),
        ({**good, "ids": [1, "M-2"]}, "expression in L"),
    ):
        (tmp_path / "x.json").write_text(json.dumps(bad))
        with pytest.raises(Eagle3ContractError, match=needle):
            load_contract_fixture(tmp_path / "x.json", 8)
    (tmp_path / "y.json").write_text(json.dumps({**good, "stack": "nope"}))
    assert "unknown training stack" in load_contract_fixture(tmp_path / "y.json", 8).error
    assert catalog.eval_id("L//2-1", 61) == 29 and catalog.eval_id(7, 61) == 7


def test_no_heavy_imports() -> None:
    code = (
        "import sys, pytest_eagle3.contracts as c; c.load_contract_fixtures(8); "
        "bad = [m for m in ('torch', 'transformers', 'sglang', 'numpy', 'safetensors') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
