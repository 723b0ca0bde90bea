"""CPU-tier fixes that older SGLang releases need for EAGLE-3 on a plain CPU (worker side).

Measured on sglang 0.5.9 (torch 2.9.1): its CPU mode serves DeepSeek, but
speculative decoding reaches CUDA-only code in a few places.  Each fix below
is installed only where its *feature test* finds the gap in the installed
SGLang (a missing name, a Triton kernel where a CPU branch would be, a
backend map without ``intel_amx``), never from the version number, and acts
when its module is imported (:mod:`pytest_eagle3.worker.cpu.fills` registers each
with :func:`pytest_eagle3.worker.post_import.when_imported`).
On sglang 0.5.23 only the MLA draft's ``set_embed`` test fires.

None touches what pytest-eagle3 tests: the aux hidden state capture
(``DeepseekV2Model.forward``, ``set_eagle3_layers_to_capture``), the
collectives, the embedding, the logits processor, the draft model, or the
speculative worker's control flow.  They stand in for kernels (plain torch,
the same semantics as the CUDA/Triton ones, sources named per fix) and add the
``intel_amx`` attention entries the speculative path looks up.

:data:`pytest_eagle3.worker.cpu.fills.FILLS` names every fix and the module it
acts on; each logs one line when it applies.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable

logger = logging.getLogger("pytest_eagle3.cpu")


def _log(what: str) -> None:
    logger.warning("pytest-eagle3 CPU tier (pid %d): %s", os.getpid(), what)


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _is_triton_kernel(obj: Any) -> bool:
    return type(obj).__name__ in ("JITFunction", "Autotuner", "Heuristics")


class _Launch:
    """Stand-in for a Triton kernel launched as ``kernel[grid](...)``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self.fn


# ------------------------------------------------------------------ server args


def amx_platform_fact(server_args: Any) -> None:
    """Keep ``--attention-backend intel_amx`` on a CPU without AMX (no platform-fact override).

    Releases without ``srt/runtime_context.py`` replace ``intel_amx`` by
    ``torch_native`` when ``cpu_has_amx_support()`` is False, reading that name
    in ``srt/server_args.py`` (0.5.9: ``server_args.py:1929-1937``).  This binds
    that one module-level name to ``True``; the per-layer AMX switches read
    ``srt/utils`` and stay False, as in
    :func:`pytest_eagle3.worker.cpu.patches.amx_attention_platform`.
    """
    if not callable(getattr(server_args, "cpu_has_amx_support", None)):
        return
    server_args.cpu_has_amx_support = lambda: True
    _log("server_args.cpu_has_amx_support() is True for the intel_amx attention backend")


# ------------------------------------------------------------------ attention


