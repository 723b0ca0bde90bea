"""The synthetic EAGLE-3 draft shipped for tiny-dsv3 (``fixtures/drafts/tiny-dsv3``).

* layout: the config SGLang 0.5.23's ``LlamaForCausalLMEagle3`` reads, the tensor
  names and shapes, the provenance block (no torch);
* stored quality: ``quality.json`` clears its own gates, every miswiring falls below
  them (no torch);
* offline teeth on the transformers reference: the shipped draft fed the reference's
  aux states, correctly and miswired (torch + transformers, ~1 min cold);
* the batched chain forward equals the sequential KV-cache form (torch);
* bad drafts: one-line :class:`Eagle3DraftError`s (no torch);
* regeneration (e2e, several CPU-minutes): retraining reaches the stored quality.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_eagle3.draft import Eagle3DraftError, shipped_draft_dir, validate_draft
from pytest_eagle3.draft.build import CONTINUATIONS_FILE, QUALITY_FILE, WEIGHTS_FILE, checkpoint_key
from pytest_eagle3.draft.config import ARCHITECTURE, DraftConfig, weight_names
from pytest_eagle3.draft.validate import tensor_shapes
from pytest_eagle3.draft.wiring import BENIGN, CORRECT, MISWIRINGS, PROBES
from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.target.spec import TargetSpec, load_packaged_prompts
from tests.safetensors_files import write_safetensors

PRESET = "tiny-dsv3"
CONTRACT_HS = [0, 3, 5]  # kimi-embedding-first on 8 layers: hs[0], hs[3], hs[5]
#: The issue's target: correct accept length at least this multiple of the best miswired one.
POWER_RATIO = 2.0


@pytest.fixture(scope="module")
def draft_dir() -> Path:
    d = shipped_draft_dir(PRESET)
    assert d.is_dir(), f"no shipped draft at {d}; run python -m pytest_eagle3.draft.build"
    return d


@pytest.fixture(scope="module")
def quality(draft_dir: Path) -> dict:
    return json.loads((draft_dir / QUALITY_FILE).read_text())


@pytest.fixture(scope="module")
def spec() -> TargetSpec:
    return TargetSpec.preset(PRESET)


# ---------------------------------------------------------------- layout (no torch)


def test_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import pytest_eagle3.draft, pytest_eagle3.draft.build, pytest_eagle3.draft.config, "
        "pytest_eagle3.draft.data, pytest_eagle3.draft.model, pytest_eagle3.draft.offline, "
        "pytest_eagle3.draft.train, pytest_eagle3.draft.validate, pytest_eagle3.draft.wiring\n"
        "assert 'torch' not in sys.modules, 'torch imported at module import time'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shipped_config_is_what_sglang_reads(draft_dir: Path, spec: TargetSpec) -> None:
    cfg = json.loads((draft_dir / "config.json").read_text())
    assert cfg["architectures"] == [ARCHITECTURE]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == CONTRACT_HS
    assert cfg["eagle_config"].get("use_aux_hidden_state", True) is True
    assert cfg["num_hidden_layers"] == 1
    # target_hidden_size == hidden_size: SGLang shares the target embedding (set_embed)
    assert cfg["hidden_size"] == cfg["target_hidden_size"] == spec.config["hidden_size"]
    # draft_vocab_size set: the draft's own lm_head; == vocab: no d2t needed
    assert cfg["draft_vocab_size"] == cfg["vocab_size"] == spec.config["vocab_size"]
    assert cfg["tie_word_embeddings"] is False
    assert cfg["torch_dtype"] == "float32"
    for key in ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output", "num_aux_hidden_states"):
        assert key not in cfg
    block = cfg["pytest_eagle3"]
    assert block["contract"] == "kimi-embedding-first"
    assert block["declared_ids"] == CONTRACT_HS
    assert block["trained_on_hs_indices"] == CONTRACT_HS
    assert block["target"]["preset"] == PRESET
    assert block["target"]["checkpoint_key"] == checkpoint_key(spec), (
        "the tiny-dsv3 checkpoint changed since the draft was built: "
        "run python -m pytest_eagle3.draft.build"
    )


def test_shipped_weights(draft_dir: Path, spec: TargetSpec) -> None:
    cfg = validate_draft(draft_dir, spec.config["hidden_size"], spec.config["vocab_size"])
    shapes = tensor_shapes(draft_dir)
    assert set(shapes) == set(weight_names())  # no embed_tokens: SGLang uses the target's
    assert shapes["fc.weight"] == (256, 3 * 256)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (cfg.num_attention_heads * cfg.head_dim, 512)
    assert shapes["lm_head.weight"] == (2048, 256)
    size = (draft_dir / WEIGHTS_FILE).stat().st_size
    assert size <= 6_000_000
    assert size >= 4 * cfg.num_parameters()


def test_shipped_draft_reads_as_its_contract(draft_dir: Path) -> None:
    """The contracts module's reader agrees: stack raw, ids [0, 3, 5] -> hs[0], hs[3], hs[5]."""
    from pytest_eagle3.contracts.draft_contract import contract_for_draft

    contract = contract_for_draft(draft_dir, "raw", num_layers=8, target_hidden_size=256)
    assert contract.to_snapshot_indices(8) == CONTRACT_HS


