"""Checks of the captures through SGLang's other paths: the rows each path
returns (:func:`check_rows`) and the draft path against the capture-only API
(:func:`check_methods_agree`).  The slots themselves are compared with
:func:`~pytest_eagle3.verdicts.compare.compare_slots`.  Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_eagle3.verdicts.outcome import Verdict

ROWS_MISSING = ("{variant}: prompt {i} ({T} tokens) returned {n} prefill rows and {d} decode rows; expected {want} "
                "(SGLang's /server_info: {settings})")
#: The resolved settings that decide how many prefill rows come back.
ROW_SETTINGS = ("chunked_prefill_size", "disable_radix_cache", "page_size")
METHODS_DISAGREE = "prompt {i}: the two capture methods disagree: {how}"


def row_settings(info: dict) -> str:
    """``chunked_prefill_size=..., disable_radix_cache=..., page_size=...`` of ``/server_info``."""
    return ", ".join(f"{k}={info.get(k)!r}" for k in ROW_SETTINGS)


def check_rows(*, variant: str, i: int, tokens: int, prefill: int, decode: int, want_prefill: int,
               want_decode: int, settings: str) -> Verdict:
    """Passed when prompt ``i`` (``tokens`` long) returned ``want_prefill`` prefill
    rows and ``want_decode`` decode rows; failed with :data:`ROWS_MISSING` otherwise."""
    if prefill != want_prefill or decode != want_decode:
        return Verdict.failed(ROWS_MISSING.format(
            variant=variant, i=i, T=tokens, n=prefill, d=decode, settings=settings,
            want=f"{want_prefill} prefill rows and {want_decode} decode rows"))
    return Verdict.passed()


def check_methods_agree(agreements: Iterable[Any], *, rel_tol: float) -> Verdict:
    """Passed when every prompt's draft-path captures agree with the capture-only
    API's (:func:`pytest_eagle3.capture.draft_path.compare_captures` results,
    ``ok(rel_tol)`` and ``describe()``); failed naming the first that does not."""
    for i, agreement in enumerate(agreements):
        if not agreement.ok(rel_tol=rel_tol):
            return Verdict.failed(METHODS_DISAGREE.format(i=i, how=agreement.describe()))
    return Verdict.passed()
