"""pytest-eagle3: prove SGLang feeds an EAGLE-3 draft the aux hidden states it was trained on.

The path of data through the package::

    spec.py (TargetSpec) -> checkpoint/ (cached safetensors checkpoint)
      -> reference.py (transformers hidden states)
      -> engine/ (SGLang in a subprocess) -> capture.py (aux hidden states)
      -> compare.py (verdict against the contract, named in snapshots.py terms)

Nothing here imports torch, transformers or sglang at import time.
"""

from __future__ import annotations

__version__ = "0.1.0"
