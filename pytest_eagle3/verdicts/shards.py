"""Which TP rank's vocabulary shard holds a token (SGLang's VocabParallelEmbedding).

Shared by the comparison (:mod:`.compare`) and the diagnoses (:mod:`.diagnose`),
so neither imports the other for it.  Pure Python.
"""

from __future__ import annotations

#: SGLang ``DEFAULT_VOCAB_PADDING_SIZE`` (sglang/srt/layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64


def vocab_shard_ranges(vocab_size: int, tp: int) -> list[tuple[int, int]]:
    """Token-id range ``[start, end)`` each TP rank's ``VocabParallelEmbedding`` holds.

    SGLang 0.5.23, ``sglang/srt/layers/vocab_parallel_embedding.py``: the
    vocabulary is padded to a multiple of ``DEFAULT_VOCAB_PADDING_SIZE = 64``
    (``pad_vocab_size``); when that padded size is not divisible by ``tp_size``
    the padding becomes ``64 * tp_size`` (``VocabParallelEmbedding.__init__``);
    rank ``r`` holds padded ids ``[r * P / tp, (r+1) * P / tp)``
    (``vocab_range_from_global_vocab_size``), clipped to the real vocabulary
    (``_get_indices``).  With ``SGLANG_ENABLE_EMBED_REPLICATION`` every rank holds
    the whole table and there is no embedding all-reduce.
    """
    padding = VOCAB_PADDING
    if _pad(vocab_size, padding) % tp:
        padding *= tp
    per_rank = _pad(vocab_size, padding) // tp
    return [(min(r * per_rank, vocab_size), min((r + 1) * per_rank, vocab_size)) for r in range(tp)]


def vocab_shard(token_id: int, vocab_size: int, tp: int) -> int | None:
    """TP rank whose embedding shard holds ``token_id``; ``None`` outside the vocabulary."""
    for rank, (start, end) in enumerate(vocab_shard_ranges(vocab_size, tp)):
        if start <= token_id < end:
            return rank
    return None


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to