def test_quality_json_clears_its_gates(draft_dir: Path, quality: dict) -> None:
    import hashlib

    q, gates = quality["quality"], quality["gates"]
    assert quality["steps"] == 3 and quality["topk"] == 1
    assert quality["hs_indices"] == CONTRACT_HS
    assert isinstance(quality["seed"], int) and quality["train_steps"] > 0
    assert quality["weights_sha256"] == hashlib.sha256((draft_dir / WEIGHTS_FILE).read_bytes()).hexdigest()
    correct = q[CORRECT]
    assert correct["first_token_accuracy"] >= 0.95
    assert correct["accept_length"] >= gates["min_accept_length"]
    assert correct["accept_rate"] >= gates["min_accept_rate"]
    assert set(MISWIRINGS) | set(PROBES) | set(BENIGN) <= set(q)
    for name in MISWIRINGS:
        assert q[name]["accept_length"] < gates["min_accept_length"], name
        assert q[name]["first_token_accuracy"] < gates["min_first_token_accuracy"], name
        assert correct["accept_length"] >= POWER_RATIO * q[name]["accept_length"], name
    for name in PROBES:
        assert q[name]["accept_length"] < gates["min_accept_length"], name
    for name in BENIGN:
        assert q[name]["accept_length"] >= gates["min_accept_length"], name
    assert gates["power_ratio"] >= POWER_RATIO


def test_continuations_are_the_suite_prompts(draft_dir: Path, spec: TargetSpec) -> None:
    data = json.loads((draft_dir / CONTINUATIONS_FILE).read_text())
    prompts = load_packaged_prompts(vocab_size=spec.config["vocab_size"])
    seqs = data["sequences"]
    assert [s["prompt"] for s in seqs] == prompts
    for s in seqs:
        assert s["continuation"] == s["generated"][: s["trusted"]]
        assert all(m >= 0.01 for m in s["margins"][: s["trusted"]])
    assert sum(max(s["trusted"] - 1, 0) for s in seqs) >= 100


# ---------------------------------------------------------------- offline, torch


def _load_draft(draft_dir: Path):
    from safetensors.torch import load_file

    cfg = DraftConfig.from_hf_config(json.loads((draft_dir / "config.json").read_text()))
    return load_file(str(draft_dir / WEIGHTS_FILE)), cfg


def _examples(draft_dir: Path):
    from pytest_eagle3.draft.data import DraftExample

    seqs = json.loads((draft_dir / CONTINUATIONS_FILE).read_text())["sequences"]
    return [
        DraftExample(name=s["name"], prompt=tuple(s["prompt"]), generated=tuple(s["generated"]),
                     margins=tuple(s["margins"]), trusted=s["trusted"])
        for s in seqs
    ]


