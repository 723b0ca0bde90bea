"""Does the acceptance gate have teeth?  The draft offline, on SGLang's own captures.

A draft that ignores its aux input can memorise the suite's continuations as
well as one that uses it (docs/design.md, "Synthetic EAGLE-3 drafts"), so
an acceptance gate proves nothing unless miswired inputs make the same draft
fail it.  :func:`offline_power`
feeds the draft the aux states SGLang really captured (the contract's slots
replaced by the engine's rows) and the same states rearranged the way each
wiring fault would (:data:`pytest_eagle3.draft.wiring.MISWIRINGS`), and returns
the draft's offline quality under each: the correct wiring must clear the gate,
every miswiring must fall below it (the check:
:func:`pytest_eagle3.verdicts.acceptance.check_power`).

Also the offline gate of issue 8: the draft's accuracy on SGLang's captures vs
on the reference's; their gap measures wiring damage without speculative
decoding.  torch is imported inside functions only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence
from pytest_eagle3.contracts.draft import read_draft_config
from pytest_eagle3.draft.config import DraftConfig
from pytest_eagle3.draft.data import DraftExample
from pytest_eagle3.draft.offline import evaluate_wirings
from pytest_eagle3.draft.wiring import BENIGN, CORRECT, MISWIRINGS, input_layernorm_weights

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.draft.offline import Quality


@dataclass(frozen=True)
class DraftGates:
    """The acceptance gates of a draft (its ``quality.json`` ``gates``, or options)."""

    min_accept_length: float
    min_accept_rate: float
    source: str


#: Gates for a draft that ships no quality.json and none given on the command line.
DEFAULT_GATES = DraftGates(min_accept_length=1.5, min_accept_rate=0.1, source="default")


def read_gates(draft_dir: Path, *, min_accept_length: float | None = None,
               min_accept_rate: float | None = None) -> DraftGates:
    """Command-line gates win, then the draft's ``quality.json``, then :data:`DEFAULT_GATES`."""
    stored: dict[str, Any] = {}
    try:
        stored = json.loads((Path(draft_dir) / "quality.json").read_text())["gates"]
        source = f"{Path(draft_dir).name}/quality.json"
    except (OSError, ValueError, KeyError, TypeError):
        source = DEFAULT_GATES.source
    length = min_accept_length if min_accept_length is not None else stored.get(
        "min_accept_length", DEFAULT_GATES.min_accept_length)
    rate = min_accept_rate if min_accept_rate is not None else stored.get(
        "min_accept_rate", DEFAULT_GATES.min_accept_rate)
    if min_accept_length is not None or min_accept_rate is not None:
        source = "command line" + (f" + {source}" if stored else "")
    return DraftGates(float(length), float(rate), source)


def load_draft_weights(draft_dir: Path) -> tuple[dict, Any]:
    """``(params, DraftConfig)`` of a draft directory (``model.safetensors``)."""
    from safetensors.torch import load_file

    cfg = DraftConfig.from_hf_config(read_draft_config(draft_dir))
    return load_file(str(Path(draft_dir) / "model.safetensors")), cfg


#: A replayed continuation needs this many tokens: the first comes from the
#: prefill, so a one-token continuation has no verify step and no speculative metrics.
MIN_REPLAY_TOKENS = 2


def load_examples(draft_dir: Path) -> "list[DraftExample]":
    """The prompts and greedy continuations a shipped draft learnt (``continuations.json``),
    without those whose trusted continuation is shorter than :data:`MIN_REPLAY_TOKENS`
    (they teach the draft nothing either: no draft row has a trusted label);
    ``[]`` for a draft without one."""

    try:
        seqs = json.loads((Path(draft_dir) / "continuations.json").read_text())["sequences"]
    except (OSError, ValueError, KeyError):
        return []
    return [DraftExample(name=s["name"], prompt=tuple(s["prompt"]), generated=tuple(s["generated"]),
                         margins=tuple(s["margins"]), trusted=int(s["trusted"])) for s in seqs
            if int(s["trusted"]) >= MIN_REPLAY_TOKENS]


def with_captures(stacks: "Sequence[torch.Tensor]", captured: "Sequence[torch.Tensor]",
                  hs_ids: Sequence[int]) -> "list[torch.Tensor]":
    """Reference stacks ``[L+2, N, H]`` whose contract slots ``hs_ids`` hold SGLang's
    captured rows ``[n, K*H]`` instead (rows past ``n`` keep the reference)."""
    out = []
    H = stacks[0].shape[-1]
    for stack, aux in zip(stacks, captured):
        s = stack.clone()
        n = min(aux.shape[0], s.shape[1])
        for k, i in enumerate(hs_ids):
            s[i, :n] = aux[:n, k * H:(k + 1) * H]
        out.append(s)
    return out


def offline_power(draft_dir: Path, checkpoint_dir: Path, examples: "Sequence[DraftExample]",
                  stacks: "Sequence[torch.Tensor]", hs_ids: Sequence[int], *, steps: int = 3,
                  eps: float = 1e-6) -> "dict[str, Quality]":
    """The draft's offline quality under the correct wiring and every miswiring of
    :mod:`pytest_eagle3.draft.wiring`, built from ``stacks`` (pass
    :func:`with_captures` stacks to measure SGLang's captures)."""
    import torch

    params, cfg = load_draft_weights(draft_dir)
    weights = _target_weights(checkpoint_dir)
    L = stacks[0].shape[0] - 2
    with torch.no_grad():
        return evaluate_wirings(params, cfg, weights["model.embed_tokens.weight"], list(examples), list(stacks),
                                list(hs_ids), norms=input_layernorm_weights(weights, L), eps=eps, steps=steps,
                                names=[CORRECT, *MISWIRINGS, *BENIGN])


def _target_weights(checkpoint_dir: Path) -> "dict[str, torch.Tensor]":
    from safetensors.torch import load_file

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out
