"""Captures through the draft path: what SGLang feeds a real EAGLE-3 draft.

With a draft loaded (``--speculative-algorithm EAGLE3
--speculative-draft-model-path DIR``) and ``--enable-return-hidden-states``, a
request with ``return_hidden_states=True`` returns in
``meta_info["hidden_states"]`` the target's concatenated aux hidden states:
exactly the tensor the draft's ``fc`` reads, captured at the layers SGLang
chose from the draft's own ``config.json``
(``eagle_config.eagle_aux_hidden_state_layer_ids``).  This path needs no
``--enable-return-aux-hidden-states`` (sglang 0.5.23+ only), so it works on
any SGLang that serves DeepSeek EAGLE-3.

Measured on sglang 0.5.23 (tiny-dsv3, K = 3 ids, H = 256, EAGLE3 topk 1,
3 steps, 4 draft tokens, CPU at TP 1 and 2):

* entry 0 is the prefill: ``[prompt_tokens, K*H]``, one row per prompt
  position, from the target's EXTEND forward;
* then one ``[K*H]`` row per generated token except the last:
  ``completion_tokens - 1`` rows in all, the same count and meaning as without
  speculation.  Row ``j`` is the capture at position ``T + j`` whose input
  token is ``output_ids[j]``.
* Every decode row is a **target-verify row**: it comes from a TARGET_VERIFY
  forward of the target over ``[last token, draft tokens...]``.  SGLang keeps
  the rows of the accepted path only (``batch_result_processor``
  ``_append_decode_hidden_states``: ``accept_len`` rows per verify step, from
  row ``i * num_draft_tokens`` of the verify output), so a step that accepts
  ``a`` draft tokens contributes ``a + 1`` rows: the root (the previous step's
  bonus token) and the accepted drafts.  Rejected draft positions and the
  draft model's own hidden states are never returned.  The last step is
  truncated with the output at ``max_new_tokens``.
* Rows are in generation order, so a request's rows concatenate to the same
  ``[n, K*H]`` as the capture-only API; on 0.5.23 the two agree to float32
  rounding (relative L2 about 5e-6: the verify rows come from an extend
  forward, the capture-only rows from decode forwards).

The rows are returned as :class:`pytest_eagle3.capture.api.Captures`, with
the request's speculative metrics beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from pytest_eagle3.capture.response import Captures, Eagle3DecodeRowsNotPerToken, parse_response
from pytest_eagle3.capture.spec_metrics import SpecMetrics, has_spec_metrics, read_spec_metrics
from pytest_eagle3.engine.config import speculative_server_args
from pytest_eagle3.sglang_source.install import SGLangInstall
from pytest_eagle3.errors import Eagle3Error

if TYPE_CHECKING:
    from pytest_eagle3.engine.server import SGLangServer

NO_RETURN_HIDDEN = (
    "{sglang} has no --enable-return-hidden-states: captures through the draft "
    "path cannot be read from this version"
)
NOT_SPECULATIVE = (
    "the draft-path response for prompt {index} has no speculative metrics: the "
    "engine did not run speculative decoding (is --speculative-draft-model-path set?)"
)


@dataclass
class DraftPathCaptures:
    """One request through the draft path.

    Attributes:
        captures: prefill ``[T, K*H]`` and decode (target-verify) rows, float32.
        metrics: the request's speculative metrics.
    """

    captures: Captures
    metrics: SpecMetrics
    #: Why ``captures.decode`` is empty although tokens were generated (this
    #: SGLang's decode rows are not one per token), else ``None``.
    decode_note: str | None = None

    @property
    def output_ids(self) -> list[int]:
        return self.captures.output_ids


def draft_path_server_args(
    install: SGLangInstall,
    draft_path: str | Path,
    *,
    steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int | None = None,
) -> dict[str, Any]:
    """Server arguments that run EAGLE-3 with the draft and return its inputs.

    Raises:
        Eagle3Error: the installed SGLang cannot return hidden states or run EAGLE-3.
    """
    if not install.has_arg("enable_return_hidden_states"):
        raise Eagle3Error(NO_RETURN_HIDDEN.format(sglang=install.describe()))
    args = speculative_server_args(install, draft_path, steps=steps, topk=topk,
                                   num_draft_tokens=num_draft_tokens)
    args["enable_return_hidden_states"] = True
    return args


def parse_draft_response(response: dict[str, Any], prompt: Sequence[int], index: int = 0) -> DraftPathCaptures:
    """One ``/generate`` response of a draft-path engine.

    Raises:
        Eagle3Error: no hidden states, or no speculative metrics.
    """
    meta = response.get("meta_info") or {}
    if not has_spec_metrics(meta):
        raise Eagle3Error(NOT_SPECULATIVE.format(index=index))
    try:
        captures = parse_response(response, prompt, index)
        note = None
    except Eagle3DecodeRowsNotPerToken as exc:
        # The prefill rows and the metrics still hold; the decode rows are dropped.
        trimmed = dict(response, meta_info=dict(meta, hidden_states=meta["hidden_states"][:1]),
                       output_ids=list(response.get("output_ids") or [])[:1])
        captures = parse_response(trimmed, prompt, index)
        captures.output_ids = list(response.get("output_ids") or [])
        note = str(exc)
    return DraftPathCaptures(captures, read_spec_metrics(meta), decode_note=note)


def capture_draft_path(
    server: "SGLangServer",
    prompts: Sequence[Sequence[int]],
    *,
    decode_steps: int = 0,
    batch: bool = False,
) -> list[DraftPathCaptures]:
    """Greedy generation through the draft path; each request's captures and metrics.

    Same request shape as :func:`pytest_eagle3.capture.api.capture`:
    ``max_new_tokens = 1 + decode_steps``, so a request returns ``decode_steps``
    decode rows (target-verify rows, see the module docstring).
    """
    sampling = {"max_new_tokens": 1 + decode_steps, "temperature": 0.0, "ignore_eos": True}
    if batch:
        payload = {"input_ids": [list(p) for p in prompts], "sampling_params": sampling,
                   "return_hidden_states": True}
        responses = server.generate(payload)
        return [parse_draft_response(r, p, i) for i, (r, p) in enumerate(zip(responses, prompts))]
    out = []
    for i, prompt in enumerate(prompts):
        payload = {"input_ids": list(prompt), "sampling_params": sampling, "return_hidden_states": True}
        out.append(parse_draft_response(server.generate(payload), prompt, i))
    return out


