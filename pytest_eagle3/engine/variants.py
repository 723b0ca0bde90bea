"""The path variants: the server-arg and request variants the capture tests run
under, one row each of the path matrix.

Each :class:`Variant` names one SGLang code path that can change what the aux
hidden states capture (issue 4, "Path matrix"): how the engine is started
(``server_args``), how the test talks to it (``request``), or which layer ids
it asks for (``ids``).  Every variant is compared with the plain TP run of the
same checkpoint, i.e. with the transformers reference rows at the same
positions.

:meth:`Variant.requirements` says, before anything starts, whether a variant
can run here: the installed SGLang must accept its flags (read from its
``--help``, never from its version number) and the device, TP size and GPU
architecture must allow the path (:mod:`pytest_eagle3.engine.variant_checks`).
The answer is a precise skip reason or ``None``.
:func:`pytest_eagle3.engine.variant_matrix.matrix` applies it to every variant;
``pytest --eagle3-list-variants`` prints the result
(:func:`pytest_eagle3.engine.variant_matrix.format_matrix`).  Whether a running
engine really took a variant's path: :mod:`pytest_eagle3.engine.variant_proof`.

Request fields (``Variant.request``), read by the variant tests:

* ``decode_steps`` (int): decode rows wanted per prompt.
* ``repeat`` (int): send each prompt this many times in a row; with the radix
  cache on, later sends hit the cache and return only the uncached rows
  (measured on CPU, 0.5.23; :func:`pytest_eagle3.engine.variant_proof.prefill_rows`):
  compare the ``n`` returned rows with reference rows ``T - n .. T - 1``.
* ``batch`` (bool): all prompts in one batched ``/generate`` request.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pytest_eagle3.engine.variant_ids import ids_at_first_k_dense, ids_last_capturable
from pytest_eagle3.engine.variant_checks import (
    MSG_NO_FLAG, NO_NEEDS, SBO_GPU_ARCHS, SM10X, SM90, Needs, missing_flags, unmet_needs,
)

#: Name of a variant's :attr:`Variant.pair` in its test's engine set.
PAIR_MEMBER = "pair"
#: The installed SGLang has no fused path the CPU stand-in can serve.
MSG_NO_STANDIN = "{summary}; on cpu the installed {sglang} has no fused path the stand-in serves: {why}"

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall


class _TpSize:
    """Placeholder for the run's TP size inside ``server_args`` (``attn_dp_size=TP``)."""

    def __repr__(self) -> str:
        return "TP"


#: Replaced by the run's TP size in :meth:`Variant.args_for`.
TP = _TpSize()

#: Chunk size of the ``chunked-prefill`` variant: the suite prompts of 23, 32
#: and 40 tokens span 2, 2 and 3 chunks (the 40-token one has a middle chunk),
#: the shorter ones fit in one.  SGLang's only lower bound is divisibility by
#: ``page_size`` (``validation_hook.check_server_args``); page size is 1 on CPU
#: and on most CUDA MLA backends, but 32/64 with trtllm_mla, cutedsl_mla and
#: flashmla, where 16 is rejected at startup: on CUDA the variant keeps an
#: engine of its own (:attr:`Variant.shared_on`).
CHUNK_SIZE = 16

#: The CPU tier's switch for SGLang's fused all-reduce + add + RMSNorm path: an
#: argument of ours in :attr:`Variant.cpu_args`, never passed to SGLang;
#: :func:`pytest_eagle3.capture.api.engine_config` turns it into the engine env
#: that installs the gloo stand-in (:mod:`pytest_eagle3.worker.cpu.allreduce_fusion`).
CPU_ALLREDUCE_FUSION = "pytest_eagle3_cpu_allreduce_fusion"

#: The CPU-tier fix DP attention needs on ``torch_native`` (measured: with it, sglang
#: 0.5.23 serves DP attention at TP 2 on CPU and the captures match the reference).
TORCH_NATIVE_DP_PADDING = "torch_native_dp_padding"


