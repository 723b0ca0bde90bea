"""Write a target spec's checkpoint: ``config.json`` + ``model.safetensors``.

The directory is a plain Hugging Face checkpoint that transformers
(``from_pretrained``) and SGLang (``--model-path``) load as-is, without a
tokenizer (engines run with ``skip_tokenizer_init``). ``build_info.json``
records the spec and the calibration scales for people; loaders ignore it.

torch and safetensors are imported inside functions only.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_eagle3.target.spec import TargetSpec

#: Bump whenever the bytes :func:`build_checkpoint` writes for a given spec change;
#: it is part of :func:`~pytest_eagle3.target.checkpoint.cache.cache_key`, so old cache entries are not reused.
BUILDER_VERSION = "1"

#: Files every built checkpoint contains (the manifest of the cache lists them).
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
BUILD_INFO_FILE = "build_info.json"


def _dump_json(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


def build_checkpoint(spec: TargetSpec, out_dir: Path) -> None:
    """Write ``spec``'s checkpoint into ``out_dir`` (created if missing).

    Writes ``config.json`` (``spec.config``), ``model.safetensors`` (float32
    weights, see :mod:`pytest_eagle3.target.checkpoint.init`) and ``build_info.json``.
    The same spec gives the same bytes on every run (seeded generator, rounded
    calibration scales, sorted JSON, safetensors' deterministic layout).

    Raises:
        Eagle3ConfigError: the spec's config is not a supported layout.
        OSError: ``out_dir`` cannot be written.
    """
    from safetensors.torch import save_file

    from pytest_eagle3.target.checkpoint.init import make_weights

    weights, scales = make_weights(spec)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(_dump_json(spec.config), encoding="ascii")
    save_file(
        weights,
        str(out_dir / WEIGHTS_FILE),
        # One key only: safetensors writes metadata from a hash map, so two keys
        # come out in a per-process random order and the bytes would differ.
        metadata={"format": "pt"},
    )
    info = {
        "builder_version": BUILDER_VERSION,
        "spec": spec.key_material(),
        "description": spec.description,
        "branch_scales": [asdict(s) for s in scales],
    }
    (out_dir / BUILD_INFO_FILE).write_text(_dump_json(info), encoding="ascii")
