"""Checks of the captures through SGLang's other paths: the rows each path
returns (:func:`check_rows`), and pairs of captures of the same request that
must agree (:func:`compare_captures`: the draft path against the capture-only
API, :func:`check_methods_agree`; a radix-cache hit against its fresh send,
:func:`check_pair`).  The slots themselves are compared with
:func:`~pytest_eagle3.verdicts.compare.compare_slots`; every distance is
:func:`~pytest_eagle3.verdicts.distance.rel_err`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_eagle3.verdicts.distance import rel_err_or_inf
from pytest_eagle3.verdicts.outcome import Verdict

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.capture.response import Captures

ROWS_MISSING = ("{variant}: prompt {i} ({T} tokens) returned {n} prefill rows and {d} decode rows; expected {want} "
                "(SGLang's /server_info: {settings})")
#: The resolved settings that decide how many prefill rows come back.
ROW_SETTINGS = ("chunked_prefill_size", "disable_radix_cache", "page_size")
METHODS_DISAGREE = "prompt {i}: the two capture methods disagree: {how}"
PAIR_DISAGREES = (
    "{what}: prompt {i}: {b_name} and {a_name} of the same request disagree at the same positions "
    "({how}); the path that differs computes other captures"
)


@dataclass(frozen=True)
class Agreement:
    """How far two captures of the same request are apart, at the positions both returned.

    Attributes:
        same_tokens: identical ``output_ids``.
        prefill_max_abs, decode_max_abs: largest absolute difference.
        prefill_rel, decode_rel: :func:`~pytest_eagle3.verdicts.distance.rel_err`
            of ``a`` against ``b`` (``inf`` when the rows cannot be aligned).
        rows: ``(prefill rows, decode rows)`` of each side, for messages.
        aligned: prefill rows compared: the positions both sides returned (the
            shorter side is the tail of the prompt: the last chunk, the uncached rows).
    """

    same_tokens: bool
    prefill_max_abs: float
    decode_max_abs: float
    prefill_rel: float
    decode_rel: float
    rows: tuple[tuple[int, int], tuple[int, int]]
    aligned: int = 0

    def ok(self, rel_tol: float = 1e-4) -> bool:
        return self.same_tokens and self.prefill_rel <= rel_tol and self.decode_rel <= rel_tol

    def describe(self) -> str:
        return (f"tokens {'equal' if self.same_tokens else 'DIFFER'}; rows {self.rows[0]} vs {self.rows[1]}, "
                f"{self.aligned} prefill rows at the same positions compared; "
                f"prefill max abs {self.prefill_max_abs:.3g} rel {self.prefill_rel:.3g}; "
                f"decode max abs {self.decode_max_abs:.3g} rel {self.decode_rel:.3g}")


def _max_abs(a: "torch.Tensor", b: "torch.Tensor") -> float:
    if tuple(a.shape) != tuple(b.shape):
        return float("inf")
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def compare_captures(a: "Captures", b: "Captures") -> Agreement:
    """Compare two captures of the same prompt, ``a`` against ``b``, at the prompt
    positions both returned: each side's prefill rows are the last ones of the
    prompt (all of them, the last chunk under chunked prefill, the uncached tail
    on a radix-cache hit), so the shorter side's rows are compared with the same
    positions of the longer side.  Decode rows must match one for one."""
    n = min(a.prefill.shape[0], b.prefill.shape[0])
    pa, pb = a.prefill[a.prefill.shape[0] - n:], b.prefill[b.prefill.shape[0] - n:]
    return Agreement(
        same_tokens=list(a.output_ids) == list(b.output_ids),
        prefill_max_abs=_max_abs(pa, pb), decode_max_abs=_max_abs(a.decode, b.decode),
        prefill_rel=rel_err_or_inf(pa, pb) if n else float("inf"),
        decode_rel=rel_err_or_inf(a.decode, b.decode),
        rows=((a.prefill.shape[0], a.decode.shape[0]), (b.prefill.shape[0], b.decode.shape[0])), aligned=n,
    )


def common_slots(a_snapshots: Sequence[int], b_snapshots: Sequence[int]) -> list[tuple[int, int]]:
    """``(slot of a, slot of b)`` for each snapshot both capture lists hold, in
    ``a``'s slot order: two engines whose ids differ (a draft's ids against the
    capture engine's) are compared on the layers they share."""
    where = {s: j for j, s in enumerate(b_snapshots)}
    return [(i, where[s]) for i, s in enumerate(a_snapshots) if s in where]


