"""Attention DP's reduce-scatter route, as the fault catalog reads it (worker side).

Under attention DP, an MoE layer whose output returns to each DP rank's tokens
through a reduce-scatter leaves it pending as an ``UnreducedOutput`` whose
``reduce_to_dp_local`` is ``partial(to_dp_local, dp_reduce_scatter, batch)``
(0.5.23 ``srt/layers/layer_boundary/exit.py`` ``ExitPolicy._decide``); the
gathered buffer is max-len padded, one equal chunk per DP rank, and with
``tp_size == attn_dp_size`` the TP group's ``reduce_scatter_tensor`` hands
chunk ``r`` to rank ``r`` (``srt/layers/dp_attention.py`` ``dp_reduce_scatter_tensor``).
Imports SGLang and torch only inside SGLang's processes (:func:`other_rank_rows`).
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


def other_rank_rows(slot: Any, forward_batch: Any) -> Any:
    """The next TP rank's rows of a completed capture ``slot`` (``[rows, H]``), the
    slice ``dp_reduce_scatter`` handed that rank, or ``None``.

    Every rank of the TP group must call it in the same layers (a MAX_LEN-padded
    forward on the route: each rank runs ``dp_reduce_scatter`` there, an idle one
    too); it all-gathers the slot with a column saying whether this rank's rows are
    a real decode batch (``forward_batch.forward_mode``), and answers only where every
    rank's are and the DP ranks' token counts (``forward_batch.global_num_tokens_cpu``)
    are equal, so row ``t`` of one rank's batch has a row ``t`` on the next.
    """
    import torch
    from sglang.srt.distributed.parallel_state import get_tp_group

    counts = getattr(forward_batch, "global_num_tokens_cpu", None)
    if not counts or len({int(c) for c in counts}) != 1:
        return None  # the same answer on every rank (the counts are global): no rank gathers
    group = get_tp_group()
    real = float(getattr(getattr(forward_batch, "forward_mode", None), "name", "") == "DECODE")
    flagged = torch.cat([slot, slot.new_full((slot.shape[0], 1), real)], dim=1)
    chunks = group.all_gather(flagged.contiguous(), dim=0).tensor_split(group.world_size)
    if not all(c.shape[0] == slot.shape[0] and bool((c[:, -1] == 1).all()) for c in chunks):
        return None
    return chunks[(group.rank_in_group + 1) % group.world_size][:, :-1]
