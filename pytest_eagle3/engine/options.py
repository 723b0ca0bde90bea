"""What the engine layer needs to know about a run: a small options interface.

The pytest plugin's ``Settings`` (:mod:`pytest_eagle3.plugin.options`) satisfies
it, and so does any object with these attributes (a script, the CLI).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pytest_eagle3.engine.gpus import GpuProbe


class EngineOptions(Protocol):
    """The run facts GPU leases and path variants read.

    Attributes:
        device: ``"cpu"`` or ``"cuda"``.
        tp: tensor-parallel size of the run (1, 2, 4 or 8).
        gpu: what the GPU probe saw (:func:`pytest_eagle3.engine.gpus.detect_gpus`).
        cache_dir: cache of built checkpoints, references and SGLang facts.
    """

    @property
    def device(self) -> str: ...

    @property
    def tp(self) -> int: ...

    @property
    def gpu(self) -> GpuProbe: ...

    @property
    def cache_dir(self) -> Path: ...
