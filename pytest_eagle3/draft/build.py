"""Build the synthetic EAGLE-3 draft directory of a target preset.

``python -m pytest_eagle3.draft.build [--preset tiny-dsv3] [--out DIR]`` (or
``benchmarks/make_draft.py``) writes, atomically (a temporary sibling renamed into
place), the directory SGLang loads with ``--speculative-draft-model-path``:

* ``config.json``: :meth:`pytest_eagle3.draft.config.DraftConfig.to_hf_config`
  (``architectures: [LlamaForCausalLMEagle3]``, ``eagle_config.eagle_aux_hidden_state_layer_ids``,
  ``draft_vocab_size``, ...) plus a ``pytest_eagle3`` block: the contract it was
  trained on, the hs indices, the target preset and its checkpoint cache key;
* ``model.safetensors``: float32 tensors named as in :func:`pytest_eagle3.draft.config.weight_names`;
* ``quality.json``: offline quality for the correct wiring, each miswiring and each
  benign change (:mod:`.offline`), the suggested gates, the settings, timings, sizes;
* ``continuations.json``: the prompts and the target's greedy continuations the draft
  learnt (the acceptance test replays these and counts acceptance only up to the
  first token where the engine leaves them).

The default output is the packaged ``fixtures/drafts/<preset>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Callable
from pytest_eagle3.target.checkpoint import cache
from pytest_eagle3.settings import default_cache_dir
from pytest_eagle3.target.checkpoint.families import is_deepseek
from pytest_eagle3.contracts.catalog import contracts_dir, load_contract_fixture
from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.draft import data, offline, wiring
from pytest_eagle3.draft.train import TrainSettings, train_draft
from pytest_eagle3.target.spec import TargetSpec, fixtures_dir, load_packaged_prompts, prompts_path

#: Draft variants besides the Llama-style default: name -> TrainSettings overrides.
#: ``--variant NAME`` writes ``fixtures/drafts/<preset>-<NAME>``.
VARIANTS: dict[str, dict[str, Any]] = {
    "mla": {"attention": "mla"},
    "mla-fc-norm": {"attention": "mla", "fc_norm": True},
    "mla-norm-output": {"attention": "mla", "norm_output": True},
}

#: Bump when the files written for the same inputs change.
DRAFT_BUILDER_VERSION = "1"
#: The contract the packaged drafts are trained on (the suite's wide case).
DEFAULT_CONTRACT = "kimi-embedding-first"
#: The contract of the other families' drafts: ids [1, L//2-1, L-4] -> hs[2], hs[4], hs[5]
#: on every family's SGLang rule (no rule outside DeepSeek can capture the embedding).
FAMILY_CONTRACT = "specforge-default-ids"
DEFAULT_PRESET = "tiny-dsv3"
QUALITY_FILE = "quality.json"
CONTINUATIONS_FILE = "continuations.json"
WEIGHTS_FILE = "model.safetensors"


def checkpoint_key(spec) -> str:
    """The target checkpoint's cache key (sha256 of its spec and builder version)."""

    if hasattr(cache, "cache_key"):
        return cache.cache_key(spec)
    return spec.cache_key()  # older layout: a TargetSpec method


def contract_ids(contract: str, num_layers: int, hidden_size: int) -> tuple[list[int], list[int]]:
    """``(declared ids, hs indices)`` of a contract fixture on an ``num_layers``-layer target.

    Raises:
        Eagle3ContractError: unknown or invalid fixture on this target.
    """

    path = contracts_dir() / f"{contract}.json"
    if not path.is_file():
        raise Eagle3ContractError(f"no contract fixture {path}; pass a name from {contracts_dir()}")
    fx = load_contract_fixture(path, num_layers, hidden_size=hidden_size)
    if fx.contract is None or fx.ids is None:
        raise Eagle3ContractError(f"contract {contract} is not usable on {num_layers} layers: {fx.error}")
    return list(fx.ids), list(fx.contract.to_snapshot_indices(num_layers))


