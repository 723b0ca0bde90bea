"""Checks every training-stack translator makes of its id list and of the target's size.

The translators (:mod:`pytest_eagle3.contracts.stacks`) validate ids the same
way: ints ``>= 0``, non-empty, no layer twice, inside the range their stack can
capture, and report a default list or a list out of layer order as a note.
"""

from __future__ import annotations

from typing import Sequence

from pytest_eagle3.errors import Eagle3ContractError

# Message templates (tests import these).
BAD_IDS_MSG = "{stack}: layer ids must be a list of non-negative ints, got {ids!r}"
EMPTY_IDS_MSG = "{stack}: the layer id list is empty; name at least one layer or omit the key"
DUPLICATE_IDS_MSG = "{stack}: ids {ids} name layer {id} more than once; {why}"
IDS_RANGE_MSG = "{stack}: id {id} in {ids} is outside {lo}..{hi} for a target of {num_layers} layers ({meaning})"
COUNT_MSG = "{stack}: {why}; got {n} ids {ids}"
NO_IDS_NOTE = (
    "the draft declares no layer ids: {stack} trained on its default {default}; "
    "a server that reads no ids uses its own default"
)
UNSORTED_NOTE = (
    "ids {ids} are not in layer order; {stack} captures in layer order, so fc slot order is {order}"
)


def checked_ids(stack: str, ids: Sequence[int] | None) -> tuple[int, ...] | None:
    """Validate an id list (ints >= 0, non-empty) and return it as a tuple."""
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise Eagle3ContractError(BAD_IDS_MSG.format(stack=stack, ids=ids))
    out = tuple(ids)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in out):
        raise Eagle3ContractError(BAD_IDS_MSG.format(stack=stack, ids=list(out)))
    if not out:
        raise Eagle3ContractError(EMPTY_IDS_MSG.format(stack=stack))
    return out


def show_ids(ids: tuple[int, ...], default: bool) -> str:
    """``[1, 4]``, or ``default [1, 4]`` for a stack's default list."""
    return f"{'default ' if default else ''}{list(ids)}"


def no_duplicates(stack: str, ids: tuple[int, ...], why: str, default: bool = False) -> None:
    """Raise :class:`Eagle3ContractError` (:data:`DUPLICATE_IDS_MSG`) when a layer is named twice;
    ``why``: what the stack does then."""
    for v in ids:
        if ids.count(v) > 1:
            raise Eagle3ContractError(
                DUPLICATE_IDS_MSG.format(stack=stack, ids=show_ids(ids, default), id=v, why=why)
            )


def in_range(
    stack: str, ids: tuple[int, ...], lo: int, hi: int, num_layers: int, meaning: str, default: bool = False
) -> None:
    """Raise :class:`Eagle3ContractError` (:data:`IDS_RANGE_MSG`) for an id outside ``lo..hi``;
    ``meaning``: what an id is on that stack."""
    for v in ids:
        if not lo <= v <= hi:
            raise Eagle3ContractError(
                IDS_RANGE_MSG.format(
                    stack=stack, id=v, ids=show_ids(ids, default), lo=lo, hi=hi, num_layers=num_layers,
                    meaning=meaning,
                )
            )


def layer_order(stack: str, ids: tuple[int, ...], notes: list[str]) -> tuple[int, ...]:
    """``ids`` sorted (the stack captures in layer order); a note in ``notes`` when that changes them."""
    order = tuple(sorted(ids))
    if order != ids:
        notes.append(UNSORTED_NOTE.format(ids=list(ids), stack=stack, order=list(order)))
    return order


def check_layers(num_layers: int, hidden_size: int | None) -> None:
    """Raise :class:`Eagle3ContractError` when ``num_layers`` or ``hidden_size`` (when given) is not a positive int."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers <= 0:
        raise Eagle3ContractError(f"num_layers must be a positive int, got {num_layers!r}")
    if hidden_size is not None and (isinstance(hidden_size, bool) or not isinstance(hidden_size, int)
                                    or hidden_size <= 0):
        raise Eagle3ContractError(f"hidden_size must be a positive int, got {hidden_size!r}")