def test_batched_chains_equal_sglang_sequential_form(draft_dir: Path) -> None:
    """chain_forward (all chains at once) == extend + decode steps with a KV cache."""
    torch = pytest.importorskip("torch")
    from pytest_eagle3.draft.data import snapshots, target_weights
    from pytest_eagle3.draft.model import DraftSession, chain_forward
    from pytest_eagle3.draft.wiring import aux_rows

    params, cfg = _load_draft(draft_dir)
    sd, dims = target_weights(TargetSpec.preset(PRESET))
    embed = sd["model.embed_tokens.weight"]
    ex = _examples(draft_dir)[0]
    tokens = torch.tensor(ex.tokens)
    aux = aux_rows(snapshots(sd, dims, ex.tokens), CONTRACT_HS)
    with torch.no_grad():
        batched = chain_forward(params, cfg, embed, tokens, aux, 3, first=ex.first_start)
        for t in (ex.first_start, ex.first_start + 4):
            session = DraftSession(params, cfg, embed)
            out = session.extend(tokens[1: t + 2], aux[: t + 1], 0)  # shifted ids, prefill
            r = t - ex.first_start
            torch.testing.assert_close(out.logits[-1], batched[0][r], rtol=1e-4, atol=1e-4)
            hidden = out.prenorm[-1:]
            for k in (2, 3):
                step = session.decode(int(tokens[t + k]), hidden, t + k - 1)
                torch.testing.assert_close(step.logits[0], batched[k - 1][r], rtol=1e-4, atol=1e-4)
                hidden = step.prenorm


@pytest.fixture(scope="module")
def reference_stacks(draft_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The transformers reference of every prompt + continuation (cached per session)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pytest_eagle3.target.checkpoint import ensure_checkpoint
    from pytest_eagle3.target.reference import ensure_reference

    spec = TargetSpec.preset(PRESET)
    ckpt = ensure_checkpoint(spec, tmp_path_factory.getbasetemp() / "eagle3-cache")
    examples = _examples(draft_dir)
    stacks = ensure_reference(ckpt, [ex.tokens for ex in examples])
    return ckpt, examples, stacks


def test_continuations_are_the_reference_greedy_tokens(reference_stacks) -> None:
    """transformers' own argmax reproduces every trusted continuation token."""
    from safetensors.torch import load_file

    ckpt, examples, stacks = reference_stacks
    head = load_file(str(ckpt / "model.safetensors"))["lm_head.weight"]
    for ex, st in zip(examples, stacks):
        P, N = len(ex.prompt), len(ex.tokens)
        pred = (st[8, P - 1: N - 1] @ head.T).argmax(-1).tolist()  # hs[L] is after the final norm
        assert pred == list(ex.continuation), ex.name


def test_offline_miswirings_fall_below_the_gate(draft_dir: Path, quality: dict, reference_stacks,
                                                record_property) -> None:
    """The shipped draft on the reference's aux states: correct >> each miswiring."""
    from safetensors.torch import load_file

    from pytest_eagle3.draft.offline import evaluate_wirings
    from pytest_eagle3.draft.wiring import input_layernorm_weights

    ckpt, examples, stacks = reference_stacks
    sd = load_file(str(ckpt / "model.safetensors"))
    params, cfg = _load_draft(draft_dir)
    got = evaluate_wirings(
        params, cfg, sd["model.embed_tokens.weight"], examples, stacks, CONTRACT_HS,
        norms=input_layernorm_weights(sd, 8), eps=1e-6,
    )
    gates = quality["gates"]
    record_property("offline", {n: (round(q.first_token_accuracy, 3), round(q.accept_length, 3))
                                for n, q in got.items()})
    correct = got[CORRECT]
    assert correct.accept_length >= gates["min_accept_length"]
    assert correct.first_token_accuracy >= gates["min_first_token_accuracy"]
    best = max(got[n].accept_length for n in MISWIRINGS)
    assert correct.accept_length >= POWER_RATIO * best, {n: got[n].accept_length for n in MISWIRINGS}
    for name in (*MISWIRINGS, *PROBES):
        assert got[name].accept_length < gates["min_accept_length"], name
    for name in BENIGN:
        assert got[name].accept_length >= gates["min_accept_length"], name
    # the reference and the builder's own fp32 forward agree on the stored numbers
    for name, q in got.items():
        stored = quality["quality"][name]
        assert abs(q.accept_length - stored["accept_length"]) <= 0.05, name
        assert abs(q.first_token_accuracy - stored["first_token_accuracy"]) <= 0.03, name


# ---------------------------------------------------------------- bad input (no torch)


def _fake_draft(tmp: Path, *, config: dict | None = None, drop: tuple[str, ...] = (),
                shapes: dict | None = None) -> Path:
    """A header-only copy of the shipped draft with config edits / tensors dropped or reshaped."""
    src = shipped_draft_dir(PRESET)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(config or {})
    tensors = {n: ("F32", list(s)) for n, s in tensor_shapes(src).items() if n not in drop}
    for name, shape in (shapes or {}).items():
        tensors[name] = ("F32", list(shape))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(cfg))
    write_safetensors(tmp / "model.safetensors", tensors)
    return tmp


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    assert isinstance(exc.value, Eagle3ContractError)  # the plugin turns it into a usage error
    return msg


