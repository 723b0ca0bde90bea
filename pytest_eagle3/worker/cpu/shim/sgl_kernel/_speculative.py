"""Plain-torch speculative-decoding bookkeeping ops SGLang's EAGLE worker calls on CPU.

Semantics from sgl-kernel ``csrc/cpu/speculative_decoding.cpp`` and the Triton
reference kernels SGLang 0.5.23 ships next to the CPU call sites
(``sglang/kernels/ops/speculative/spec_tree.py``, ``eagle.py``,
``cache_locs.py``).  The draft tree of one request has ``draft_token_num``
nodes; node 0 is the last verified token, node ``i > 0`` is the draft token
``selected_index[i - 1]`` (an index into the draft steps' top-k candidates),
and its parent is found through ``parent_list``.  Loops run per request in
Python: batches on the CPU tier are a handful of requests.
"""

from __future__ import annotations

import torch

QLEN_ONLY_BITPACKING = 2


def _parent_position(sel: list[int], parents: list[int], node_sel: int, topk: int) -> int | None:
    """Tree node (1-based; 0 = root) of the parent of the draft token chosen as ``node_sel``,
    or None when it is not in the tree."""
    parent_tb = node_sel // topk
    if parent_tb == 0:
        return 0
    parent_token = parents[parent_tb]
    for pos, value in enumerate(sel):
        if value == parent_token:
            return pos + 1
    return None


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Fill the tree's retrieval links, positions and attention mask in place.

    * ``retrieve_index[b, i] = b * draft_token_num + i`` (flat row of node i);
    * ``retrieve_next_token[b, p]``: first child of node p (-1: none), children
      linked through ``retrieve_next_sibling`` (the latest inserted first);
    * ``positions[b * n + i] = seq_len + depth(i)``;
    * ``tree_mask``: node i sees the root and its ancestors among the draft
      nodes, in a ``n x n`` block per request (QLEN_ONLY, mode 1) or in rows of
      ``seq_len + n`` columns after all earlier requests' rows (FULL_MASK, mode
      0, prefix columns left as filled by the caller).
    """
    if int(tree_mask_mode) == QLEN_ONLY_BITPACKING:
        raise NotImplementedError(
            "pytest-eagle3's CPU stand-in build_tree_kernel_efficient_cpu does not "
            "implement QLEN_ONLY_BITPACKING tree masks"
        )
    n = int(draft_token_num)
    topk = int(topk)
    bs = verified_seq_len.numel()
    seq_lens = verified_seq_len.tolist()
    sel_rows = selected_index.reshape(bs, -1).tolist()
    parent_rows = parent_list.reshape(bs, -1).tolist() if parent_list.numel() else [[]] * bs
    ri = retrieve_index.view(-1)
    rnt = retrieve_next_token.view(-1)
    rns = retrieve_next_sibling.view(-1)
    pos = positions.view(-1)
    mask = tree_mask.view(-1)
    full_mask_row0 = 0  # FULL_MASK: flat offset of this request's first row
    for b in range(bs):
        seq_len = int(seq_lens[b])
        sel = sel_rows[b][: n - 1]
        parents = parent_rows[b]
        off = b * n
        ri[off] = off
        pos[off] = seq_len
        for i in range(n - 1, 0, -1):
            ri[off + i] = off + i
            parent = _parent_position(sel, parents, sel[i - 1], topk)
            if parent is None:
                continue
            first = int(rnt[off + parent])
            rnt[off + parent] = i
            if first != -1:
                rns[off + i] = first
        for node in range(n):
            if int(tree_mask_mode) == 0:
                row = full_mask_row0 + (seq_len + n) * node + seq_len
            else:
                row = b * n * n + n * node
            mask[row] = True
            mask[row + 1 : row + n] = False
            if node == 0:
                continue
            level, cur = 0, node - 1
            for _ in range(int(depth)):
                level += 1
                mask[row + 1 + cur] = True
                parent = _parent_position(sel, parents, sel[cur], topk)
                if parent is None or parent == 0:
                    break
                cur = parent - 1
            pos[off + node] = seq_len + level
        full_mask_row0 += (seq_len + n) * n


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification, in place.

    Walk from the root: at each level take the first child whose draft token
    equals the target's argmax at the last accepted node; stop when none does.
    ``accept_index[b]`` lists the accepted nodes' flat rows (root first),
    ``accept_token_num[b]`` counts accepted draft tokens, and ``predicts[row]``
    gets the target's token at every accepted node (the last one is the bonus).
    """
    bs, n = candidates.shape[0], candidates.shape[1]
    steps = accept_index.shape[1]
    cand = candidates.reshape(bs, n).tolist()
    ri = retrive_index.reshape(bs, n).tolist()
    rnt = retrive_next_token.reshape(bs, n).tolist()
    rns = retrive_next_sibling.reshape(bs, n).tolist()
    target = target_predict.reshape(-1).tolist()
    pred = predicts.view(-1)
    acc = accept_index.view(bs, steps)
    for b in range(bs):
        last = ri[b][0]
        acc[b, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, steps):
            cur = rnt[b][cur]
            while cur != -1:
                if cand[b][cur] == target[last]:
                    pred[last] = target[last]
                    accepted += 1
                    acc[b, accepted] = ri[b][cur]
                    last = ri[b][cur]
                    break
                cur = rns[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = accepted
        pred[last] = target[last]


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """``req_to_token`` rows for the draft's multi-step decode: one row per
    (request, top-k branch) = the request's prefix, then that branch's
    ``num_steps`` draft slots (stored after the prefix, branch after branch)."""
    topk, num_steps = int(topk), int(num_steps)
    rows = req_pool_indices.tolist()
    lens = seq_lens.tolist()
    out = torch.empty((len(rows) * topk, int(pool_len)), dtype=req_to_token.dtype)
    for b, (row, sl) in enumerate(zip(rows, lens)):
        for k in range(topk):
            dst = out[b * topk + k]
            dst[:sl] = req_to_token[row, :sl]
            start = sl + k * num_steps
            dst[sl : sl + num_steps] = req_to_token[row, start : start + num_steps]
    return out


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """``out_cache_loc[b*c:(b+1)*c] = req_to_token[row_b, seq_len_b : seq_len_b + c]``,
    ``c = topk * num_steps`` (the draft's KV slots, already allocated)."""
    width = int(topk) * int(num_steps)
    out = out_cache_loc.view(-1)
    for b, (row, sl) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out[b * width : (b + 1) * width] = req_to_token[row, sl : sl + width].to(out.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Concatenate ``req_to_token[row_b, start_b:end_b]`` over requests into ``out_cache_loc``."""
    out = out_cache_loc.view(-1)
    o = 0
    for row, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        out[o : o + e - s] = req_to_token[row, s:e].to(out.dtype)
        o += e - s


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1]`` (the last
    accepted slot holds the bonus token)."""
    flat = accept_tokens.reshape(-1)
    for b, n in enumerate(accept_lens.tolist()):
        bonus_tokens[b] = flat[int(accept_stride) * b + n - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int | None = None,
) -> None:
    """Compact: the KV slots of the accepted nodes (``accept_index >= 0``), in order."""
    idx = accept_index.reshape(-1)
    if size is not None:
        idx = idx[: int(size)]
    kept = idx[idx > -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Move KV slots ``src_loc[j] -> tgt_loc[j]`` in every buffer of a KV pool.

    ``data_ptrs[i]`` is the address of buffer ``i`` (a layer's K or V cache)
    and ``strides[i]`` its slot size in bytes (SGLang ``cache_move.py``: the
    Triton kernel copies ``stride`` bytes per slot, all loads before stores,
    so overlapping moves are safe).  The pool only hands over raw addresses, so
    this copies bytes with ``ctypes``: every source slot is read before any
    target slot is written.
    """
    import ctypes

    pairs = list(zip(tgt_loc.reshape(-1).tolist(), src_loc.reshape(-1).tolist()))
    if not pairs:
        return
    for base, stride in zip(data_ptrs.reshape(-1).tolist(), strides.reshape(-1).tolist()):
        saved = [ctypes.string_at(base + src * stride, stride) for _, src in pairs]
        for (tgt, _), data in zip(pairs, saved):
            ctypes.memmove(base + tgt * stride, data, stride)