@dataclass(frozen=True)
class Variant:
    """One path of the matrix.

    Attributes:
        name: stable id, used in test ids (``dp-attention``).
        description: what the path does to the captures and what the test checks.
        server_args: extra server arguments in the preferred spelling (names with
            underscores; :data:`TP` stands for the run's TP size).  ``{}``: the
            plain engine.
        needs: device, TP and architecture needs
            (:class:`pytest_eagle3.engine.variant_checks.Needs`).
        source: where the path lives or was fixed (SGLang PR / file).
        request: request-level fields (see the module docstring).
        alternatives: older spellings of ``server_args`` tried in order when the
            installed SGLang lacks a flag of the preferred one (forks, older versions).
        ids: the layer ids the test asks for, from ``(L, first_k_dense_replace)``;
            ``None``: the test's usual ids.
        engaged: what SGLang's ``/server_info`` must show when the path is really
            on, beyond echoing the flags: ``(dotted key, "==" or "!=", value)``,
            e.g. the resolved ``cuda_graph_config.decode.backend``; a key the
            installed SGLang does not report is not judged.
        shared_on: devices on which the variant's ``server_args`` are part of the
            capture engine (:func:`shared_engine_args`), so the variant runs
            on an engine the default run starts anyway instead of one of its own.
        cpu_args: on cpu, the arguments that take the path instead of
            ``server_args``, layered over the capture engine's (the path then
            differs from the capture engine in nothing else): SGLang server
            arguments, or a CPU stand-in's switch such as :data:`CPU_ALLREDUCE_FUSION`.
            ``None``: ``server_args`` on every device.  A variant whose ``cpu_args``
            only switch a stand-in off is the capture engine itself on cpu.
        pair: the variant whose captures must equal this one's, row for row (the
            on/off contrast); the test's engine set holds its engine as
            :data:`PAIR_MEMBER` and the captures are compared with each other.
        reduce_scatter: ``(forward mode, SGLang function)`` of the reduce-scatter route
            the variant proves (:mod:`pytest_eagle3.engine.route_proof`); ``None``: none.
    """

    name: str
    description: str
    server_args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    needs: Needs = NO_NEEDS
    source: str = ""
    request: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    alternatives: tuple[Mapping[str, Any], ...] = ()
    ids: Callable[[int, int], tuple[int, ...]] | None = field(default=None, compare=False)
    engaged: tuple[tuple[str, str, Any], ...] = ()
    shared_on: tuple[str, ...] = ()
    cpu_args: Mapping[str, Any] | None = None
    pair: str = ""
    reduce_scatter: tuple[str, str] | None = None

    def own_engine(self, device: str) -> bool:
        """Whether the variant needs an engine nobody else uses on ``device``:
        server args or ids of its own that the capture engine does not have."""
        if self.ids is not None:
            return True
        if device == "cpu" and self.cpu_args is not None:
            return any(bool(v) for v in self.cpu_args.values())
        return bool(self.server_args) and device not in self.shared_on

    def spellings(self) -> tuple[Mapping[str, Any], ...]:
        """``server_args`` and then each alternative."""
        return (self.server_args, *self.alternatives)

    def spelling_for(self, install: "SGLangInstall") -> Mapping[str, Any] | None:
        """The first spelling whose every flag ``install`` accepts (``None``: none does)."""
        for args in self.spellings():
            if all(install.has_arg(name) for name in args):
                return args
        return None

    def args_for(self, install: "SGLangInstall", tp: int, device: str = "cuda") -> dict[str, Any]:
        """Server arguments for ``install`` at ``tp`` (:data:`TP` replaced); on cpu
        :attr:`cpu_args` where the variant has them.

        Raises:
            ValueError: ``install`` accepts no spelling (check :meth:`requirements` first).
        """
        if device == "cpu" and self.cpu_args is not None:
            return dict(self.cpu_args)
        args = self.spelling_for(install)
        if args is None:
            raise ValueError(MSG_NO_FLAG.format(summary=self.needs.summary or self.name,
                                                sglang=install.describe(),
                                                flags=missing_flags(self.spellings(), install)))
        return {k: (tp if v is TP else v) for k, v in args.items()}

    def requirements(self, install: "SGLangInstall", device: str, tp: int,
                     gpu_arch: str | Sequence[int] | None = None) -> str | None:
        """Why this variant cannot run here, or ``None`` when it can.

        Checks, in order: the installed SGLang's flags, the device, the TP size,
        the GPU architecture (``"sm90"``, ``"9.0"``, ``(9, 0)``; ``None``: unknown).
        """
        summary = self.needs.summary or f"{self.name} needs no more than the plain engine"
        standin = device == "cpu" and self.cpu_args is not None
        if standin:
            # SGLang's own flags among the cpu args (the stand-in switch is ours).
            flags = {k: v for k, v in (self.cpu_args or {}).items() if k != CPU_ALLREDUCE_FUSION}
            if any(not install.has_arg(name) for name in flags):
                return MSG_NO_FLAG.format(summary=summary, sglang=install.describe(),
                                          flags=missing_flags((flags,), install))
        elif self.spelling_for(install) is None:
            return MSG_NO_FLAG.format(summary=summary, sglang=install.describe(),
                                      flags=missing_flags(self.spellings(), install))
        reason = unmet_needs(self.needs, summary, device, tp, gpu_arch)
        if reason is None and standin and any(k == CPU_ALLREDUCE_FUSION for k in self.cpu_args or {}):
            refusal = install.fusion_code().refusal if install.location else None
            if refusal is not None:
                return MSG_NO_STANDIN.format(summary=summary, sglang=install.describe(), why=refusal)
        return reason


