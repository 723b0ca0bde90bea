"""The path matrix: server-arg and request variants the capture tests run under.

Each :class:`Variant` names one SGLang code path that can change what the aux
hidden states capture (issue 4, "Path matrix"): how the engine is started
(``server_args``), how the test talks to it (``request``), or which layer ids
it asks for (``ids``).  Every variant is compared with the plain TP run of the
same checkpoint, i.e. with the transformers reference rows at the same
positions.

:meth:`Variant.requirements` says, before anything starts, whether a variant
can run here: the installed SGLang must accept its flags (read from its
``--help``, never from its version number) and the device, TP size and GPU
architecture must allow the path.  The answer is a precise skip reason or
``None``.  :func:`matrix` applies it to every variant; ``pytest
--eagle3-list-variants`` prints the result (:func:`format_matrix`).

Request fields (``Variant.request``), read by the variant tests:

* ``decode_steps`` (int): decode rows wanted per prompt.
* ``repeat`` (int): send each prompt this many times in a row; with the radix
  cache on, later sends hit the cache.  What SGLang 0.5.23 returns then
  (measured on CPU): only the rows it computed, i.e. the uncached suffix.  The
  matched prefix is capped at ``T - 1`` tokens (``Req._compute_max_prefix_len``)
  and rounded down to ``page_size``, so a repeat of a ``T``-token prompt at
  page size 1 returns one row, position ``T - 1``; a prompt sharing its first
  ``k`` tokens with an earlier one returns rows ``k .. T-1``.  Compare the
  ``n`` returned rows with reference rows ``T - n .. T - 1``; decode rows
  follow as usual.
* ``batch`` (bool): all prompts in one batched ``/generate`` request.

Chunked prefill returns only the last chunk (measured on CPU, sglang 0.5.23):
middle chunks' rows are not stored (``batch_result_processor`` commits output
only when ``req.inflight_middle_chunks <= 0``), so a ``T``-token prompt with
chunk size ``C`` returns ``T - C * ((T - 1) // C)`` rows, positions
``C * ((T - 1) // C) .. T - 1``.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TextIO

from pytest_eagle3.engine.gpus import detect_gpu_arch, normalize_arch
from pytest_eagle3.worker.cpu import patches
from pytest_eagle3.sglang_source import install as sglang_install
from pytest_eagle3.errors import Eagle3Error

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.engine.options import EngineOptions


class _TpSize:
    """Placeholder for the run's TP size inside ``server_args`` (``attn_dp_size=TP``)."""

    def __repr__(self) -> str:
        return "TP"


#: Replaced by the run's TP size in :meth:`Variant.args_for`.
TP = _TpSize()

#: Chunk size of the ``chunked-prefill`` variant: shorter than every suite
#: prompt of 9+ tokens.  SGLang's only lower bound is divisibility by
#: ``page_size`` (``validation_hook.check_server_args``); page size is 1 on CPU
#: and on most CUDA MLA backends, but 32/64 with trtllm_mla, cutedsl_mla and
#: flashmla, where 8 is rejected at startup.
CHUNK_SIZE = 8

#: The CPU-tier fix DP attention needs on ``torch_native`` (measured: with it, sglang
#: 0.5.23 serves DP attention at TP 2 on CPU and the captures match the reference).
TORCH_NATIVE_DP_PADDING = "torch_native_dp_padding"

#: GPU architectures, as ``sm<major><minor>`` (``sm10x``: any compute capability 10.x).
SM90 = "sm90"
SM10X = "sm10x"

# Reason templates (tests import these).  {summary}: the variant's Needs.summary.
MSG_NO_FLAG = "{summary}; the installed {sglang} has {flags}"
MSG_DEVICE = "{summary}; this run is {device}"
MSG_TP = "{summary}; this run is tp {tp}"
MSG_ARCH = "{summary}; this GPU is {arch}"
MSG_ARCH_UNKNOWN = "{summary}; the GPU architecture of this run is unknown"
MSG_CPU_FIX = "{summary}; on cpu it also needs the CPU-tier fix {fix!r}, which this pytest-eagle3 lacks ({why})"

LIST_HEADER = "eagle3 variants for {sglang}, device {device}, tp {tp}{arch}:"
LIST_RUNS = "runs"
LIST_SKIPPED = "skipped: {reason}"


