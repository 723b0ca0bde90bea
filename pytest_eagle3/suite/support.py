"""Small helpers shared by the packaged suite's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pytest_eagle3.plugin.options import Settings

#: Relative L2 tolerance for a slot to count as the expected snapshot.  CPU runs
#: in float32 (measured 6e-6 on sglang 0.5.23); CUDA kernels differ more (TF32,
#: fused kernels).  Distinct snapshots of the preset targets differ by >= 0.48.
CPU_TOL = 1e-3
CUDA_TOL = 2e-2


def tolerance(settings: Settings) -> float:
    return CPU_TOL if settings.device == "cpu" else CUDA_TOL


def write_draft_config(directory: Path, ids: Sequence[int] | None, hidden_size: int) -> Path:
    """Write the ``config.json`` a SpecForge/SGLang-style EAGLE-3 draft ships.

    Ids go under ``eagle_config.eagle_aux_hidden_state_layer_ids``, the only key
    SGLang 0.5.23 reads (``srt/model_executor/model_runner_components/
    spec_aux_hidden_state.py``); ``None`` leaves the key out, as a draft that
    declares no ids does.  No weights: the capture tests need none.
    """
    import json

    directory.mkdir(parents=True, exist_ok=True)
    eagle_config: dict = {"use_aux_hidden_state": True}
    if ids is not None:
        eagle_config["eagle_aux_hidden_state_layer_ids"] = list(ids)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "target_hidden_size": hidden_size,
        "num_hidden_layers": 1,
        "eagle_config": eagle_config,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory
