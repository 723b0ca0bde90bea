"""pytest-eagle3: prove SGLang feeds an EAGLE-3 draft the aux hidden states it was trained on.

The path of data through the package::

    target/spec.py (TargetSpec) -> target/checkpoint/ (cached safetensors checkpoint)
      -> target/reference.py (transformers hidden states)
      -> engine/ (SGLang in a subprocess) -> capture/ (aux hidden states)
      -> verdicts/ (against the reference and the contract, named in snapshots.py terms)

contracts/, draft/ and planning/ sit above them, plugin/ and cli/ on top, and
suite/ holds the packaged tests (the order: docs/layout.md, checked by
tests/unit/test_layers.py).  Nothing here imports torch, transformers or
sglang at import time.
"""

from __future__ import annotations

__version__ = "0.1.0"