def select_slots(captures: "Captures", slots: Sequence[int], hidden_size: int) -> "Captures":
    """``captures`` with only ``slots`` (each ``hidden_size`` columns of the
    ``[rows, K*H]`` float32 prefill and decode rows), in that order.

    Raises:
        ValueError: the rows are not ``K*H`` wide, or a slot is not below ``K``
            (a capture with fewer slots than predicted is never compared on nothing).
    """
    import dataclasses

    import torch

    width = captures.width
    if hidden_size <= 0 or width % hidden_size or any(not 0 <= k < width // hidden_size for k in slots):
        raise ValueError(f"slots {list(slots)} of H={hidden_size} do not fit captures {width} wide")

    def cols(t: "torch.Tensor") -> "torch.Tensor":
        if not slots:
            return t[:, :0]
        return torch.cat([t[:, k * hidden_size:(k + 1) * hidden_size] for k in slots], dim=1)

    return dataclasses.replace(captures, prefill=cols(captures.prefill), decode=cols(captures.decode))


def check_pair(agreements: Iterable[Agreement], *, what: str, a_name: str, b_name: str,
               rel_tol: float) -> Verdict:
    """Passed when every prompt's pair agrees within ``rel_tol`` (``0``: bitwise);
    failed with :data:`PAIR_DISAGREES` naming the first that does not."""
    for i, agreement in enumerate(agreements):
        if not agreement.ok(rel_tol=rel_tol):
            return Verdict.failed(PAIR_DISAGREES.format(what=what, i=i, a_name=a_name, b_name=b_name,
                                                        how=agreement.describe()))
    return Verdict.passed()


def row_settings(info: dict) -> str:
    """``chunked_prefill_size=..., disable_radix_cache=..., page_size=...`` of ``/server_info``."""
    return ", ".join(f"{k}={info.get(k)!r}" for k in ROW_SETTINGS)


def check_rows(*, variant: str, i: int, tokens: int, prefill: int, decode: int, want_prefill: int | None,
               want_decode: int, settings: str) -> Verdict:
    """Passed when prompt ``i`` (``tokens`` long) returned ``want_prefill`` prefill
    rows (``None``: any tail of the prompt, 1 to ``tokens`` rows) and ``want_decode``
    decode rows; failed with :data:`ROWS_MISSING` otherwise."""
    prefill_ok = 1 <= prefill <= tokens if want_prefill is None else prefill == want_prefill
    if not prefill_ok or decode != want_decode:
        want = f"1 to {tokens}" if want_prefill is None else f"{want_prefill}"
        return Verdict.failed(ROWS_MISSING.format(
            variant=variant, i=i, T=tokens, n=prefill, d=decode, settings=settings,
            want=f"{want} prefill rows and {want_decode} decode rows"))
    return Verdict.passed()


def check_methods_agree(agreements: Iterable[Any], *, rel_tol: float) -> Verdict:
    """Passed when every prompt's draft-path captures agree with the capture-only
    API's (:func:`compare_captures` results,
    ``ok(rel_tol)`` and ``describe()``); failed naming the first that does not."""
    for i, agreement in enumerate(agreements):
        if not agreement.ok(rel_tol=rel_tol):
            return Verdict.failed(METHODS_DISAGREE.format(i=i, how=agreement.describe()))
    return Verdict.passed()