def test_fake_copy_of_shipped_draft_is_valid(tmp_path: Path) -> None:
    cfg = validate_draft(_fake_draft(tmp_path / "d"), 256, 2048)
    assert cfg.aux_layer_ids == tuple(CONTRACT_HS)


def test_config_and_fc_disagree(tmp_path: Path) -> None:
    d = _fake_draft(tmp_path / "d", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3, 5]}})
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(d, 256, 2048)
    msg = _one_line(exc)
    assert "fc.weight" in msg and "[256, 768]" in msg and "[256, 1024]" in msg


def test_draft_for_another_hidden_size(tmp_path: Path) -> None:
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(shipped_draft_dir(PRESET), 7168, 2048)
    msg = _one_line(exc)
    assert "hidden size 256" in msg and "7168" in msg


def test_draft_without_lm_head(tmp_path: Path) -> None:
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(_fake_draft(tmp_path / "d", drop=("lm_head.weight",)), 256, 2048)
    assert "lm_head.weight" in _one_line(exc)


def test_reduced_vocab_needs_d2t(tmp_path: Path) -> None:
    edits = dict(config={"draft_vocab_size": 512}, shapes={"lm_head.weight": (512, 256)})
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(_fake_draft(tmp_path / "a", **edits), 256, 2048)
    msg = _one_line(exc)
    assert "d2t" in msg and "2048" in msg
    with_map = _fake_draft(tmp_path / "b", config=edits["config"],
                           shapes={**edits["shapes"], "d2t": (512,), "t2d": (2048,)})
    assert validate_draft(with_map, 256, 2048).draft_vocab_size == 512
    bad_map = _fake_draft(tmp_path / "c", config=edits["config"],
                          shapes={**edits["shapes"], "d2t": (256,)})
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(bad_map, 256, 2048)
    assert "d2t" in _one_line(exc)


def test_layer_shape_disagrees(tmp_path: Path) -> None:
    # a q_proj reading H instead of the EAGLE-3 input layer's 2H
    d = _fake_draft(tmp_path / "d", shapes={"midlayer.self_attn.q_proj.weight": (256, 256)})
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(d, 256, 2048)
    assert "q_proj" in _one_line(exc)


def test_sglang_names_are_accepted(tmp_path: Path) -> None:
    """``model.layers.0.*`` (SGLang's module names) is the same as ``midlayer.*``."""
    src = shipped_draft_dir(PRESET)
    tensors = {("model." + n.replace("midlayer.", "layers.0.")): ("F32", list(s))
               for n, s in tensor_shapes(src).items() if n.startswith("midlayer.")}
    tensors.update({n: ("F32", list(s)) for n, s in tensor_shapes(src).items() if not n.startswith("midlayer.")})
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text((src / "config.json").read_text())
    write_safetensors(d / "model.safetensors", tensors)
    validate_draft(d, 256, 2048)


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda p: p / "missing", "not a directory"),
        (lambda p: p, "no config.json"),
        (lambda p: (p / "config.json").write_text("{oops") and p, "invalid"),
        (lambda p: (p / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]})) and p,
         "LlamaForCausalLMEagle3"),
        (lambda p: (p / "config.json").write_text(json.dumps({"architectures": [ARCHITECTURE]})) and p,
         "hidden_size"),
    ],
    ids=["no-dir", "no-config", "bad-json", "not-eagle3", "no-keys"],
)
def test_unreadable_drafts(tmp_path: Path, make, needle: str) -> None:
    with pytest.raises(Eagle3DraftError) as exc:
        validate_draft(make(tmp_path), 256, 2048)
    assert needle in _one_line(exc)
