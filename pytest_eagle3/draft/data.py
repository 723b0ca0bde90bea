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

For DeepSeek-V3 presets everything is computed with the project's own fp32
forward of the target (:func:`pytest_eagle3.target.checkpoint.dsv3_forward.forward_hidden_states`,
the same math as transformers' ``DeepseekV3ForCausalLM``), single-threaded,
from the checkpoint's weights (:func:`pytest_eagle3.target.checkpoint.init.make_weights`):
no transformers, no SGLang.  The other model families
(:mod:`pytest_eagle3.target.checkpoint.families`) run their built checkpoint on
transformers (:class:`TransformersTarget`); never SGLang.

torch is imported inside functions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from pytest_eagle3.target.spec import prompts_path
from pytest_eagle3.target.checkpoint.dsv3_config import Dims
from pytest_eagle3.target.checkpoint.dsv3_forward import forward_hidden_states
from pytest_eagle3.target.checkpoint.init import make_weights
from pytest_eagle3.target.checkpoint.cache import ensure_checkpoint
from pytest_eagle3.target.checkpoint.families import family_of

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


class TransformersTarget:
    """A non-DeepSeek preset's target for the draft builder, run with transformers.

    The DeepSeek-V3 presets use the project's own fp32 forward (above); the other
    families (:mod:`pytest_eagle3.target.checkpoint.families`) load their built
    checkpoint (the cache entry of :func:`~pytest_eagle3.target.checkpoint.cache.ensure_checkpoint`)
    with ``AutoModelForCausalLM`` in float32, eager attention, one thread, and give
    the same things: greedy continuations by full forwards (no KV cache) and the
    snapshots ``[L+2, N, H]`` (``hs[0..L]``, then ``final_prenorm`` by a pre-hook
    on the final norm).

    Attributes:
        embed: ``[V, H]`` the embedding matrix as stored (the draft's embedding).
        norms: ``[H]`` per layer: the multiplier of each ``input_layernorm``
            (``offset + weight`` where the family stores an offset, Gemma 3).
        eps: ``rms_norm_eps``.
    """

    def __init__(self, spec, cache_root) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        path = ensure_checkpoint(spec, cache_root)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch.float32, attn_implementation="eager", local_files_only=True).eval()
        family = family_of(spec.config)
        offset = family.norm_offset if family is not None else 0.0
        decoder = self.model.model
        self.num_layers = len(decoder.layers)
        self.embed = decoder.embed_tokens.weight.detach().clone()
        self.norms = [layer.input_layernorm.weight.detach().float() + offset for layer in decoder.layers]
        self.eps = float(spec.config.get("rms_norm_eps", 1e-6))
        self._final_norm = decoder.norm

    def _forward(self, tokens: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        import torch

        seen = {}

        def pre(_m, args):
            seen["prenorm"] = args[0]

        handle = self._final_norm.register_forward_pre_hook(pre)
        try:
            with torch.no_grad():
                out = self.model(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
        finally:
            handle.remove()
        return out.logits[0, -1], [h[0] for h in out.hidden_states] + [seen["prenorm"][0]]

    def examples(self, prompts: list[list[int]], names: list[str], *, max_new_tokens: int,
                 min_margin: float) -> list[DraftExample]:
        """As :func:`make_examples`, with the transformers forward."""
        out = []
        for name, prompt in zip(names, prompts):
            toks, gen, margins = list(prompt), [], []
            for _ in range(max_new_tokens):
                logits, _ = self._forward(toks)
                top = logits.topk(2)
                margins.append(float(top.values[0] - top.values[1]))
                gen.append(int(top.indices[0]))
                toks.append(gen[-1])
            trusted = next((i for i, m in enumerate(margins) if m < min_margin), len(margins))
            out.append(DraftExample(name=name, prompt=tuple(prompt), generated=tuple(gen),
                                    margins=tuple(margins), trusted=trusted))
        return out

    def snapshots(self, tokens: list[int]) -> torch.Tensor:
        """As :func:`snapshots`: ``[L+2, N, H]`` float32."""
        import torch

        return torch.stack(self._forward(tokens)[1]).float()
