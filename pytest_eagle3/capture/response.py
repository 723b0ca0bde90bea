"""What SGLang returns for one request, as captures: prefill and decode rows of the
concatenated aux hidden states (``meta_info["hidden_states"]``).

Shared by the capture-only API (:mod:`.api`) and the draft path (:mod:`.draft_path`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from pytest_eagle3.errors import Eagle3Error

if TYPE_CHECKING:
    import torch


NO_HIDDEN_STATES = (
    "SGLang answered without meta_info['hidden_states'] for prompt {index} "
    "(is --enable-return-hidden-states / return_hidden_states honoured by this version?)"
)


@dataclass
class Captures:
    """What SGLang captured for one request.

    Attributes:
        prompt: the prompt's token ids (``T`` of them).
        prefill: ``[T, K*H]`` float32, row ``t`` = captures at prompt position ``t``.
        decode: ``[n, K*H]`` float32, row ``j`` = captures at position ``T + j``
            (whose input token is ``output_ids[j]``).
        output_ids: generated token ids.
        rid: the request id the test sent (SGLang's ``rid``), so per-rank
            records can be attributed to it; ``None`` when not known.
        order: position of the send this request was part of among its
            engine's sends, from 0 (``-1``: not known); the run-level diagnosis
            tells state that changes over an engine's life by it.
        engine: the name of the engine that served it (``""``: not known).
        index: its position among the requests of that send, from 0 (``-1``:
            not known): with ``order``, the request's order on its engine.
        batch: how many requests that send held together (``1``: sent alone;
            ``0``: not known).
    """

    prompt: list[int]
    prefill: "torch.Tensor"
    decode: "torch.Tensor"
    output_ids: list[int]
    rid: str | None = None
    order: int = -1
    engine: str = ""
    index: int = -1
    batch: int = 0

    @property
    def width(self) -> int:
        return int(self.prefill.shape[-1])


DECODE_ROWS_NOT_PER_TOKEN = (
    "prompt {index}: SGLang returned {rows} decode hidden-state rows for {tokens} generated tokens "
    "(one per token but the last is {want}) after {verifies} verify steps: this SGLang keeps one row per "
    "verify step, not per accepted token (measured on sglang 0.5.9 and 0.5.12), so decode rows cannot be "
    "attributed to positions once a draft token is accepted"
)


DECODE_ROWS_UNEXPLAINED = (
    "prompt {index}: SGLang returned {rows} decode hidden-state rows for {tokens} generated tokens "
    "(one per token but the last is {want}; {verifies} verify steps): they cannot be attributed to positions"
)


class Eagle3DecodeRowsNotPerToken(Eagle3Error):
    """A speculative response whose decode rows are not one per generated token."""


def parse_response(response: dict[str, Any], prompt: Sequence[int], index: int = 0) -> Captures:
    """Turn one ``/generate`` response into :class:`Captures`.

    ``decode`` rows are one per generated token but the last.  A speculative
    response (it has ``spec_verify_ct``) whose row count differs is refused:
    some releases return one row per verify step instead, which cannot be
    mapped to positions (:data:`DECODE_ROWS_NOT_PER_TOKEN`).

    Raises:
        Eagle3Error: the response carries no hidden states.
        Eagle3DecodeRowsNotPerToken: decode rows are not one per token.
    """
    import torch

    meta = response.get("meta_info") or {}
    states = meta.get("hidden_states")
    if not states:
        raise Eagle3Error(NO_HIDDEN_STATES.format(index=index))
    prefill = torch.tensor(states[0], dtype=torch.float32)
    if prefill.dim() == 1:
        prefill = prefill.unsqueeze(0)
    rows = [torch.tensor(row, dtype=torch.float32).reshape(-1) for row in states[1:]]
    decode = torch.stack(rows) if rows else prefill.new_zeros((0, prefill.shape[-1]))
    tokens = len(response.get("output_ids") or [])
    if "spec_verify_ct" in meta and tokens and len(rows) != tokens - 1:
        template = (DECODE_ROWS_NOT_PER_TOKEN if len(rows) == meta.get("spec_verify_ct")
                    else DECODE_ROWS_UNEXPLAINED)
        raise Eagle3DecodeRowsNotPerToken(template.format(
            index=index, rows=len(rows), tokens=tokens, want=tokens - 1, verifies=meta.get("spec_verify_ct")))
    rid = meta.get("id")
    return Captures(list(prompt), prefill, decode, list(response.get("output_ids") or []),
                    str(rid) if rid is not None else None)
