"""Translators whose contract no capture rule decides: the original EAGLE-3 (fixed layers) and raw (explicit entries).

The signature and the table of what an id means per stack:
:mod:`pytest_eagle3.contracts.stacks`.
"""

from __future__ import annotations

from typing import Sequence

from pytest_eagle3.contracts.contract import Contract, Entry
from pytest_eagle3.contracts.stack_ids import check_layers, checked_ids
from pytest_eagle3.errors import Eagle3ContractError

COLLAPSE_MSG = (
    "eagle: the original EAGLE-3 rule picks layers {{2, L//2, L-3}} = {layers} on a target of "
    "{num_layers} layers, only {n} distinct, but its fc always takes 3 slots"
)
NEEDS_IDS_MSG = "raw: an explicit contract needs entries (hs indices or a human form), got none"


def eagle(
    ids: Sequence[int] | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    dtype: str | None = None,
    source: str = "",
) -> Contract:
    """SafeAILab/EAGLE, original EAGLE-3 training: fixed ``hs[2], hs[L//2], hs[L-3]``.

    Read at ``cb7e0841`` (2026-02-19):

    * ``eagle/traineagle3/modeling_llama_kv.py::LlamaModel.forward`` appends
      ``hidden_states`` *before* decoder layer ``idx`` runs when
      ``idx == L-3 or idx == L//2 or idx == 2``: the input of those layers
      (``hs[idx]``), in layer order, each once.
    * ``eagle/traineagle3/cnets.py::Model.dataprepare`` concatenates
      ``outs.hidden_states[0], [1], [2]`` (those three) and ``Model.__init__`` builds
      ``fc = nn.Linear(hidden_size * 3, hidden_size)``.

    The code takes no layer ids: ``ids`` (e.g. added to the config later for a
    server) are kept as ``declared_ids`` with a note, and do not change the contract.

    Raises:
        Eagle3ContractError: a target so shallow that the three layers coincide.
    """
    stack = "eagle"
    check_layers(num_layers, hidden_size)
    L = num_layers
    declared = checked_ids(stack, ids)
    layers = sorted({v for v in (2, L // 2, L - 3) if 0 <= v < L})
    if len(layers) != 3:
        raise Eagle3ContractError(COLLAPSE_MSG.format(layers=layers, num_layers=L, n=len(layers)))
    notes = []
    if declared is not None:
        notes.append(
            f"the config declares ids {list(declared)}, but EAGLE-3 training takes none: "
            f"it always used hs[2], hs[L//2], hs[L-3]; the ids only steer a server"
        )
    return Contract(
        entries=tuple(layers), hidden_size=hidden_size, num_layers=L, dtype=dtype, stack=stack,
        source=source or "EAGLE-3 training (SafeAILab/EAGLE): layers {2, L//2, L-3}",
        declared_ids=declared, notes=tuple(notes),
    )


def raw(
    ids: Sequence[Entry] | str | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    dtype: str | None = None,
    source: str = "",
) -> Contract:
    """An explicit contract: ``hs`` indices (ints, or ``"final_prenorm"``) in fc slot
    order, or a human form string such as ``"[embedding, out(L2), out(L4)]"``.

    Raises:
        Eagle3ContractError: no entries, a bad entry or human form, out of range.
    """
    check_layers(num_layers, hidden_size)
    if ids is None:
        raise Eagle3ContractError(NEEDS_IDS_MSG)
    if isinstance(ids, str):
        return Contract.parse(ids, num_layers=num_layers, hidden_size=hidden_size, dtype=dtype,
                              stack="raw", source=source or f"explicit {ids}")
    entries = tuple(ids)
    declared = entries if all(isinstance(e, int) for e in entries) else None
    return Contract(
        entries=entries, hidden_size=hidden_size, num_layers=num_layers, dtype=dtype, stack="raw",
        source=source or f"explicit hs indices {list(entries)}", declared_ids=declared,
    )
