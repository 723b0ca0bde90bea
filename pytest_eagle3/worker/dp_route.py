"""Attention DP's reduce-scatter route, as the fault catalog reads it (worker side).

Under attention DP, an MoE layer whose output returns to each DP rank's tokens
through a reduce-scatter leaves it pending as an ``UnreducedOutput`` whose
``reduce_to_dp_local`` is ``partial(to_dp_local, dp_reduce_scatter, batch)``
(0.5.23 ``srt/layers/layer_boundary/exit.py`` ``ExitPolicy._decide``); the
gathered buffer is max-len padded, one equal chunk per DP rank, and with
``tp_size == attn_dp_size`` the TP group's ``reduce_scatter_tensor`` hands
chunk ``r`` to rank ``r`` (``srt/layers/dp_attention.py`` ``dp_reduce_scatter_tensor``).
Stdlib only.
"""

from __future__ import annotations

from typing import Any


def owed_to_dp_reduce_scatter(owed: Any) -> bool:
    """Whether a pending contribution is completed by ``dp_reduce_scatter``."""
    move = getattr(owed, "reduce_to_dp_local", None)
    args = getattr(move, "args", ())
    return bool(args) and getattr(args[0], "__name__", "") == "dp_reduce_scatter"


def own_rows(partial: Any, rows: int, rank: int, size: int) -> Any:
    """Rank ``rank``'s rows of a max-len-padded DP gather ``partial`` (``[size * max_len, H]``):
    chunk ``rank`` of ``size`` equal chunks, its first ``rows``."""
    return partial.tensor_split(size)[rank][:rows]
