"""Speculative-decoding metrics of one request, read from SGLang's ``meta_info``.

Key names differ across SGLang versions and forks, so every value is
feature-detected and the source is recorded.  Measured on sglang 0.5.23
(EAGLE3, topk 1, 3 steps, 4 draft tokens) a ``/generate`` response carries::

    spec_verify_ct              11     verify forwards of the target
    spec_accept_length          1.09   completion_tokens / spec_verify_ct
    spec_accept_rate            0.0    spec_num_correct_drafts / spec_num_proposed_drafts
    spec_num_correct_drafts     0      accepted draft tokens
    spec_num_proposed_drafts    33     spec_verify_ct * speculative_num_steps
    spec_correct_drafts_histogram [11] verify forwards by number of accepted drafts

Older versions have only ``spec_verify_ct`` (and ``completion_tokens``); the
accept length is then ``completion_tokens / spec_verify_ct``, which counts the
prefill's token as accepted in the first step (SGLang's own definition).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

#: Alternative key names, most recent first.
VERIFY_KEYS = ("spec_verify_ct", "spec_verify_count", "num_verify")
ACCEPT_LENGTH_KEYS = ("spec_accept_length", "avg_accept_length", "accept_length")
ACCEPT_RATE_KEYS = ("spec_accept_rate", "accept_rate")
CORRECT_KEYS = ("spec_num_correct_drafts", "spec_accept_token_num", "spec_num_accepted_tokens",
                "num_accepted_tokens")
PROPOSED_KEYS = ("spec_num_proposed_drafts", "spec_draft_token_num", "spec_num_draft_tokens")
HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")

NOT_SPECULATIVE = (
    "SGLang answered without speculative metrics (no {keys} in meta_info): "
    "the engine does not run speculative decoding, or this version names them differently"
)


class Eagle3NoSpecMetrics(ValueError):
    """A response without speculative-decoding metrics."""


def _first(meta: Mapping[str, Any], keys: Sequence[str]) -> tuple[str | None, Any]:
    for key in keys:
        if meta.get(key) is not None:
            return key, meta[key]
    return None, None


@dataclass(frozen=True)
class SpecMetrics:
    """Speculative decoding of one request.

    Attributes:
        verify_count: target verify forwards (``spec_verify_ct``).
        completion_tokens: tokens generated.
        accept_length: tokens emitted per verify forward (SGLang's definition:
            ``completion_tokens / verify_count``, so 1.0 means no draft token
            was ever accepted).
        accept_rate: accepted / proposed draft tokens, ``None`` when SGLang
            reports neither it nor both counts.
        correct_drafts: accepted draft tokens (``None`` if unreported).
        proposed_drafts: proposed draft tokens (``None`` if unreported).
        histogram: verify forwards by number of accepted drafts (``None`` if unreported).
        sources: which ``meta_info`` key each value came from, or ``"derived"``.
    """

    verify_count: int
    completion_tokens: int
    accept_length: float
    accept_rate: float | None = None
    correct_drafts: int | None = None
    proposed_drafts: int | None = None
    histogram: tuple[int, ...] | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        rate = "?" if self.accept_rate is None else f"{self.accept_rate:.3f}"
        return (f"accept length {self.accept_length:.3f}, accept rate {rate}, "
                f"{self.verify_count} verify forwards for {self.completion_tokens} tokens")


def has_spec_metrics(meta: Mapping[str, Any]) -> bool:
    """Whether ``meta`` carries a verify count."""
    return _first(meta, VERIFY_KEYS)[0] is not None


def read_spec_metrics(response_or_meta: Mapping[str, Any]) -> SpecMetrics:
    """The :class:`SpecMetrics` of one ``/generate`` response (or its ``meta_info``).

    Raises:
        Eagle3NoSpecMetrics: no verify count in the response.
    """
    meta = response_or_meta.get("meta_info", response_or_meta)
    sources: dict[str, str] = {}
    key, verify = _first(meta, VERIFY_KEYS)
    if key is None:
        raise Eagle3NoSpecMetrics(NOT_SPECULATIVE.format(keys="/".join(VERIFY_KEYS)))
    sources["verify_count"] = key
    verify = int(verify)
    completion = int(meta.get("completion_tokens") or 0)
    sources["completion_tokens"] = "completion_tokens"

    key, length = _first(meta, ACCEPT_LENGTH_KEYS)
    if key is not None:
        sources["accept_length"] = key
        length = float(length)
    else:
        sources["accept_length"] = "derived"
        length = completion / verify if verify else 0.0

    ckey, correct = _first(meta, CORRECT_KEYS)
    pkey, proposed = _first(meta, PROPOSED_KEYS)
    if ckey:
        sources["correct_drafts"] = ckey
    if pkey:
        sources["proposed_drafts"] = pkey
    correct = None if correct is None else int(correct)
    proposed = None if proposed is None else int(proposed)

    key, rate = _first(meta, ACCEPT_RATE_KEYS)
    if key is not None:
        sources["accept_rate"] = key
        rate = float(rate)
    elif correct is not None and proposed:
        sources["accept_rate"] = "derived"
        rate = correct / proposed
    else:
        rate = None

    key, hist = _first(meta, HISTOGRAM_KEYS)
    if key is not None:
        sources["histogram"] = key
        hist = tuple(int(x) for x in hist)
    return SpecMetrics(verify_count=verify, completion_tokens=completion, accept_length=length,
                       accept_rate=rate, correct_drafts=correct, proposed_drafts=proposed,
                       histogram=hist, sources=sources)


def aggregate(metrics: Sequence[SpecMetrics]) -> SpecMetrics:
    """Token-weighted totals over requests (accept length = all tokens / all verifies)."""
    if not metrics:
        raise ValueError("no metrics to aggregate")
    verify = sum(m.verify_count for m in metrics)
    tokens = sum(m.completion_tokens for m in metrics)
    correct = None if any(m.correct_drafts is None for m in metrics) else sum(
        m.correct_drafts for m in metrics)  # type: ignore[misc]
    proposed = None if any(m.proposed_drafts is None for m in metrics) else sum(
        m.proposed_drafts for m in metrics)  # type: ignore[misc]
    rate = correct / proposed if correct is not None and proposed else None
    return SpecMetrics(verify_count=verify, completion_tokens=tokens,
                       accept_length=tokens / verify if verify else 0.0, accept_rate=rate,
                       correct_drafts=correct, proposed_drafts=proposed,
                       sources={"accept_length": "aggregate"})