def intel_amx_speculative(module: Any) -> None:
    """TARGET_VERIFY metadata and a multi-step draft backend for ``IntelAMXAttnBackend``.

    Fires when ``init_forward_metadata`` never mentions ``is_target_verify``
    (0.5.9: ``srt/layers/attention/intel_amx_backend.py``; verify then reads
    ``extend_seq_lens`` = None).  With EAGLE topk 1 the draft tokens form a
    chain, so the verify forward is an extend of ``draft_token_num`` tokens per
    request after its cached prefix; that is how this runs it.  The multi-step
    draft backend gives draft step ``i`` the prefix plus draft tokens
    ``0..i`` (SGLang's other multi-step backends, ``srt/layers/attention/``).
    """
    import torch

    cls = module.IntelAMXAttnBackend
    if "is_target_verify" in _source(cls.init_forward_metadata):
        return
    original_meta = cls.init_forward_metadata
    original_extend = cls.forward_extend

    def init_forward_metadata(self: Any, forward_batch: Any) -> None:
        if forward_batch.forward_mode.is_target_verify():
            n = int(forward_batch.spec_info.draft_token_num)
            logits = torch.zeros((forward_batch.batch_size, self.num_head, 8, self.v_head_dim + 1),
                                 dtype=torch.float32, device=self.device)
            self.forward_metadata = (logits, n)
            return None
        return original_meta(self, forward_batch)

    def forward_extend(self: Any, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any,
                       save_kv_cache: bool = True, **kwargs: Any) -> Any:
        if not forward_batch.forward_mode.is_target_verify():
            return original_extend(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        if int(getattr(forward_batch.spec_info, "topk", 1)) != 1:
            raise NotImplementedError("pytest-eagle3 CPU tier: target verify with speculative topk > 1")
        n = int(forward_batch.spec_info.draft_token_num)
        bs = forward_batch.batch_size
        saved = (forward_batch.seq_lens, forward_batch.extend_seq_lens, forward_batch.extend_start_loc)
        forward_batch.seq_lens = saved[0] + n
        forward_batch.extend_seq_lens = torch.full((bs,), n, dtype=torch.int32)
        forward_batch.extend_start_loc = torch.arange(bs, dtype=torch.int32) * n
        try:
            return original_extend(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        finally:
            forward_batch.seq_lens, forward_batch.extend_seq_lens, forward_batch.extend_start_loc = saved

    cls.init_forward_metadata = init_forward_metadata
    cls.forward_extend = forward_extend

    class DraftStepBackend(cls):  # type: ignore[misc, valid-type]
        """Draft decode step ``step``: the prefix plus draft tokens ``0..step``."""

        def __init__(self, model_runner: Any, step: int) -> None:
            super().__init__(model_runner)
            self.step = step

        def forward_decode(self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any,
                           save_kv_cache: bool = True, **kwargs: Any) -> Any:
            saved = forward_batch.seq_lens
            forward_batch.seq_lens = saved + self.step + 1
            try:
                return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
            finally:
                forward_batch.seq_lens = saved

    class MultiStepDraftBackend:
        def __init__(self, model_runner: Any, topk: int, speculative_num_steps: int) -> None:
            if topk != 1:
                raise NotImplementedError("pytest-eagle3 CPU tier: multi-step draft with speculative topk > 1")
            self.topk = topk
            self.speculative_num_steps = speculative_num_steps
            self.attn_backends = [DraftStepBackend(model_runner, i) for i in range(speculative_num_steps - 1)]

        def init_forward_metadata(self, forward_batch: Any) -> None:
            for backend in self.attn_backends:
                backend.init_forward_metadata(forward_batch)

    module.PytestEagle3MultiStepDraftBackend = MultiStepDraftBackend
    _log("IntelAMXAttnBackend: target-verify metadata and a multi-step draft backend (topk 1)")


def draft_backend_factory(module: Any) -> None:
    """Give ``DraftBackendFactory`` its ``intel_amx`` entries where it has none
    (0.5.9: ``srt/speculative/draft_utils.py``: no ``_create_intel_amx_decode_backend``)."""
    factory = getattr(module, "DraftBackendFactory", None)
    if factory is None or hasattr(factory, "_create_intel_amx_decode_backend"):
        return
    original_decode = factory.create_decode_backend
    original_extend = factory.create_draft_extend_backend

    def backend_type(self: Any, name: str) -> str:
        return (getattr(self, "draft_attn_backend", None) or getattr(self.server_args, name, None)
                or self.server_args.attention_backend)

    def create_decode_backend(self: Any) -> Any:
        if self.speculative_num_steps == 1:
            return None
        if backend_type(self, "decode_attention_backend") == "intel_amx":
            from sglang.srt.layers.attention import intel_amx_backend

            return intel_amx_backend.PytestEagle3MultiStepDraftBackend(
                self.draft_model_runner, self.topk, self.speculative_num_steps)
        return original_decode(self)

    def create_draft_extend_backend(self: Any) -> Any:
        name = ("decode_attention_backend" if self.server_args.speculative_attention_mode == "decode"
                else "prefill_attention_backend")
        if backend_type(self, name) == "intel_amx":
            from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend

            return IntelAMXAttnBackend(self.draft_model_runner)
        return original_extend(self)

    factory.create_decode_backend = create_decode_backend
    factory.create_draft_extend_backend = create_draft_extend_backend
    _log("DraftBackendFactory: intel_amx draft decode / draft extend backends")


# ------------------------------------------------------------------ speculative kernels


def eagle_tree_kernels(module: Any) -> None:
    """CPU tree build and greedy verify where ``srt/speculative/eagle_utils.py`` has
    only CUDA/HIP/NPU branches (0.5.9: ``sgl_build_tree_kernel_efficient`` imported
    under ``if _is_cuda or _is_hip``, so a NameError on CPU; ``verify_tree_greedy_func``
    silently does nothing on CPU).  Both use the stand-in ``sgl_kernel``'s
    plain-torch versions of sgl-kernel's ``build_tree_kernel_efficient`` and
    ``verify_tree_greedy``.
    """
    if not hasattr(module, "sgl_build_tree_kernel_efficient") and "sgl_build_tree_kernel_efficient" in _source(module):
        from sgl_kernel import build_tree_kernel_efficient_cpu

        def sgl_build_tree_kernel_efficient(*args: Any) -> Any:
            args_list = list(args)
            args_list[-1] = int(args_list[-1])
            return build_tree_kernel_efficient_cpu(*args_list)

        module.sgl_build_tree_kernel_efficient = sgl_build_tree_kernel_efficient
        _log("eagle_utils: plain-torch build_tree_kernel_efficient")
    verify = getattr(module, "verify_tree_greedy_func", None)
    if verify is not None and "cpu" not in _source(verify).lower():
        from sgl_kernel import verify_tree_greedy_cpu

        names = ("predicts", "accept_index", "accept_token_num", "candidates", "retrive_index",
                 "retrive_next_token", "retrive_next_sibling", "target_predict")

        def verify_tree_greedy_func(*args: Any, **kwargs: Any) -> Any:
            # 0.5.11 renamed retrive_* to retrieve_* and callers pass them by name.
            named = {k.replace("retrieve_", "retrive_"): v for k, v in kwargs.items() if k != "topk"}
            values = list(args[:len(names)]) + [named[n] for n in names[len(args[:len(names)]):]]
            verify_tree_greedy_cpu(*values)
            return values[0], values[1], values[2]

        module.verify_tree_greedy_func = verify_tree_greedy_func
        _log("eagle_utils: plain-torch verify_tree_greedy")


def spec_utils_kernels(module: Any) -> None:
    """Plain-torch versions of the Triton bookkeeping kernels the EAGLE path launches
    from ``srt/speculative/spec_utils.py`` with no CPU branch (0.5.9), each from the
    Triton kernel's own semantics in that file; installed only where the name is
    (or launches) a Triton kernel."""
    import torch

    if _is_triton_kernel(getattr(module, "assign_req_to_token_pool", None)) and \
            "cpu" not in _source(getattr(module, "assign_req_to_token_pool_func", None)).lower():
        def assign_req_to_token_pool_func(req_pool_indices: Any, req_to_token: Any, start_offset: Any,
                                          end_offset: Any, out_cache_loc: Any, batch_size: int) -> None:
            offset = 0
            for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
                req_to_token[row, start:end] = out_cache_loc[offset:offset + end - start].to(req_to_token.dtype)
                offset += end - start

        module.assign_req_to_token_pool_func = assign_req_to_token_pool_func
        _log("spec_utils: plain-torch assign_req_to_token_pool")

    if _is_triton_kernel(getattr(module, "assign_draft_cache_locs", None)):
        def assign_draft_cache_locs(req_pool_indices: Any, req_to_token: Any, seq_lens: Any, extend_lens: Any,
                                    num_new_pages_per_topk: Any, out_cache_loc: Any, *rest: Any, **kw: Any) -> None:
            # Positional tail of 0.5.9: source_cache_loc, target_cache_loc,
            # last_page_lens_cumsum, duplicate_cache_len, pool_len, topk,
            # speculative_num_steps, page_size, bs_upper, iter_upper.
            topk, steps, page_size = int(rest[5]), int(rest[6]), int(rest[7])
            if page_size != 1 and topk != 1:
                raise NotImplementedError("pytest-eagle3 CPU tier: draft cache locations with page_size > 1 "
                                          "and topk > 1")
            width = topk * steps
            for b, (row, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
                req_to_token[row, length:length + width] = out_cache_loc[b * width:(b + 1) * width].to(
                    req_to_token.dtype)

        module.assign_draft_cache_locs = _Launch(assign_draft_cache_locs)
        _log("spec_utils: plain-torch assign_draft_cache_locs (topk 1 or page size 1)")

    if _is_triton_kernel(getattr(module, "create_extend_after_decode_spec_info", None)):
        def create_extend_after_decode_spec_info(verified_id: Any, seq_lens: Any, accept_lens: Any,
                                                 positions: Any, new_verified_id: Any, bs_upper: Any) -> None:
            offset = 0
            for b, (length, accepted) in enumerate(zip(seq_lens.tolist(), accept_lens.tolist())):
                positions[offset:offset + accepted] = torch.arange(length - accepted, length, dtype=positions.dtype)
                new_verified_id[b] = verified_id[offset + accepted - 1]
                offset += accepted

        module.create_extend_after_decode_spec_info = _Launch(create_extend_after_decode_spec_info)
        _log("spec_utils: plain-torch create_extend_after_decode_spec_info")


def kv_cache_copy(module: Any) -> None:
    """Plain-torch ``copy_all_layer_kv_cache_tiled`` (0.5.9 ``srt/mem_cache/memory_pool.py``
    launches this Triton kernel while building the KV pool, with no CPU branch),
    through the stand-in ``sgl_kernel.copy_all_layer_kv_cache_cpu``."""
    if not _is_triton_kernel(getattr(module, "copy_all_layer_kv_cache_tiled", None)):
        return
    from sgl_kernel import copy_all_layer_kv_cache_cpu

    def copy_all_layer_kv_cache_tiled(data_ptrs: Any, strides: Any, tgt_loc: Any, src_loc: Any, num_locs: Any,
                                      num_locs_upper: Any, BYTES_PER_TILE: Any = None, **launch: Any) -> None:
        n = int(num_locs)
        copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc.reshape(-1)[:n], src_loc.reshape(-1)[:n])

    module.copy_all_layer_kv_cache_tiled = _Launch(copy_all_layer_kv_cache_tiled)
    _log("memory_pool: plain-torch copy_all_layer_kv_cache_tiled")


def _skip_cuda_sync(module: Any, class_name: str, where: str) -> None:
    """Run ``class_name.set_embed`` / ``set_embed_and_head`` with ``torch.cuda.synchronize``
    as a no-op on a machine without CUDA, where either method calls it unconditionally
    (``where`` names the source read).  The embedding itself is bound as SGLang binds it."""
    import torch

    cls = getattr(module, class_name, None)
    if cls is None or torch.cuda.is_available():
        return
    for method in ("set_embed", "set_embed_and_head"):
        original = getattr(cls, method, None)
        if original is None or "cuda.synchronize" not in _source(original):
            continue

        def without_sync(self: Any, *args: Any, _original: Any = original) -> Any:
            real = torch.cuda.synchronize
            torch.cuda.synchronize = lambda *a, **k: None
            try:
                return _original(self, *args)
            finally:
                torch.cuda.synchronize = real

        setattr(cls, method, without_sync)
        _log(f"{class_name}.{method}: torch.cuda.synchronize skipped on CPU ({where})")


def draft_set_embed(module: Any) -> None:
    """Skip ``torch.cuda.synchronize()`` in ``LlamaForCausalLM.set_embed`` on a machine
    without CUDA (0.5.9 ``srt/models/llama.py:763-773`` calls it unconditionally when
    the EAGLE-3 draft shares the target's embedding)."""
    _skip_cuda_sync(module, "LlamaForCausalLM", "srt/models/llama.py")


def mla_draft_set_embed(module: Any) -> None:
    """The same for the MLA EAGLE-3 draft ``Eagle3DeepseekV2ForCausalLM``: 0.5.23
    ``srt/models/kimi_k25_eagle3.py`` ``set_embed`` (lines 404-415) and
    ``set_embed_and_head`` (417-423) call ``torch.cuda.synchronize()`` unconditionally."""
    _skip_cuda_sync(module, "Eagle3DeepseekV2ForCausalLM", "srt/models/kimi_k25_eagle3.py")

