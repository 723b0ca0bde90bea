"""What the synthetic draft learns: the target's greedy continuations of the suite prompts.

A random target's next token behaves like a hash of its hidden state (docs/design.md,
"Synthetic EAGLE-3 drafts on a random target"), so the draft memorises the target's
greedy continuation of each suite prompt (``fixtures/prompts.json``), and the
acceptance test replays exactly those prompts.

Near-ties make a continuation engine-dependent (fp32 noise can flip a top-2 logit
margin below ~1e-2). Each continuation is therefore cut before the first token
whose top-1/top-2 logit margin is below ``min_margin``: only the leading tokens
every fp32 engine must agree on are kept (:attr:`DraftExample.continuation`);
the full greedy run and its margins are kept too.

Everything is computed with the project's own fp32 forward of the target
(:func:`pytest_eagle3.target.checkpoint.init.forward_hidden_states`, the same
math as transformers' ``DeepseekV3ForCausalLM``), single-threaded, from the
checkpoint's weights (:func:`pytest_eagle3.target.checkpoint.init.make_weights`):
no transformers, no SGLang.

torch is imported inside functions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from pytest_eagle3.target.spec import prompts_path
from pytest_eagle3.target.checkpoint.init import Dims, forward_hidden_states, make_weights

if TYPE_CHECKING:
    import torch


#: Default number of greedy tokens generated per prompt before the margin cut.
MAX_NEW_TOKENS = 64
#: Default smallest top-1/top-2 logit margin a kept continuation token may have.
MIN_MARGIN = 0.01


@dataclass(frozen=True)
class DraftExample:
    """One suite prompt and the target's greedy continuation.

    Attributes:
        name: the prompt's name in ``prompts.json`` (``p5``) or ``prompt_<i>``.
        prompt: token ids ``x[0..P-1]``.
        generated: every greedy token generated (``max_new_tokens`` of them).
        margins: top-1 minus top-2 target logit at each generated token.
        trusted: how many leading generated tokens have margin >= ``min_margin``.
    """

    name: str
    prompt: tuple[int, ...]
    generated: tuple[int, ...]
    margins: tuple[float, ...]
    trusted: int

    @property
    def continuation(self) -> tuple[int, ...]:
        """The trusted greedy tokens ``x[P..P+trusted-1]``."""
        return self.generated[: self.trusted]

    @property
    def tokens(self) -> list[int]:
        """``prompt + continuation``: the ``N`` tokens whose snapshots the draft sees."""
        return list(self.prompt) + list(self.continuation)

    @property
    def first_start(self) -> int:
        """The first draft row used by the engine: ``P - 1`` (the prefill's last row)."""
        return len(self.prompt) - 1

    @property
    def num_starts(self) -> int:
        """Draft rows with a trusted label for step 1: ``trusted - 1`` (``>= 0``)."""
        return max(self.trusted - 1, 0)

    def to_json(self) -> dict[str, Any]:
        """JSON form for ``continuations.json``."""
        return {
            "name": self.name,
            "prompt": list(self.prompt),
            "continuation": list(self.continuation),
            "generated": list(self.generated),
            "margins": [round(m, 5) for m in self.margins],
            "trusted": self.trusted,
        }


def prompt_names(path=None) -> list[str]:
    """Names of the prompts in ``prompts.json`` (``prompt_<i>`` when unnamed)."""
    import json

    data = json.loads((path or prompts_path()).read_text(encoding="utf-8"))
    return [
        (e.get("name") if isinstance(e, dict) else None) or f"prompt_{i}"
        for i, e in enumerate(data["prompts"])
    ]


def greedy(
    sd: dict[str, torch.Tensor], dims: Dims, prompt: list[int], max_new_tokens: int
) -> tuple[list[int], list[float]]:
    """Greedy continuation by full forwards (no KV cache): ``(tokens, top-2 margins)``."""
    import torch

    toks = list(prompt)
    out, margins = [], []
    head = sd["lm_head.weight"]
    with torch.no_grad():
        for _ in range(max_new_tokens):
            hs = forward_hidden_states(sd, dims, torch.tensor([toks]))
            logits = hs[dims.layers][0, -1] @ head.T  # hs[L] is after the final norm
            top = logits.topk(2)
            margins.append(float(top.values[0] - top.values[1]))
            out.append(int(top.indices[0]))
            toks.append(out[-1])
    return out, margins


def make_examples(
    sd: dict[str, torch.Tensor],
    dims: Dims,
    prompts: list[list[int]],
    names: list[str] | None = None,
    *,
    max_new_tokens: int = MAX_NEW_TOKENS,
    min_margin: float = MIN_MARGIN,
) -> list[DraftExample]:
    """The greedy continuation of every prompt, cut at the first near-tie."""
    names = names or [f"prompt_{i}" for i in range(len(prompts))]
    examples = []
    for name, prompt in zip(names, prompts):
        gen, margins = greedy(sd, dims, prompt, max_new_tokens)
        trusted = next((i for i, m in enumerate(margins) if m < min_margin), len(margins))
        examples.append(
            DraftExample(name=name, prompt=tuple(prompt), generated=tuple(gen),
                         margins=tuple(margins), trusted=trusted)
        )
    return examples


def snapshots(sd: dict[str, torch.Tensor], dims: Dims, tokens: list[int]) -> torch.Tensor:
    """Residual-stream snapshots ``[L+2, N, H]`` float32 of ``tokens`` (reference layout:
    ``[i] = hs[i]`` for ``0 <= i <= L``, ``[L+1]`` = ``final_prenorm``)."""
    import torch

    with torch.no_grad():
        hs = forward_hidden_states(sd, dims, torch.tensor([tokens]))
    return torch.stack([h[0] for h in hs])


def target_weights(spec) -> tuple[dict[str, torch.Tensor], Dims]:
    """The preset's checkpoint weights (bit-identical to its ``model.safetensors``) and dims."""

    sd, _ = make_weights(spec)
    return sd, Dims.from_config(spec.config)