def suggested_gates(quality: dict[str, Any], miswirings: list[str], probes: list[str] = ()) -> dict[str, Any]:
    """Default acceptance gates: halfway between the correct wiring and the best miswiring.

    Returns ``min_accept_length``, ``min_accept_rate``, ``min_first_token_accuracy``
    (the gates), ``best_miswired_accept_length``, ``power_ratio`` (correct accept length
    / best miswired one) and ``best_probe_accept_length`` (probes: below the gate, not part of the power ratio).
    """
    correct = quality["correct"]
    # Only the miswirings evaluated for this contract (no embedding slot: no "embedding-replaced").
    miswirings = [n for n in miswirings if n in quality]
    worst = {k: max(quality[n][k] for n in miswirings)
             for k in ("accept_length", "accept_rate", "first_token_accuracy")}

    def mid(key: str, ndigits: int = 2) -> float:
        return round((correct[key] + worst[key]) / 2, ndigits)

    gates = {
        "min_accept_length": mid("accept_length"),
        "min_accept_rate": mid("accept_rate"),
        "min_first_token_accuracy": mid("first_token_accuracy"),
        "best_miswired_accept_length": round(worst["accept_length"], 4),
        "power_ratio": round(correct["accept_length"] / worst["accept_length"], 3),
    }
    if probes:
        gates["best_probe_accept_length"] = round(max(quality[n]["accept_length"] for n in probes), 4)
    return gates


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_draft(
    preset: str = DEFAULT_PRESET,
    out_dir: Path | None = None,
    *,
    contract: str | None = None,
    settings=None,
    steps: int = 3,
    progress: Callable[[str], None] | None = None,
    cache_root: Path | None = None,
) -> Path:
    """Train the preset's draft and write its directory; return the directory.

    Args:
        preset: a target preset name (``fixtures/targets/<preset>.json``).
        out_dir: where to write (default ``fixtures/drafts/<preset>``); replaced atomically.
        contract: the contract fixture whose ids the draft declares and is trained on
            (default :data:`DEFAULT_CONTRACT` for DeepSeek-V3, :data:`FAMILY_CONTRACT` otherwise).
        settings: :class:`pytest_eagle3.draft.train.TrainSettings` (default: its defaults).
        steps: draft steps the quality is measured with (``speculative_num_steps``).
        progress: called with one-line status messages.
        cache_root: where a non-DeepSeek preset's checkpoint is built and read
            (default: the plugin's default cache, ``~/.cache/pytest-eagle3``).

    Raises:
        Eagle3ConfigError: unknown preset; Eagle3ContractError: bad contract.
    """
    import torch
    from safetensors.torch import save_file

    say = progress or (lambda _msg: None)
    settings = settings or TrainSettings()
    spec = TargetSpec.preset(preset)
    L, H, V = (int(spec.config[k]) for k in ("num_hidden_layers", "hidden_size", "vocab_size"))
    contract = contract or (DEFAULT_CONTRACT if is_deepseek(spec.config) else FAMILY_CONTRACT)
    declared, hs_ids = contract_ids(contract, L, H)
    out_dir = Path(out_dir) if out_dir is not None else fixtures_dir() / "drafts" / preset

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        say(f"{preset}: greedy continuations of {prompts_path().name} ...")
        if is_deepseek(spec.config):
            sd, dims = data.target_weights(spec)
            examples = data.make_examples(
                sd, dims, load_packaged_prompts(vocab_size=V), data.prompt_names(),
                max_new_tokens=settings.max_new_tokens, min_margin=settings.min_margin,
            )
            stacks = [data.snapshots(sd, dims, ex.tokens) for ex in examples]
            embed, norms, eps = sd["model.embed_tokens.weight"], wiring.input_layernorm_weights(sd, L), dims.eps
        else:  # the other families run on transformers (draft/data.py TransformersTarget)
            target = data.TransformersTarget(spec, cache_root or default_cache_dir()[0])
            examples = target.examples(load_packaged_prompts(vocab_size=V), data.prompt_names(),
                                       max_new_tokens=settings.max_new_tokens, min_margin=settings.min_margin)
            stacks = [target.snapshots(ex.tokens) for ex in examples]
            embed, norms, eps = target.embed, target.norms, target.eps
        data_seconds = time.perf_counter() - t0
        say(f"{preset}: training on hs{hs_ids} ({settings.steps} steps, seed {settings.seed}) ...")
        result = train_draft(examples, stacks, embed, hs_ids, norms, eps, settings,
                             target_config=dict(spec.config), progress=say)
        say(f"{preset}: offline quality ...")
        qualities = offline.evaluate_wirings(
            result.params, result.cfg, embed, examples, stacks, hs_ids, norms=norms, eps=eps, steps=steps,
        )
    finally:
        torch.set_num_threads(threads)

    quality = {name: q.to_json() for name, q in qualities.items()}
    gates = suggested_gates(quality, list(wiring.MISWIRINGS), list(wiring.PROBES))
    provenance = {
        "builder_version": DRAFT_BUILDER_VERSION,
        "contract": contract,
        "declared_ids": declared,
        "trained_on_hs_indices": hs_ids,
        "target": {"preset": preset, "checkpoint_key": checkpoint_key(spec), "num_layers": L,
                   "hidden_size": H, "vocab_size": V},
        "recipe": "pytest_eagle3.draft.train (python -m pytest_eagle3.draft.build)",
        "prompts": str(prompts_path().name),
    }
    cfg = result.cfg
    if list(cfg.aux_layer_ids) != declared:  # the config declares the contract's ids
        from dataclasses import replace

        cfg = replace(cfg, aux_layer_ids=tuple(declared))

    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        (tmp / "config.json").write_text(
            json.dumps(cfg.to_hf_config({"pytest_eagle3": provenance}), indent=2) + "\n", encoding="utf-8")
        save_file({k: v.contiguous() for k, v in result.params.items()}, str(tmp / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        os.chmod(tmp / WEIGHTS_FILE, 0o644)
        (tmp / CONTINUATIONS_FILE).write_text(json.dumps(
            {"description": "Target greedy continuations the draft learnt; 'continuation' is the "
                            f"leading run with top-2 logit margin >= {settings.min_margin}.",
             "target": preset, "sequences": [ex.to_json() for ex in examples]}, indent=1) + "\n",
            encoding="utf-8")
        weights_bytes = (tmp / WEIGHTS_FILE).stat().st_size
        report = {
            "description": "Offline quality of the draft: fed the target's aux states under each "
                           "wiring, topk 1; accept_length = tokens per verify (max steps+1).",
            "preset": preset,
            "contract": contract,
            "hs_indices": hs_ids,
            "steps": steps,
            "topk": 1,
            "seed": settings.seed,
            "train_steps": settings.steps,
            "training_seconds": round(result.seconds, 1),
            "training_cpu_seconds": round(result.cpu_seconds, 1),
            "data_seconds": round(data_seconds, 1),
            "parameters": cfg.num_parameters(),
            "weights_bytes": weights_bytes,
            "weights_sha256": _sha256(tmp / WEIGHTS_FILE),
            "slot_scales": [round(s, 6) for s in result.slot_scales],
            "rows": qualities["correct"].rows,
            "gates": gates,
            "quality": quality,
            "miswirings": dict(wiring.MISWIRINGS),
            "probes": dict(wiring.PROBES),
            "benign": dict(wiring.BENIGN),
            "settings": settings.to_json(),
            "losses": result.losses,
            "versions": {"torch": metadata.version("torch"), "python": sys.version.split()[0]},
        }
        (tmp / QUALITY_FILE).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        if out_dir.exists():
            old = parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"{preset}: wrote {out_dir} (correct accept length {quality['correct']['accept_length']}, "
        f"best miswired {gates['best_miswired_accept_length']}, {weights_bytes} bytes)")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Command line: train and write a preset's draft directory."""

    ap = argparse.ArgumentParser(prog="python -m pytest_eagle3.draft.build", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default=DEFAULT_PRESET)
    ap.add_argument("--out", type=Path, default=None, help="output directory (default fixtures/drafts/<preset>)")
    ap.add_argument("--contract", default=None,
                    help=f"contract fixture (default {DEFAULT_CONTRACT} for DeepSeek-V3, {FAMILY_CONTRACT} otherwise)")
    ap.add_argument("--seed", type=int, default=TrainSettings.seed)
    ap.add_argument("--train-steps", type=int, default=TrainSettings.steps)
    ap.add_argument("--variant", choices=list(VARIANTS), default=None,
                    help="an MLA draft variant (default: the Llama-style draft); writes "
                    "fixtures/drafts/<preset>-<variant> unless --out says otherwise")
    args = ap.parse_args(argv)
    settings = TrainSettings(seed=args.seed, steps=args.train_steps, **VARIANTS.get(args.variant or "", {}))
    out_dir = args.out
    if out_dir is None and args.variant:
        out_dir = fixtures_dir() / "drafts" / f"{args.preset}-{args.variant}"
    start = time.perf_counter()
    out = build_draft(args.preset, out_dir, contract=args.contract, settings=settings,
                      progress=lambda m: print(m, flush=True))
    print(f"done in {time.perf_counter() - start:.0f} s: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
