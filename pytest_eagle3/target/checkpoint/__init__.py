"""Built target checkpoints: spec -> deterministic weights -> cached directory.

* :mod:`.init`: the distinguishable-layers weights (torch, imported lazily);
* :mod:`.builder`: writes ``config.json`` + ``model.safetensors``;
* :mod:`.cache`: :func:`ensure_checkpoint`, the keyed, atomic, xdist-safe cache.

Importing this package does not import torch.
"""

from __future__ import annotations

from pytest_eagle3.target.checkpoint.builder import BUILDER_VERSION, build_checkpoint
from pytest_eagle3.target.checkpoint.cache import cache_key, check_entry, ensure_checkpoint, entry_dir

__all__ = ["BUILDER_VERSION", "build_checkpoint", "cache_key", "check_entry", "ensure_checkpoint", "entry_dir"]
