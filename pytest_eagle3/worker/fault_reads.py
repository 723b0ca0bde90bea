"""What a fault reads from SGLang besides the residual stream (worker side): the
fused all-reduce gate and a rank's embedding shard.  Used by
:mod:`pytest_eagle3.worker.fault_injection`; imports SGLang only when called.
"""

from __future__ import annotations

from typing import Any

from pytest_eagle3.worker.faults import FaultError


def fusion_applies(tokens: int) -> bool:
    """SGLang's own decision that the fused all-reduce + add + RMSNorm takes a
    batch of ``tokens`` (``flashinfer_ar_fusion_applies``,
    ``srt/layers/layer_boundary/residual/add_norm.py`` in 0.5.23); ``False``
    where this SGLang has no such gate."""
    try:
        from sglang.srt.layers.layer_boundary.residual.add_norm import flashinfer_ar_fusion_applies
    except ImportError:
        return False
    return bool(flashinfer_ar_fusion_applies(int(tokens)))


def local_embedding(ctx: Any, like: Any) -> Any:
    """This rank's ``VocabParallelEmbedding`` output before the all-reduce
    (``_embed_local_shard``: rows of tokens outside the shard are zero)."""
    model, input_ids = getattr(ctx, "model", None), getattr(ctx, "input_ids", None)
    embed = getattr(model, "embed_tokens", None)
    if embed is None or input_ids is None or not hasattr(embed, "_embed_local_shard"):
        raise FaultError("unreduced-embedding: no VocabParallelEmbedding._embed_local_shard on this SGLang")
    local = embed._embed_local_shard(input_ids)
    if local.shape != like.shape:
        raise FaultError(f"unreduced-embedding: shard output {tuple(local.shape)} vs slot {tuple(like.shape)}")
    return local