@dataclass(frozen=True)
class Needs:
    """What a variant needs to run.

    Attributes:
        summary: one clause naming the needs, the start of every skip reason
            (``"all-reduce fusion needs CUDA SM90/SM100 and TP>1"``).
        devices: devices the path exists on (``"cpu"``, ``"cuda"``).
        min_tp: smallest TP size that enters the path.
        gpu_archs: on CUDA, the architectures that enter it (:data:`SM90`,
            :data:`SM10X`); empty: any.
        cpu_fix: on CPU, the name of a CPU-tier fix the path needs, looked up
            in ``pytest_eagle3.worker.cpu.patches.FIXES`` (``""``: none).
        cpu_fix_why: what goes wrong on CPU without it.
    """

    summary: str = ""
    devices: tuple[str, ...] = ("cpu", "cuda")
    min_tp: int = 1
    gpu_archs: tuple[str, ...] = ()
    cpu_fix: str = ""
    cpu_fix_why: str = ""


NO_NEEDS = Needs()


@dataclass(frozen=True)
class Variant:
    """One path of the matrix.

    Attributes:
        name: stable id, used in test ids (``dp-attention``).
        description: what the path does to the captures and what the test checks.
        server_args: extra server arguments in the preferred spelling (names with
            underscores; :data:`TP` stands for the run's TP size).  ``{}``: the
            plain engine.
        needs: device, TP and architecture needs (:class:`Needs`).
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

    def spellings(self) -> tuple[Mapping[str, Any], ...]:
        """``server_args`` and then each alternative."""
        return (self.server_args, *self.alternatives)

    def spelling_for(self, install: "SGLangInstall") -> Mapping[str, Any] | None:
        """The first spelling whose every flag ``install`` accepts (``None``: none does)."""
        for args in self.spellings():
            if all(install.has_arg(name) for name in args):
                return args
        return None

    def args_for(self, install: "SGLangInstall", tp: int) -> dict[str, Any]:
        """Server arguments for ``install`` at ``tp`` (:data:`TP` replaced).

        Raises:
            ValueError: ``install`` accepts no spelling (check :meth:`requirements` first).
        """
        args = self.spelling_for(install)
        if args is None:
            raise ValueError(MSG_NO_FLAG.format(summary=self.needs.summary or self.name,
                                                sglang=install.describe(), flags=_missing_flags(self, install)))
        return {k: (tp if v is TP else v) for k, v in args.items()}

    def requirements(self, install: "SGLangInstall", device: str, tp: int,
                     gpu_arch: str | Sequence[int] | None = None) -> str | None:
        """Why this variant cannot run here, or ``None`` when it can.

        Checks, in order: the installed SGLang's flags, the device, the TP size,
        the GPU architecture (``"sm90"``, ``"9.0"``, ``(9, 0)``; ``None``: unknown).
        """
        needs = self.needs
        summary = needs.summary or f"{self.name} needs no more than the plain engine"
        if self.spelling_for(install) is None:
            return MSG_NO_FLAG.format(summary=summary, sglang=install.describe(),
                                      flags=_missing_flags(self, install))
        if device not in needs.devices:
            return MSG_DEVICE.format(summary=summary, device=device)
        if tp < needs.min_tp:
            return MSG_TP.format(summary=summary, tp=tp)
        if device == "cpu" and needs.cpu_fix and needs.cpu_fix not in cpu_tier_fixes():
            return MSG_CPU_FIX.format(summary=summary, fix=needs.cpu_fix, why=needs.cpu_fix_why)
        if device == "cuda" and needs.gpu_archs:
            arch = normalize_arch(gpu_arch)
            if arch is None:
                return MSG_ARCH_UNKNOWN.format(summary=summary)
            if not _arch_matches(arch, needs.gpu_archs):
                return MSG_ARCH.format(summary=summary, arch=arch)
        return None


def _missing_flags(variant: Variant, install: "SGLangInstall") -> str:
    """``no --a server argument`` / ``no --a, --b server arguments``, plus
    ``(nor the older --c)`` for what the alternative spellings lack."""

    def missing(args: Mapping[str, Any]) -> list[str]:
        return ["--" + name.replace("_", "-") for name in args if not install.has_arg(name)]

    first = missing(variant.server_args)
    older: list[str] = []
    for args in variant.alternatives:
        older += [flag for flag in missing(args) if flag not in first and flag not in older]
    text = f"no {', '.join(first)} server argument{'s' if len(first) > 1 else ''}"
    return text + (f" (nor the older {', '.join(older)})" if older else "")


def cpu_tier_fixes() -> frozenset[str]:
    """Names of the fixes the CPU tier installs in SGLang's processes
    (``pytest_eagle3.worker.cpu.patches.FIXES``; empty when it names none)."""

    return frozenset(getattr(patches, "FIXES", ()))


def _arch_matches(arch: str, wanted: tuple[str, ...]) -> bool:
    # sm10x: compute capability 10.x (SGLang's is_sm100 covers SM100/SM103).
    return any(arch == w or (w == SM10X and arch.startswith("sm10") and len(arch) == 5) for w in wanted)


# --- the variants ---------------------------------------------------------

_DP_ATTENTION = MappingProxyType({
    "attn_dp_size": TP, "enable_dp_lm_head": True, "moe_dense_tp_size": 1,
})
# SGLang versions and forks without --attn-dp-size (deprecated in 0.5.23, removal after 2026-12-31).
_DP_ATTENTION_LEGACY = MappingProxyType({
    "enable_dp_attention": True, "dp_size": TP, "enable_dp_lm_head": True, "moe_dense_tp_size": 1,
})


def ids_at_first_k_dense(num_layers: int, first_k_dense: int) -> tuple[int, ...]:
    """``(0, k, k+1)`` for ``k = first_k_dense_replace``, inside ``0 .. L-1``.

    The input of layer ``k`` is the last dense layer's output, the input of
    ``k+1`` the first MoE layer's output (the all-gather boundary of PR #14280).
    The list starts with 0 so SGLang 0.5.23's "+1 when the first id is 1" rule
    does not shift it.
    """
    ids = [0, first_k_dense, first_k_dense + 1]
    return tuple(sorted({i for i in ids if 0 <= i < num_layers}))


def ids_last_capturable(num_layers: int, first_k_dense: int) -> tuple[int, ...]:
    """``(0, L//2, L-1)``: the input of the last layer is the deepest id SGLang
    captures (``i >= L`` never is)."""
    return tuple(sorted({0, num_layers // 2, num_layers - 1}))


VARIANTS: tuple[Variant, ...] = (
    Variant(
        name="plain",
        description="the baseline engine: radix cache off, no chunking of the suite prompts, "
        "default parallel paths; prefill rows only",
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
        "C*((T-1)//C) .. T-1), compare those",
        server_args=MappingProxyType({"chunked_prefill_size": CHUNK_SIZE}),
        needs=Needs(summary=f"chunked prefill (chunk {CHUNK_SIZE}) needs --chunked-prefill-size"),
        source="srt/arg_groups/validation_hook.py check_server_args (chunk % page_size == 0); "
        "batch_result_processor.py (middle chunks not stored)",
    ),
    Variant(
        name="radix-cache-hit",
        description="radix cache on; each prompt is sent twice: the second send returns only "
        "the uncached rows (1 row, position T-1, at page size 1), compare them with the "
        "reference rows at the same positions",
        server_args=MappingProxyType({"disable_radix_cache": False}),
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
        description="attention data-parallel across the TP group (one scheduler per DP rank), "
        "dense FFN fully data-parallel (moe_dense_tp_size=1), vocab-parallel LM head per "
        "attention group; MoE inputs are gathered and reduce-scattered; captured rows must "
        "come back gathered",
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
        "handle_data_parallelism, handle_deprecated_dp_attention; PR #14280",
    ),
    Variant(
        name="attn-tp-input-scattered",
        description="attention input scattered across TP ranks in prefill (reduce-scatter "
        "instead of all-reduce); captured rows must be gathered back to full rows",
        server_args=MappingProxyType({"enable_attn_tp_input_scattered": True}),
        needs=Needs(
            summary="input-scattered attention needs CUDA (or NPU) and TP>1 without DP "
            "attention (AttnTpContext.init_context silently keeps it off elsewhere)",
            devices=("cuda",), min_tp=2,
        ),
        source="srt/layers/layer_boundary/adapters/attention.py AttnTpContext; "
        "layer_boundary/layout.py input_scattered_configured",
    ),
    Variant(
        name="allreduce-fusion-on",
        description="FlashInfer all-reduce fused into the next layer's add+RMSNorm: the MLP "
        "all-reduce is deferred, a capture read before it sees per-rank partial sums "
        "(sglang auto-enables it for DeepSeek-V3 on SM90/SM100 at TP>1, so plain is the same path there)",
        server_args=MappingProxyType({"flashinfer_allreduce_fusion_backend": "auto"}),
        alternatives=(MappingProxyType({"enable_flashinfer_allreduce_fusion": True}),),
        needs=Needs(summary="all-reduce fusion needs CUDA SM90/SM100 and TP>1",
                    devices=("cuda",), min_tp=2, gpu_archs=(SM90, SM10X)),
        source="PR #28343; srt/layers/layer_boundary/residual/add_norm.py flashinfer_ar_fusion_applies "
        "(<= 2048 tokens, no DP attention); srt/arg_groups/overrides.py auto-enable",
    ),
    Variant(
        name="allreduce-fusion-off",
        description="FlashInfer all-reduce fusion forced off: the contrast to allreduce-fusion-on "
        "on hardware where sglang would enable it by default",
        server_args=MappingProxyType({"enforce_disable_flashinfer_allreduce_fusion": True}),
        needs=Needs(summary="all-reduce fusion off differs from plain only where fusion can run: "
                    "CUDA SM90/SM100 and TP>1", devices=("cuda",), min_tp=2, gpu_archs=(SM90, SM10X)),
        source="srt/arg_groups/overrides.py _enforce_disable_allreduce_fusion",
    ),
    Variant(
        name="cuda-graph-on",
        description="decode replayed from CUDA graphs: the aux layers must be set before graph "
        "capture; the test asks for decode rows",
        server_args=MappingProxyType({"cuda_graph_backend_decode": "full"}),
        alternatives=(MappingProxyType({"disable_cuda_graph": False}),),
        request=MappingProxyType({"decode_steps": 4}),
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
        description="two micro-batches overlapped on top of DP attention; layers from "
        "first_k_dense_replace on run through model_forward_stages (deepseek_v2.py), a "
        "different capture path; the test sends a batch",
        server_args=MappingProxyType({**_DP_ATTENTION, "enable_two_batch_overlap": True}),
        alternatives=(MappingProxyType({**_DP_ATTENTION_LEGACY, "enable_two_batch_overlap": True}),),
        request=MappingProxyType({"batch": True, "decode_steps": 2}),
        needs=Needs(summary="two-batch overlap needs CUDA (streams and events, "
                    "dp_attention.get_dp_tbo_comm_stream) and DP attention at TP>=2",
                    devices=("cuda",), min_tp=2),
        source="srt/arg_groups/validation_hook.py check_two_batch_overlap; "
        "srt/batch_overlap/two_batch_overlap.py model_forward_stages",
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


def prefill_rows(prompt_len: int, server_info: Mapping[str, Any], *, repeat: int = 1) -> int:
    """Prefill rows SGLang returns for the last of ``repeat`` sends of a
    ``prompt_len``-token prompt, from the engine's own resolved settings
    (``/server_info``: ``chunked_prefill_size``, ``disable_radix_cache``,
    ``page_size``), as measured on sglang 0.5.23 (module docstring):

    * a radix-cache hit (cache on, ``repeat > 1``) returns the uncached tail:
      the matched prefix is ``page_size * ((T - 1) // page_size)`` tokens
      (``Req._compute_max_prefix_len``);
    * chunked prefill returns the last chunk: ``T - C * ((T - 1) // C)`` rows;
    * otherwise all ``T`` rows.
    """
    T = int(prompt_len)
    page = max(1, int(server_info.get("page_size") or 1))
    if repeat > 1 and not server_info.get("disable_radix_cache", True):
        return T - page * ((T - 1) // page)
    chunk = server_info.get("chunked_prefill_size")
    if chunk is not None and int(chunk) > 0:
        return T - int(chunk) * ((T - 1) // int(chunk))
    return T


MSG_PATH_OFF = ("{variant}: path not taken: the engine was started with {asked}, but SGLang's "
                "/server_info reports {got} (it resolved the flag away; nothing was verified)")


MSG_NOT_ENGAGED = ("{variant}: path not taken: SGLang's /server_info reports {key}={got!r}, "
                   "the path needs {op} {value!r} (nothing was verified)")


def path_not_taken(variant: str, server_args: Mapping[str, Any], server_info: Mapping[str, Any],
                   engaged: Sequence[tuple[str, str, Any]] = ()) -> str | None:
    """Why the engine did not enter the variant's path, from ``/server_info``
    (SGLang's resolved server args, ``build_server_info`` in
    ``srt/utils/common.py``), or ``None`` when every server arg the variant set
    is in effect and every ``engaged`` rule holds (:attr:`Variant.engaged`).
    An arg or key ``/server_info`` does not report is not judged."""
    for name, asked in server_args.items():
        if name not in server_info:
            continue
        got = server_info[name]
        if got != asked and not (isinstance(asked, bool) and bool(got) == asked):
            return MSG_PATH_OFF.format(variant=variant, asked=f"{name}={asked!r}", got=f"{name}={got!r}")
    for key, op, value in engaged:
        node: Any = server_info
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, Mapping) else _ABSENT
        if node is _ABSENT:
            continue
        if (node == value) != (op == "=="):
            return MSG_NOT_ENGAGED.format(variant=variant, key=key, got=node, op=op, value=value)
    return None


_ABSENT = object()


MSG_NOT_EXERCISED = ("{variant}: path not exercised: with SGLang's resolved {settings}, every prompt "
                     "({lengths} tokens) returns all its rows, as without the path (nothing was verified)")


def path_not_exercised(variant: str, server_args: Mapping[str, Any], repeat: int, prompt_lens: Sequence[int],
                       server_info: Mapping[str, Any]) -> str | None:
    """Why a row-shaping path (chunked prefill, a radix-cache hit) changed no
    prompt's rows, or ``None``: e.g. every prompt fits in one chunk, or the KV
    page (``page_size``, 64 with trtllm_mla) is longer than every prompt."""
    if repeat <= 1 and "chunked_prefill_size" not in server_args:
        return None
    if any(prefill_rows(T, server_info, repeat=repeat) < T for T in prompt_lens):
        return None
    settings = ", ".join(f"{k}={server_info.get(k)!r}" for k in ("chunked_prefill_size", "page_size"))
    return MSG_NOT_EXERCISED.format(variant=variant, settings=settings,
                                    lengths=f"{min(prompt_lens)}..{max(prompt_lens)}")


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


def matrix(install: "SGLangInstall", device: str, tp: int,
           gpu_arch: str | Sequence[int] | None = None) -> list[tuple[Variant, str | None]]:
    """Every variant with its skip reason here (``None``: it runs), in :data:`VARIANTS` order."""
    return [(v, v.requirements(install, device, tp, gpu_arch)) for v in VARIANTS]


def _format_args(variant: Variant, install: "SGLangInstall", tp: int) -> str:
    args = variant.spelling_for(install) or variant.server_args
    parts = [f"{k}={tp if v is TP else v!r}" for k, v in args.items()]
    parts += [f"request.{k}={v!r}" for k, v in variant.request.items()]
    if variant.ids is not None:
        parts.append(f"ids={variant.ids.__name__}(L, first_k_dense_replace)")
    return " ".join(parts) or "-"


def format_matrix(install: "SGLangInstall", device: str, tp: int,
                  gpu_arch: str | Sequence[int] | None = None) -> str:
    """The matrix as text: a header, then ``name  args  runs|skipped: reason`` per variant."""
    rows = matrix(install, device, tp, gpu_arch)
    arch = normalize_arch(gpu_arch)
    lines = [LIST_HEADER.format(sglang=install.describe(), device=device, tp=tp,
                                arch=f", {arch}" if device == "cuda" and arch else "")]
    width = max(len(v.name) for v, _ in rows)
    for variant, reason in rows:
        verdict = LIST_RUNS if reason is None else LIST_SKIPPED.format(reason=reason)
        lines.append(f"  {variant.name:<{width}}  {_format_args(variant, install, tp)}")
        lines.append(f"  {'':<{width}}  -> {verdict}")
    runs = sum(1 for _, reason in rows if reason is None)
    lines.append(f"{runs} of {len(rows)} variants run here")
    return "\n".join(lines) + "\n"


def list_variants(settings: "EngineOptions", *, out: TextIO | None = None) -> int:
    """``--eagle3-list-variants``: write :func:`format_matrix` for the run's
    device and TP to ``out`` (stdout) and return exit code 0.

    Needs the SGLang flag probe (cached per install in the eagle3 cache).

    Raises:
        pytest.UsageError: SGLang is missing or its ``--help`` fails (one line).
    """
    import pytest

    try:
        install = sglang_install.probe(settings.cache_dir)
    except Eagle3Error as exc:
        raise pytest.UsageError(f"--eagle3-list-variants: {exc}") from None
    arch = detect_gpu_arch() if settings.device == "cuda" else None
    (out or sys.stdout).write(format_matrix(install, settings.device, settings.tp, arch))
    return 0
