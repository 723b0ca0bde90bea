"""Negative controls of the acceptance gate on the real engine (CPU, TP 1).

The shipped draft and the shipped MLA draft (SGLang's ``Eagle3DeepseekV2ForCausalLM``)
are served under wirings that need no patching of SGLang, each a copy of the
draft directory with one change, exactly as a user could ship it: ids shifted by
one, the embedding id replaced, no ids (SGLang's default list), ``fc`` blocks
permuted, and for the MLA draft its ids only at the top level (its ``fc`` is
still sized for them; SGLang's target side reads only ``eagle_config``).  Each
must fall below the gate the correct draft clears, and the correct accept length
must be at least :data:`POWER_RATIO` x the best miswired one.  The model-family
drafts (``tiny-llama``, ``tiny-gpt-oss``, ...) run on their own target preset with
the controls of :data:`FAMILY_MISWIRED`.  One inner pytest
run per draft, one engine per control (about 1 minute each on 2 cores).
``PYTEST_EAGLE3_CONTROLS_TP=2`` runs the same at TP 2.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.inner_run import run_inner

pytestmark = [pytest.mark.e2e, pytest.mark.slow(reason="eleven negative-control engines, about 9 min")]

POWER_RATIO = 2.0
TP = int(os.environ.get("PYTEST_EAGLE3_CONTROLS_TP", "1"))

INNER = '''
import json
import pytest
from pytest_eagle3.planning.declare import EngineRequest
from pytest_eagle3.capture.spec_metrics import aggregate
from pytest_eagle3.draft.power import load_examples

DRAFTS = json.loads(open("drafts.json").read())


@pytest.mark.tp({tp})
@pytest.mark.parametrize("control", sorted(DRAFTS))
def test_control(control, eagle3_capture, record_property):
    draft = DRAFTS[control]
    examples = load_examples(draft)
    runs = eagle3_capture.speculate(EngineRequest(None, draft=draft), [list(e.prompt) for e in examples],
                                    [len(e.continuation) for e in examples])
    total = aggregate([r.metrics for r in runs])
    print("RESULT", json.dumps({{"control": control, "accept_length": total.accept_length,
                               "accept_rate": total.accept_rate, "verify_count": total.verify_count}}))
'''


def _copy(src: Path, dst: Path, edit_config=None, edit_weights=None) -> str:
    shutil.copytree(src, dst)
    if edit_config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    if edit_weights is not None:
        from safetensors.torch import load_file, save_file

        w = load_file(str(dst / "model.safetensors"))
        edit_weights(w)
        save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


#: The drafts under test (``fixtures/drafts/<name>``; ``PYTEST_EAGLE3_CONTROLS_DRAFTS=a,b``
#: picks others, e.g. ``tiny-dsv3-mla-fc-norm,tiny-dsv3-mla-norm-output`` or the model
#: families' ``tiny-llama,tiny-gpt-oss``, each served on its own target preset) and the
#: controls each gets.
DRAFTS = tuple(os.environ.get("PYTEST_EAGLE3_CONTROLS_DRAFTS", "tiny-dsv3,tiny-dsv3-mla").split(","))
MISWIRED = ("ids-shifted-by-one", "embedding-id-replaced", "no-ids-server-default", "fc-blocks-permuted")
MLA_ONLY = ("top-level-ids-only",)
#: The model-family drafts (ids [1, 3, 4] -> hs[2], hs[4], hs[5], no embedding id) replace
#: two controls: SGLang's default list [2, L//2, L-3] *is* their wiring on those
#: families' rule, and there is no embedding id to replace, so the first id is lowered
#: by one instead (hs[1] for hs[2]).
FAMILY_MISWIRED = ("ids-shifted-by-one", "first-id-lowered", "fc-blocks-permuted")


def controls(src: Path, root: Path) -> dict[str, str]:
    config = json.loads((src / "config.json").read_text())
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]

    def shifted(cfg):
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids]

    def no_embedding(cfg):
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1 if i == 0 else i for i in ids]

    def first_lowered(cfg):
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [ids[0] - 1, *ids[1:]]

    def no_ids(cfg):
        del cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]

    def permute_fc(w):
        import torch

        fc = w["fc.weight"]
        h = fc.shape[1] // len(ids)
        blocks = list(torch.split(fc, h, dim=1))
        w["fc.weight"] = torch.cat(blocks[1:] + blocks[:1], dim=1).contiguous()

    def top_level_only(cfg):
        cfg["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")

    out = {
        "correct": _copy(src, root / "correct"),
        "ids-shifted-by-one": _copy(src, root / "shifted", edit_config=shifted),
        "embedding-id-replaced": _copy(src, root / "no-embedding", edit_config=no_embedding),
        "no-ids-server-default": _copy(src, root / "no-ids", edit_config=no_ids),
        "fc-blocks-permuted": _copy(src, root / "fc-permuted", edit_weights=permute_fc),
    }
    if _is_family(config):
        del out["embedding-id-replaced"], out["no-ids-server-default"]
        out["first-id-lowered"] = _copy(src, root / "first-lowered", edit_config=first_lowered)
    if "Eagle3DeepseekV2ForCausalLM" in config["architectures"]:
        # The ids-only-at-top-level control replaces the no-ids one: SGLang reads no ids in either.
        del out["no-ids-server-default"]
        out["top-level-ids-only"] = _copy(src, root / "top-level", edit_config=top_level_only)
    return out


def _is_mla(draft: str) -> bool:
    from pytest_eagle3.draft import shipped_draft_dir

    config = json.loads((shipped_draft_dir(draft) / "config.json").read_text())
    return "Eagle3DeepseekV2ForCausalLM" in config["architectures"]


def _is_family(config: dict) -> bool:
    """A model-family draft (``fixtures/drafts/tiny-llama``, ...): its target is not DeepSeek-V3."""
    from pytest_eagle3.target.spec import TargetSpec
    from pytest_eagle3.target.checkpoint.families import is_deepseek

    preset = config.get("pytest_eagle3", {}).get("target", {}).get("preset", "tiny-dsv3")
    return not is_deepseek(TargetSpec.preset(preset).config)


def _target(draft: str) -> str:
    from pytest_eagle3.draft import shipped_draft_dir

    config = json.loads((shipped_draft_dir(draft) / "config.json").read_text())
    return config.get("pytest_eagle3", {}).get("target", {}).get("preset", "tiny-dsv3")


def _expected_controls(draft: str) -> tuple[str, ...]:
    from pytest_eagle3.draft import shipped_draft_dir

    if _is_family(json.loads((shipped_draft_dir(draft) / "config.json").read_text())):
        return FAMILY_MISWIRED
    if _is_mla(draft):
        return tuple(c for c in MISWIRED if c != "no-ids-server-default") + MLA_ONLY
    return MISWIRED


@pytest.fixture(scope="module", params=DRAFTS)
def draft(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def results(draft: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    from pytest_eagle3.draft import shipped_draft_dir

    work = tmp_path_factory.mktemp(f"controls-{draft}")
    drafts = controls(shipped_draft_dir(draft), work / "drafts")
    (work / "drafts.json").write_text(json.dumps(drafts))
    run = run_inner(work, ["test_controls.py", "--tp", str(TP), "-s", "--eagle3-target", _target(draft)],
                    files={"test_controls.py": INNER.format(tp=TP)})
    out = {}
    for line in run.output.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            out[r["control"]] = r
    assert set(out) == set(drafts), run.output[-4000:]
    (work / "results.json").write_text(json.dumps(out, indent=2))
    for name, r in out.items():  # shown with -s
        print(f"{draft} TP {TP} {name}: accept length {r['accept_length']:.3f}, rate "
              f"{r['accept_rate'] if r['accept_rate'] is None else round(r['accept_rate'], 3)}, "
              f"{r['verify_count']} verifies")
    return out


def test_correct_draft_clears_the_gate(results, draft: str) -> None:
    from pytest_eagle3.draft import shipped_draft_dir
    from pytest_eagle3.draft.power import read_gates

    gates = read_gates(shipped_draft_dir(draft))
    assert results["correct"]["accept_length"] >= gates.min_accept_length, results


def test_miswired_drafts_fall_below_the_gate(results, draft: str) -> None:
    from pytest_eagle3.draft import shipped_draft_dir
    from pytest_eagle3.draft.power import read_gates

    gates = read_gates(shipped_draft_dir(draft))
    held = {c: results[c]["accept_length"] for c in _expected_controls(draft)
            if results[c]["accept_length"] >= gates.min_accept_length}
    assert not held, f"{draft}: miswired controls clear the gate {gates.min_accept_length}: {held}"


def test_correct_is_at_least_twice_the_best_miswired(results) -> None:
    best = max(r["accept_length"] for name, r in results.items() if name != "correct")
    assert results["correct"]["accept_length"] >= POWER_RATIO * best, results
