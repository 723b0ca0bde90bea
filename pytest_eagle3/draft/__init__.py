"""Synthetic EAGLE-3 drafts: a draft SGLang loads, trained on a target preset.

Modules (each does one job; none imports torch at import time):

* :mod:`.config`: :class:`~.config.DraftConfig`, the draft's ``config.json`` keys
  as SGLang 0.5.23's ``LlamaForCausalLMEagle3`` reads them, and the weight names;
* :mod:`.model`: a plain-torch forward computing what SGLang computes
  (``sglang/srt/models/llama_eagle3.py``), batched over all draft chains;
* :mod:`.data`: the target's greedy continuations of the suite prompts and
  their aux hidden states (the training/evaluation set);
* :mod:`.wiring`: correct and miswired aux inputs built from residual-stream
  snapshots (the negative controls);
* :mod:`.train`: the reproducible training procedure (fixed seed and steps);
* :mod:`.offline`: first-token accuracy and simulated accept length;
* :mod:`.build`: writes the draft directory (``config.json``,
  ``model.safetensors``, ``quality.json``, ``continuations.json``);
* :mod:`.validate`: one-line errors for a draft that cannot fit a target.
"""

from __future__ import annotations

from pytest_eagle3.draft.validate import Eagle3DraftError, validate_draft
from pytest_eagle3.target.spec import fixtures_dir

__all__ = ["Eagle3DraftError", "validate_draft", "shipped_draft_dir"]


def shipped_draft_dir(preset: str):
    """``fixtures/drafts/<preset>``: the packaged draft of a target preset (may not exist)."""

    return fixtures_dir() / "drafts" / preset
