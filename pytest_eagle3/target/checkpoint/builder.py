"""Write a target spec's checkpoint: ``config.json`` + ``model.safetensors``.

The directory is a plain Hugging Face checkpoint that transformers
(``from_pretrained``) and SGLang (``--model-path``) load as-is, without a
tokenizer (engines run with ``skip_tokenizer_init``), except a multimodal
wrapper's, which holds the processor SGLang loads at start whatever that flag
says (``family_worker.write_processor``). ``build_info.json``
records the spec and the calibration scales for people; loaders ignore it.

torch and safetensors are imported inside functions only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING
from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.target.checkpoint.families import (
    FAMILIES,
    NO_TRANSFORMERS_CLASS_MSG,
    UNKNOWN_FAMILY_MSG,
    family_of,
    is_deepseek,
    missing_transformers_class,
)
from pytest_eagle3.target.checkpoint.init import make_weights

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.target.spec import TargetSpec

#: Bump whenever the bytes :func:`build_checkpoint` writes for a given spec change;
#: it is part of :func:`~pytest_eagle3.target.checkpoint.cache.cache_key`, so old cache entries are not reused.
BUILDER_VERSION = "1"

#: Files every built checkpoint contains (the manifest of the cache lists them).
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
#: Sharded layout (Hugging Face): ``model-00001-of-00004.safetensors`` + index.
SHARD_FILE = "model-{i:05d}-of-{n:05d}.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: Largest shard written (bytes); smaller checkpoints are one file.
SHARD_BYTES = 2 << 30
BUILD_INFO_FILE = "build_info.json"
#: A family checkpoint builds in 4-9 s on 2 cores; a worker past this is stuck.
FAMILY_BUILD_TIMEOUT_S = 600


def _dump_json(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def write_weights(weights: "dict[str, torch.Tensor]", out_dir: Path, *, dtype: str = "float32",
                  shard_bytes: int = SHARD_BYTES) -> list[str]:
    """Write ``weights`` as safetensors in ``dtype``: one ``model.safetensors`` when
    they fit in ``shard_bytes``, else ``model-0000i-of-0000n.safetensors`` shards
    in draw order plus ``model.safetensors.index.json`` (the Hugging Face sharded
    layout transformers and SGLang load).  ``e_score_correction_bias`` stays
    float32, as in the released DeepSeek-V3 checkpoints.  Deterministic bytes.

    Returns:
        the weight file names written.
    """
    import torch
    from safetensors.torch import save_file

    target = getattr(torch, dtype) if dtype in ("float32", "bfloat16", "float16") else torch.float32

    def cast(name: str, tensor: "torch.Tensor") -> "torch.Tensor":
        keep = name.endswith("e_score_correction_bias")
        return tensor.to(device="cpu", dtype=torch.float32 if keep else target).contiguous()

    sizes = {name: w.numel() * (4 if name.endswith("e_score_correction_bias") else target.itemsize)
             for name, w in weights.items()}
    shards: list[list[str]] = [[]]
    used = 0
    for name in weights:
        if shards[-1] and used + sizes[name] > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += sizes[name]
    # One metadata key only: safetensors writes metadata from a hash map, so two
    # keys come out in a per-process random order and the bytes would differ.
    if len(shards) == 1:
        save_file({n: cast(n, weights[n]) for n in shards[0]}, str(out_dir / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        return [WEIGHTS_FILE]
    files, weight_map = [], {}
    for i, names in enumerate(shards, 1):
        fname = SHARD_FILE.format(i=i, n=len(shards))
        save_file({n: cast(n, weights[n]) for n in names}, str(out_dir / fname), metadata={"format": "pt"})
        files.append(fname)
        weight_map.update({n: fname for n in names})
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(_dump_json(index), encoding="ascii")
    return files


def build_checkpoint(spec: TargetSpec, out_dir: Path) -> None:
    """Write ``spec``'s checkpoint into ``out_dir`` (created if missing).

    Writes ``config.json`` (``spec.config``), the weights (DeepSeek-V3 by
    :mod:`.init` in this process; the other families of :mod:`.families` by
    transformers in a subprocess, :mod:`.family_worker`, so the test process
    never imports transformers) in the config's
    ``torch_dtype`` (:func:`write_weights`: one ``model.safetensors``, or bf16
    shards for a GPU preset; see :mod:`pytest_eagle3.target.checkpoint.init`)
    and ``build_info.json``.
    The same spec gives the same bytes on every run (seeded generator, rounded
    calibration scales, sorted JSON, safetensors' deterministic layout).

    Raises:
        Eagle3ConfigError: the spec's config is not a supported layout.
        OSError: ``out_dir`` cannot be written.
    """

    out_dir = Path(out_dir)
    if is_deepseek(spec.config):
        weights, made = make_weights(spec)
        scales = [asdict(s) for s in made]
        out_dir.mkdir(parents=True, exist_ok=True)
        write_weights(weights, out_dir, dtype=str(spec.config.get("torch_dtype") or "float32"))
    else:
        scales = _build_family(spec, out_dir)
    (out_dir / CONFIG_FILE).write_text(_dump_json(spec.config), encoding="ascii")
    info = {
        "builder_version": BUILDER_VERSION,
        "spec": spec.key_material(),
        "description": spec.description,
        "branch_scales": scales,
    }
    if not is_deepseek(spec.config):
        # The bytes of a family checkpoint come from transformers' class and torch's generator.
        info["built_with"] = {name: metadata.version(name) for name in ("transformers", "torch")}
    (out_dir / BUILD_INFO_FILE).write_text(_dump_json(info), encoding="ascii")


def _build_family(spec: TargetSpec, out_dir: Path) -> list[dict]:
    """Run :mod:`.family_worker` for a non-DeepSeek spec; returns its calibration record.

    Raises:
        Eagle3ConfigError: the family is unknown, the installed transformers
            lacks its model folder, or the worker failed (its last stderr line
            in the message).
    """
    family = family_of(spec.config)
    if family is None:
        raise Eagle3ConfigError(UNKNOWN_FAMILY_MSG.format(
            model_type=spec.config.get("model_type"), known=", ".join(sorted(FAMILIES))))
    where = missing_transformers_class(family)
    if where is not None:
        raise Eagle3ConfigError(NO_TRANSFORMERS_CLASS_MSG.format(
            preset=spec.name, model_type=family.model_type, folder=family.transformers_folder, where=where))
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps({"seed": spec.seed, "init": spec.init.to_dict(), "config": spec.config}),
                             encoding="ascii")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1")
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest_eagle3.target.checkpoint.family_worker",
                                   "--spec", str(spec_file), "--out", str(out_dir)],
                                  capture_output=True, text=True, env=env, timeout=FAMILY_BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Eagle3ConfigError(f"building target {spec.name} with transformers took over "
                                    f"{FAMILY_BUILD_TIMEOUT_S} s: the worker is stuck") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise Eagle3ConfigError(f"building target {spec.name} with transformers failed: "
                                f"{lines[-1] if lines else 'exit status %d' % proc.returncode}")
    scales_file = out_dir / "scales.json"
    scales = json.loads(scales_file.read_text(encoding="ascii"))
    scales_file.unlink()
    return scales
