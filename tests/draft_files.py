"""A random-weights EAGLE-3 draft directory that SGLang's ``LlamaForCausalLMEagle3`` loads.

The layout is the one EAGLE-3 drafts ship in (SpecForge, the original EAGLE
code; read from ``sglang/srt/models/llama_eagle3.py``, 0.5.23):

* ``config.json``: a Llama config with ``architectures:
  ["LlamaForCausalLMEagle3"]``, one decoder layer, ``target_hidden_size`` =
  the target's hidden size, ``draft_vocab_size`` and
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang reads the ids
  from here and sizes ``fc`` from their count);
* ``model.safetensors`` with the legacy names SGLang maps itself
  (``midlayer.*`` -> ``layers.0.*``): ``fc.weight`` ``[H, K*H_target]``,
  ``midlayer.self_attn.{q,k,v}_proj`` whose input is ``2*H`` (embedding and
  ``fc`` output concatenated), ``midlayer.{input_layernorm,hidden_norm,
  post_attention_layernorm}``, ``midlayer.mlp.{gate,up,down}_proj``,
  ``norm.weight`` and ``lm_head.weight`` ``[draft_vocab, H]``; ``d2t``
  (int64, draft id -> target id offset) and ``t2d`` (bool over the target
  vocabulary) only when the draft vocabulary is reduced.

No ``embed_tokens``: SGLang's EAGLE worker shares the target's embedding with
the draft.  Random weights make a draft whose proposals are almost never
accepted: enough to run speculative decoding end to end and to read the
captures it is fed, not to measure acceptance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_eagle3.draft.random_draft import draft_config, draft_weights, write_draft  # noqa: F401


# -- a draft that is accepted ---------------------------------------------------

#: The quick memorising draft: 3 suite prompts, 24 greedy tokens, 300 steps.
MEMORISED_PROMPTS = 3
MEMORISED_NEW_TOKENS = 24
MEMORISED_STEPS = 300
MEMORISED_IDS = (0, 3, 6)


def shipped_or_memorised_draft(cache_root: Path, progress=None) -> Path | None:
    """A draft SGLang accepts on the suite prompts, or None if none can be had.

    The packaged ``fixtures/drafts/tiny-dsv3`` when it exists (the project's
    trained synthetic draft); otherwise a quick memorising draft built once per
    cache with the project's own trainer (:mod:`pytest_eagle3.draft`): it learns
    the target's greedy continuations of the first :data:`MEMORISED_PROMPTS`
    suite prompts (about a minute on 2 cores).  Its directory holds
    ``continuations.json`` (``[{"prompt": [...], "continuation": [...]}, ...]``).
    """
    try:
        from pytest_eagle3.draft import shipped_draft_dir

        shipped = shipped_draft_dir("tiny-dsv3")
        if (shipped / "config.json").is_file() and (shipped / "model.safetensors").is_file():
            return shipped
    except ImportError:
        pass
    return memorised_draft(cache_root, progress)


def memorised_draft(cache_root: Path, progress=None) -> Path | None:
    """The quick memorising draft (see :func:`shipped_or_memorised_draft`), built once per cache;
    None when this checkout has no trainer."""
    try:
        from pytest_eagle3.draft.data import make_examples, snapshots, target_weights
        from pytest_eagle3.draft.train import TrainSettings, train_draft
        from pytest_eagle3.draft.wiring import input_layernorm_weights
    except ImportError:
        return None
    import dataclasses
    import hashlib
    import os
    import shutil

    from filelock import FileLock

    from pytest_eagle3.target.checkpoint.cache import cache_key
    from pytest_eagle3.target.spec import TargetSpec, load_packaged_prompts

    spec = TargetSpec.preset("tiny-dsv3")
    key = hashlib.sha256(json.dumps(
        [cache_key(spec), MEMORISED_PROMPTS, MEMORISED_NEW_TOKENS, MEMORISED_STEPS, MEMORISED_IDS]
    ).encode()).hexdigest()[:16]
    final = Path(cache_root) / "drafts" / f"memorised-tiny-dsv3-{key}"
    if (final / "continuations.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / "continuations.json").is_file():
            return final
        sd, dims = target_weights(spec)
        prompts = load_packaged_prompts()[:MEMORISED_PROMPTS]
        examples = make_examples(sd, dims, prompts, max_new_tokens=MEMORISED_NEW_TOKENS)
        stacks = [snapshots(sd, dims, e.tokens) for e in examples]
        # The trainer's own defaults (negatives included), fewer steps: 3 prompts memorise fast.
        # Only fields this version of TrainSettings has are set (the trainer is still evolving).
        wanted = {"steps": MEMORISED_STEPS, "max_new_tokens": MEMORISED_NEW_TOKENS, "positive_fraction": 1.0,
                  "negative_weight": 0.0, "unlikelihood_weight": 0.0, "negatives": 1}
        known = {f.name for f in dataclasses.fields(TrainSettings)}
        settings = TrainSettings(**{k: v for k, v in wanted.items() if k in known})
        result = train_draft(examples, stacks, sd["model.embed_tokens.weight"], list(MEMORISED_IDS),
                             input_layernorm_weights(sd, dims.layers), float(dims.eps), settings,
                             progress=progress)
        from safetensors.torch import save_file

        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_file(result.params, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(result.cfg.to_hf_config(), indent=2) + "\n")
        (tmp / "continuations.json").write_text(json.dumps([e.to_json() for e in examples]) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    return final


def draft_prompts(draft_dir: Path) -> list[dict[str, Any]] | None:
    """``[{"prompt": ids, "continuation": ids}, ...]`` the draft learned, if it says."""
    path = Path(draft_dir) / "continuations.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if isinstance(data, dict):
        data = data.get("sequences") or data.get("examples") or data.get("continuations") or []
    return [{"prompt": list(e["prompt"]), "continuation": list(e.get("continuation", []))} for e in data]


def with_top_level_ids(src: Path, dst: Path) -> Path:
    """A copy of the draft directory ``src`` at ``dst`` with its ids moved from
    ``eagle_config`` to the top level of ``config.json`` (where the MLA draft
    sizes ``fc`` from them and SGLang's target side never reads them)."""
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    key = "eagle_aux_hidden_state_layer_ids"
    cfg[key] = cfg["eagle_config"].pop(key)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst
