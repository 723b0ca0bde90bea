"""Plain-torch ``decode_attention_cpu`` / ``extend_attention_cpu`` for the ``intel_amx`` backend.

SGLang's ``IntelAMXAttnBackend`` (``srt/layers/attention/intel_amx_backend.py``,
0.5.23) calls these as ``torch.ops.sgl_kernel.<name>`` with positional
arguments.  Semantics from sgl-kernel ``csrc/cpu/decode.cpp`` and
``csrc/cpu/extend.cpp``:

* Buffers are paged by token: ``k_buffer[slot, kv_head, head_dim]``; request
  ``r``'s ``i``-th token lives in slot ``req_to_token[r, i]``.
* Decode: one query per sequence.  If ``key``/``value`` are given they are
  first written at ``loc`` (one slot per sequence), then each query attends to
  the sequence's first ``seq_lens[b]`` tokens.
* Extend: sequence ``b`` has ``extend_seq_lens[b]`` new tokens at rows
  ``extend_start_loc[b]:+len`` of ``q/k/v_extend``, after
  ``seq_lens[b] - extend_seq_lens[b]`` cached prefix tokens read from the
  buffers; new token ``i`` sees the whole prefix and new tokens ``<= i``
  (``is_causal``), or every token.
* MLA (DeepSeek absorbed attention): one KV head whose value is the first
  ``v_head_dim`` channels of the key (``v_buffer`` is a view of ``k_buffer``);
  no special case is needed here.
* Query heads map to KV heads in groups of ``num_heads // num_kv_heads``.
* ``logit_cap > 0``: scores become ``cap * tanh(score / cap)``.
* ``sliding_window_size = w > 0`` (the backend passes the layer's
  ``sliding_window_size + 1``): a query at position ``p`` sees keys at
  positions ``k`` with ``p - w < k <= p``, the ``w`` most recent tokens
  (transformers' Gemma 3 / gpt-oss masks: ``q_idx - kv_idx < sliding_window``).
* ``sinks [H]`` (gpt-oss): one extra logit per head joins each softmax and is
  dropped after it, so it only takes probability mass away.
* ``tree_mask`` (speculative verify of a token tree, EAGLE top-k > 1): the
  ``QLEN_ONLY`` mask SGLang builds on CPU (0.5.23 ``srt/speculative/eagle_utils.py``
  ``default_tree_mask_mode``, ``build_tree_kernel_efficient``; handed over by
  ``intel_amx_backend.py`` ``_build_extend_metadata`` only when ``tree_topk != 1``):
  flat bool, one ``ext x ext`` block per sequence in batch order, row ``i``
  column ``j`` True when new token ``i`` may see new token ``j`` (node ``i``'s
  root and ancestors, and itself).  The cached prefix stays fully visible; the
  block replaces the causal mask among the new tokens.

Everything is computed in float32 and written into the output tensor.  What
this stand-in does not implement (cross attention, encoder lengths, tree
bit-packed tree masks, fp8 KV caches)
raises ``NotImplementedError`` instead of computing something else.
"""

from __future__ import annotations

from typing import Any

import torch

_UNSUPPORTED = (
    "pytest-eagle3's CPU stand-in {op} does not implement {what}; "
    "extend pytest_eagle3/worker/cpu/shim/sgl_kernel/_attention.py or run the GPU tier"
)


def _refuse(op: str, **features: Any) -> None:
    for what, used in features.items():
        if used:
            raise NotImplementedError(_UNSUPPORTED.format(op=op, what=what.replace("_", " ")))


def _check_kv_dtype(op: str, k_buffer: torch.Tensor) -> None:
    if k_buffer.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise NotImplementedError(_UNSUPPORTED.format(op=op, what=f"a {k_buffer.dtype} KV cache"))


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    mask: torch.Tensor | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q [m, H, D]``, ``k [n, Hkv, D]``, ``v [n, Hkv, Dv]``; ``mask [m, n]`` (True = visible);
    ``sinks [H]`` or None."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k.float()) * float(sm_scale)
    if logit_cap and logit_cap > 0:
        scores = float(logit_cap) * torch.tanh(scores / float(logit_cap))
    if mask is not None:
        scores = scores.masked_fill(~mask.unsqueeze(0), float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(-1, 1, 1).expand(-1, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hmn,nhd->mhd", probs, v.float())


def decode_attention_cpu(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool = False,
    sliding_window_size: int = 0,
    encoder_lens: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """One decode step per sequence; writes ``output [num_seqs, H, Dv]`` in place."""
    op = "decode_attention_cpu"
    _refuse(op, cross_attention=is_cross_attn, encoder_lengths=encoder_lens is not None)
    _check_kv_dtype(op, k_buffer)
    window = int(sliding_window_size or 0)
    if key is not None:
        if value is None:
            raise ValueError(f"{op}: key and value must be given together")
        slots = loc.reshape(-1).long()
        k_buffer[slots] = key.reshape(slots.numel(), *k_buffer.shape[1:]).to(k_buffer.dtype)
        # MLA: v_buffer is a view of k_buffer and value of key; writing both is harmless.
        v_buffer[slots] = value.reshape(slots.numel(), *v_buffer.shape[1:]).to(v_buffer.dtype)
    lens = seq_lens.tolist()
    rows = req_pool_indices.tolist()
    for b, (row, n) in enumerate(zip(rows, lens)):
        first = max(0, n - window) if window > 0 else 0
        idx = req_to_token[row, first:n].long()
        out = _attend(query[b : b + 1], k_buffer[idx], v_buffer[idx], sm_scale, logit_cap, None, sinks)
        output[b : b + 1] = out.to(output.dtype)


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int | None,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool = False,
    sliding_window_size: int = 0,
    encoder_lens: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    is_causal: bool = True,
) -> None:
    """Prefill/extend (also speculative verify); writes ``o_extend [tokens, H, Dv]`` in place."""
    op = "extend_attention_cpu"
    _refuse(op, cross_attention=is_cross_attn, encoder_lengths=encoder_lens is not None,
            a_bit_packed_tree_mask=tree_mask is not None and tree_mask.dtype != torch.bool)
    _check_kv_dtype(op, k_buffer)
    window = int(sliding_window_size or 0)
    starts = extend_start_loc.tolist()
    ext_lens = extend_seq_lens.tolist()
    lens = seq_lens.tolist()
    rows = req_pool_indices.tolist()
    tree = tree_mask.reshape(-1) if tree_mask is not None else None
    if tree is not None and tree.numel() < sum(n * n for n in ext_lens):
        raise ValueError(f"{op}: a tree mask of {tree.numel()} entries for extend lengths {ext_lens} "
                         f"(needs one ext x ext block per sequence)")
    block = 0  # offset of this sequence's tree-mask block
    for row, start, ext, total in zip(rows, starts, ext_lens, lens):
        if ext == 0:
            continue
        prefix = total - ext
        q = q_extend[start : start + ext]
        if k_extend is None or v_extend is None:
            idx = req_to_token[row, :total].long()
            k, v = k_buffer[idx], v_buffer[idx]
        elif prefix == 0:
            # DeepSeek's MHA prefill passes per-head K/V while the buffers hold
            # the MLA latent: with no cached prefix the buffers are not read.
            k, v = k_extend[start : start + ext], v_extend[start : start + ext]
        else:
            if k_buffer.shape[1:] != k_extend.shape[1:] or v_buffer.shape[1:] != v_extend.shape[1:]:
                raise NotImplementedError(
                    f"pytest-eagle3's CPU stand-in extend_attention_cpu: new K/V of shape "
                    f"{tuple(k_extend.shape[1:])}/{tuple(v_extend.shape[1:])} after a cached prefix "
                    f"in buffers of shape {tuple(k_buffer.shape[1:])}/{tuple(v_buffer.shape[1:])}"
                )
            idx = req_to_token[row, :prefix].long()
            k = torch.cat([k_buffer[idx].to(k_extend.dtype), k_extend[start : start + ext]])
            v = torch.cat([v_buffer[idx].to(v_extend.dtype), v_extend[start : start + ext]])
        mask = None
        qpos = torch.arange(prefix, total).unsqueeze(1)
        kpos = torch.arange(total).unsqueeze(0)
        if tree is not None:
            among_new = tree[block : block + ext * ext].reshape(ext, ext)
            mask = torch.cat([torch.ones(ext, prefix, dtype=torch.bool), among_new], dim=1)
            block += ext * ext
        elif is_causal:
            mask = kpos <= qpos
        if window > 0:
            near = kpos > qpos - window
            mask = near if mask is None else mask & near
        out = _attend(q, k, v, sm_scale, logit_cap, mask, sinks)
        o_extend[start : start + ext] = out.to(o_extend.dtype)