# --- the variants ---------------------------------------------------------

_DP_ATTENTION = MappingProxyType({
    "attn_dp_size": TP, "enable_dp_lm_head": True, "moe_dense_tp_size": 1,
})
# SGLang versions and forks without --attn-dp-size (deprecated in 0.5.23, removal after 2026-12-31).
_DP_ATTENTION_LEGACY = MappingProxyType({
    "enable_dp_attention": True, "dp_size": TP, "enable_dp_lm_head": True, "moe_dense_tp_size": 1,
})
# Two-batch overlap as DeepSeek-V3 runs it: DeepEP (normal mode for prefill, low-latency for decode), bf16.
_TBO = MappingProxyType({"enable_two_batch_overlap": True, "moe_a2a_backend": "deepep",
                         "deepep_dispatcher_output_dtype": "bf16"})
_TBO_LEGACY = MappingProxyType({"enable_two_batch_overlap": True, "moe_a2a_backend": "deepep"})  # fp8 dispatch


VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="plain",
        description="the capture engine (radix cache on, flushed before each send; chunked "
        "prefill on cpu), default parallel paths; prefill rows only",
        source="pytest_eagle3/engine/config.py base_server_args",
    ),
    Variant(
        name="decode",
        description="same engine; the test asks for decode rows (one [K*H] row per step, "
        "position T+j, input token output_ids[j])",
        request=MappingProxyType({"decode_steps": 4}),
        source="srt/managers/scheduler_components/batch_result_processor.py _append_decode_hidden_states",
    ),
    Variant(
        name="chunked-prefill",
        description=f"chunked_prefill_size={CHUNK_SIZE}: prompts longer than {CHUNK_SIZE} are "
        "prefilled in chunks; SGLang returns only the last chunk's rows (positions "
        "C*((T-1)//C) .. T-1), compare those (every chunk on every TP rank: test_per_rank.py); "
        "on cpu the capture engine chunks",
        server_args=MappingProxyType({"chunked_prefill_size": CHUNK_SIZE}),
        shared_on=("cpu",),
        needs=Needs(summary=f"chunked prefill (chunk {CHUNK_SIZE}) needs --chunked-prefill-size"),
        source="srt/arg_groups/validation_hook.py check_server_args (chunk % page_size == 0); "
        "batch_result_processor.py (middle chunks not stored)",
    ),
    Variant(
        name="unchunked-prefill",
        description="every prompt prefilled in one forward (chunked_prefill_size=-1), compared row for row "
        "with the chunked-prefill engine (its pair) at the positions both return: a chunk boundary must "
        "not change a capture; on cpu an engine of its own over the capture engine's settings, on cuda "
        "the capture engine itself",
        cpu_args=MappingProxyType({"chunked_prefill_size": -1}),
        pair="chunked-prefill",
        source="srt/managers/scheduler.py (chunked_prefill_size <= 0: chunking off); SGLang PR #26329",
    ),
    Variant(
        name="radix-cache-hit",
        description="radix cache on (the capture engine; the cache is flushed before every "
        "fresh send); each prompt is sent fresh, then again: the second send returns only "
        "the uncached rows (1 row, position T-1, at page size 1), compare them with the "
        "fresh send's rows and the reference rows at the same positions",
        server_args=MappingProxyType({"disable_radix_cache": False}),
        shared_on=("cpu", "cuda"),
        request=MappingProxyType({"repeat": 2, "decode_steps": 2}),
        needs=Needs(summary="a radix-cache hit needs --disable-radix-cache (to switch the cache back on)"),
        source="srt/managers/schedule_batch.py Req._compute_max_prefix_len",
    ),
    Variant(
        name="batch",
        description="all prompts (different lengths) in one batched request: each response "
        "must carry its own rows (no cross-request mix-up)",
        request=MappingProxyType({"batch": True, "decode_steps": 2}),
        source="SGLang issue #26163",
    ),
    Variant(
        name="dp-attention",
        description="attention data-parallel across the TP group (a scheduler per DP rank), dense FFN "
        "fully data-parallel, vocab-parallel LM head per attention group; MoE inputs gathered, in decode "
        "(max-len DP padding) the MoE output returns through dp_reduce_scatter; rows must come back gathered",
        server_args=_DP_ATTENTION,
        alternatives=(_DP_ATTENTION_LEGACY,),
        request=MappingProxyType({"batch": True, "decode_steps": 2}),
        needs=Needs(
            summary="DP attention needs TP>=2 (attn_dp_size = tp)", min_tp=2,
            cpu_fix=TORCH_NATIVE_DP_PADDING,
            cpu_fix_why="sglang 0.5.23 pads DP batches in ForwardBatch._pad_inputs_to_size and asks "
            "the attention backend for get_cpu_graph_seq_len_fill_value, which torch_native lacks: "
            "AttributeError at the first forward",
        ),
        source="srt/layers/dp_attention.py; srt/arg_groups/parallel_hook.py "
        "handle_data_parallelism, handle_deprecated_dp_attention; PR #14280; layer_boundary/exit.py "
        "_select_dp_reduce_scatter",
        reduce_scatter=("DECODE", "dp_reduce_scatter"),
        pair="dp-attention-all-reduce",
    ),
    Variant(
        name="dp-attention-all-reduce",
        description="dp-attention's settings with --boundary-reduction ar: the MoE output all-reduced, "
        "then each DP rank's rows taken (no dp_reduce_scatter): dp-attention's pair, row for row",
        server_args=MappingProxyType({**_DP_ATTENTION, "boundary_reduction": "ar"}),
        alternatives=(MappingProxyType({**_DP_ATTENTION_LEGACY, "boundary_reduction": "ar"}),),
        request=MappingProxyType({"batch": True, "decode_steps": 2}),
        needs=Needs(summary="DP attention without the reduce-scatter needs TP>=2 and --boundary-reduction",
                    min_tp=2, cpu_fix=TORCH_NATIVE_DP_PADDING, cpu_fix_why="as dp-attention"),
        engaged=(("boundary_reduction", "==", "ar"),),
        source="srt/arg_groups/fields/exec_.py boundary_reduction (ar: all-reduce then token "
        "redistribution); srt/layers/layer_boundary/factories.py _resolve_ffn",
    ),
    Variant(
        name="attn-tp-input-scattered",
        description="prefill attention input scattered over the TP ranks; the FFN sum completes in a "
        "reduce-scatter onto each rank's rows (tp_reduce_scatter), gathered back; SGLang keeps it off "
        "under an EAGLE-3 draft, not on the capture-only engine; on cpu its device condition stood in",
        server_args=MappingProxyType({"enable_attn_tp_input_scattered": True}),
        request=MappingProxyType({"batch": True, "decode_steps": 2}),
        needs=Needs(summary="input-scattered attention needs TP>1 without DP attention", min_tp=2,
                    cpu_fix="input_scattered_platform",
                    cpu_fix_why="AttnTpContext.init_context keeps it off outside CUDA and NPU"),
        source="srt/layers/layer_boundary/adapters/attention.py AttnTpContext.init_context; ops.py residual_slice_output",
        reduce_scatter=("EXTEND", "tp_reduce_scatter"),
    ),
    Variant(
        name="allreduce-fusion-on",
        description="FlashInfer all-reduce fused into the next layer's add+RMSNorm: the MLP "
        "all-reduce is deferred, a capture read before it sees per-rank partial sums "
        "(sglang auto-enables it for DeepSeek-V3 on SM90/SM100 at TP>1, so plain is the same path there); "
        "on cpu SGLang's own fused path with a gloo stand-in for the fused op, on the capture engine's "
        "settings; compared with the reference and, row for row, with allreduce-fusion-off",
        server_args=MappingProxyType({"flashinfer_allreduce_fusion_backend": "auto"}),
        alternatives=(MappingProxyType({"enable_flashinfer_allreduce_fusion": True}),),
        cpu_args=MappingProxyType({CPU_ALLREDUCE_FUSION: True}),
        pair="allreduce-fusion-off",
        needs=Needs(summary="all-reduce fusion needs TP>1 and CUDA SM90/SM100 (on cpu: the stand-in "
                    "of pytest_eagle3/worker/cpu/allreduce_fusion.py)",
                    min_tp=2, gpu_archs=(SM90, SM10X), cpu_fix="allreduce_fusion_standin",
                    cpu_fix_why="the fused op is FlashInfer's, CUDA only"),
        source="PR #28343; srt/layers/layer_boundary/residual/add_norm.py flashinfer_ar_fusion_applies "
        "(<= 2048 tokens, no DP attention); srt/arg_groups/overrides.py auto-enable",
    ),
    Variant(
        name="allreduce-fusion-off",
        description="FlashInfer all-reduce fusion forced off: the contrast to allreduce-fusion-on "
        "on hardware where sglang would enable it by default; on cpu the capture engine "
        "(fusion is off there unless --eagle3-cpu-allreduce-fusion)",
        server_args=MappingProxyType({"enforce_disable_flashinfer_allreduce_fusion": True}),
        cpu_args=MappingProxyType({CPU_ALLREDUCE_FUSION: False}),
        needs=Needs(summary="all-reduce fusion off differs from plain only where fusion can run: "
                    "TP>1 and CUDA SM90/SM100 (on cpu: the stand-in)", min_tp=2, gpu_archs=(SM90, SM10X)),
        source="srt/arg_groups/overrides.py _enforce_disable_allreduce_fusion",
    ),
    Variant(
        name="cuda-graph-on",
        description="decode replayed from CUDA graphs: the aux layers must be set before graph "
        "capture; the test asks for decode rows",
        server_args=MappingProxyType({"cuda_graph_backend_decode": "full"}),
        alternatives=(MappingProxyType({"disable_cuda_graph": False}),),
        request=MappingProxyType({"decode_steps": 4}),
        pair="cuda-graph-off",
        needs=Needs(summary="CUDA graphs need CUDA", devices=("cuda",)),
        source="PR #22836; the flag is echoed as given, the effective backend is "
        "cuda_graph_config.decode.backend (ServerArgs.resolved_dict, sglang 0.5.23)",
        engaged=(("cuda_graph_config.decode.backend", "!=", "disabled"),),
    ),
    Variant(
        name="cuda-graph-off",
        description="CUDA graphs off (eager decode): the contrast to cuda-graph-on",
        server_args=MappingProxyType({"cuda_graph_backend_decode": "disabled",
                                      "cuda_graph_backend_prefill": "disabled"}),
        alternatives=(MappingProxyType({"disable_cuda_graph": True}),),
        request=MappingProxyType({"decode_steps": 4}),
        needs=Needs(summary="CUDA graphs off differs from plain only on CUDA (the CPU tier never "
                    "uses them)", devices=("cuda",)),
        engaged=(("cuda_graph_config.decode.backend", "==", "disabled"),),
        source="srt/server_args.py --disable-cuda-graph (deprecated in 0.5.23)",
    ),
    Variant(
        name="two-batch-overlap",
        description="two micro-batches overlapped on top of DP attention and DeepEP (bf16 dispatch); "
        "layers from first_k_dense_replace on run through model_forward_stages (deepseek_v2.py), a "
        "different capture path; the test sends a batch and decodes",
        server_args=MappingProxyType({**_DP_ATTENTION, **_TBO}),
        alternatives=(MappingProxyType({**_DP_ATTENTION_LEGACY, **_TBO_LEGACY}),),
        request=MappingProxyType({"batch": True, "decode_steps": 2}),
        needs=Needs(summary="two-batch overlap needs DP attention at TP>=2 and, for DeepSeek's TBO operations, "
                    "an EP all-to-all backend (DeepEP; on cpu: the stand-in fill deepep_standin)",
                    min_tp=2, cpu_fix="deepep_standin", cpu_fix_why="deep_ep imports only with a CUDA device: "
                    "ImportError at token_dispatcher/deepep.py:54"),
        source="srt/arg_groups/validation_hook.py check_two_batch_overlap; "
        "srt/batch_overlap/two_batch_overlap.py model_forward_stages",
    ),
    Variant(
        name="single-batch-overlap",
        description="single-batch overlap: each MoE layer runs its shared experts inside the "
        "dispatcher's combine hooks on a second stream (DeepseekV2MoE._fuse_shared_experts_inside_sbo); "
        "the layer loop, so the capture, is unchanged; the test sends a batch and decodes",
        server_args=MappingProxyType({"enable_single_batch_overlap": True}),
        request=MappingProxyType({"batch": True, "decode_steps": 2}),
        needs=Needs(summary="single-batch overlap is refused on SM90 (compute capability 9.x, "
                    "srt/layers/moe/utils.py) and its second stream exists only on CUDA (on cpu: the "
                    "stand-in fill sbo_streams)",
                    gpu_archs=SBO_GPU_ARCHS, cpu_fix="sbo_streams",
                    cpu_fix_why="DeepseekV2Model makes alt_stream only on CUDA: AttributeError at "
                    "deepseek_v2.py:1382 in the first pre-combine hook"),
        source="srt/batch_overlap/single_batch_overlap.py SboFlags; srt/models/deepseek_v2.py "
        "DeepseekV2MoE.forward_normal (_pre_combine_hook)",
    ),
    Variant(
        name="ids-at-first-k-dense",
        description="ids (0, k, k+1) for k = first_k_dense_replace: the last dense layer's and "
        "the first MoE layer's outputs",
        ids=ids_at_first_k_dense,
        source="PR #14280 (i == first_k_dense_replace is the all-gather boundary)",
    ),
    Variant(
        name="ids-last-capturable",
        description="ids (0, L//2, L-1): the input of the last layer, the deepest id SGLang captures",
        ids=ids_last_capturable,
        source="srt/models/deepseek_v2.py DeepseekV2Model.forward (layers_to_capture, i < L)",
    ),
)


def shared_engine_args(install: "SGLangInstall", device: str, tp: int) -> dict[str, Any]:
    """Server args of the capture engine (every id list's capture-only engine; one per
    TP size where it switches ids, :func:`pytest_eagle3.capture.api.switches_ids`):
    every variant shared on ``device``
    (:attr:`Variant.shared_on`) that the installed SGLang accepts, so the default
    run takes their paths (radix-cache hits; chunked prefill on cpu) on an engine
    it starts anyway.  The plain, decode and batch variants run on the same engine."""
    args: dict[str, Any] = {}
    for variant in VARIANTS:
        if device in variant.shared_on and variant.spelling_for(install) is not None:
            args.update(variant.args_for(install, tp, device))
    return args


def variant_names() -> list[str]:
    return [v.name for v in VARIANTS]


def get_variant(name: str) -> Variant:
    """The variant ``name``.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    for variant in VARIANTS:
        if variant.name == name:
            return variant
    raise KeyError(f"unknown variant {name!r}; known: {', '.join(variant_names())}")
