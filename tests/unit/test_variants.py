"""The path matrix (``pytest_eagle3.engine.variants``, ``variant_checks``, ``variant_matrix``,
``variant_proof``), ``--eagle3-list-variants`` and the ``reduced-dsv3`` preset."""

from __future__ import annotations

import importlib.util

import pytest

from pytest_eagle3.target.checkpoint.cache import cache_key
from pytest_eagle3.engine import variants as V
from pytest_eagle3.engine.gpus import normalize_arch
from pytest_eagle3.engine.variant_matrix import format_matrix, matrix
from pytest_eagle3.engine.variant_proof import path_not_exercised, path_not_taken, prefill_rows
from pytest_eagle3.sglang_source.install import SGLangInstall
from pytest_eagle3.settings import default_cache_dir

#: Every flag the variants use, as SGLang 0.5.23 spells them (a fake install).
FLAGS_0523 = frozenset({
    "model-path", "tp-size", "chunked-prefill-size", "disable-radix-cache", "attn-dp-size",
    "dp-size", "enable-dp-attention", "enable-dp-lm-head", "moe-dense-tp-size",
    "enable-attn-tp-input-scattered", "flashinfer-allreduce-fusion-backend",
    "enable-flashinfer-allreduce-fusion", "enforce-disable-flashinfer-allreduce-fusion",
    "cuda-graph-backend-decode", "cuda-graph-backend-prefill", "disable-cuda-graph",
    "enable-two-batch-overlap", "enable-single-batch-overlap", "moe-a2a-backend", "deepep-dispatcher-output-dtype",
    "boundary-reduction",
})
#: An older SGLang / fork: no --attn-dp-size, no --flashinfer-allreduce-fusion-backend,
#: no --cuda-graph-backend-*, no --boundary-reduction.
FLAGS_OLD = FLAGS_0523 - {"attn-dp-size", "flashinfer-allreduce-fusion-backend",
                          "cuda-graph-backend-decode", "cuda-graph-backend-prefill", "boundary-reduction"}

ON_CPU = {"plain", "decode", "chunked-prefill", "unchunked-prefill", "radix-cache-hit", "batch",
          "ids-at-first-k-dense", "ids-last-capturable", "single-batch-overlap"}


def fake_install(flags: frozenset[str] = FLAGS_0523, version: str = "0.5.23") -> SGLangInstall:
    return SGLangInstall(version=version, location="/fake/sglang", flags=flags, python="python")


def reasons(install: SGLangInstall, device: str, tp: int, arch: str | None = None) -> dict[str, str | None]:
    return {v.name: reason for v, reason in matrix(install, device, tp, arch)}


# --- the matrix ---------------------------------------------------------------


def test_names_are_unique_and_cover_the_issue() -> None:
    names = V.variant_names()
    assert len(names) == len(set(names))
    assert set(names) == {
        "plain", "decode", "chunked-prefill", "unchunked-prefill", "radix-cache-hit", "batch", "dp-attention",
        "dp-attention-all-reduce", "attn-tp-input-scattered", "allreduce-fusion-on", "allreduce-fusion-off",
        "cuda-graph-on", "cuda-graph-off", "two-batch-overlap", "single-batch-overlap", "ids-at-first-k-dense",
        "ids-last-capturable",
    }
    for variant in V.VARIANTS:
        assert variant.description and variant.source, variant.name


def test_cpu_tp1() -> None:
    got = reasons(fake_install(), "cpu", 1)
    assert {n for n, r in got.items() if r is None} == ON_CPU
    assert got["dp-attention"] == "DP attention needs TP>=2 (attn_dp_size = tp); this case runs at TP 1"
    assert got["allreduce-fusion-on"] == (
        "all-reduce fusion needs TP>1 and CUDA SM90/SM100 (on cpu: the stand-in of "
        "pytest_eagle3/worker/cpu/allreduce_fusion.py); this case runs at TP 1")
    assert got["cuda-graph-on"] == "CUDA graphs need CUDA; this run is cpu"
    assert got["two-batch-overlap"].endswith("; this case runs at TP 1")
    assert got["attn-tp-input-scattered"] == (
        "input-scattered attention needs TP>1 without DP attention; this case runs at TP 1")


@pytest.fixture
def without_cpu_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_eagle3.worker.cpu import fills

    monkeypatch.setattr(fills, "FILL_NAMES", frozenset())


@pytest.fixture
def with_dp_padding_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_eagle3.worker.cpu import fills

    monkeypatch.setattr(fills, "FILL_NAMES", fills.FILL_NAMES | {V.TORCH_NATIVE_DP_PADDING})


def test_cpu_tp2_dp_attention_needs_the_cpu_fix(without_cpu_fixes: None) -> None:
    got = reasons(fake_install(), "cpu", 2)
    assert {n for n, r in got.items() if r is None} == ON_CPU - {"single-batch-overlap"}
    assert "the CPU-tier fix 'sbo_streams'" in got["single-batch-overlap"]
    assert "the CPU-tier fix 'deepep_standin'" in got["two-batch-overlap"]
    assert "the CPU-tier fix 'input_scattered_platform'" in got["attn-tp-input-scattered"]
    assert got["dp-attention"] == (
        "DP attention needs TP>=2 (attn_dp_size = tp); on cpu it also needs the CPU-tier fix "
        "'torch_native_dp_padding', which this pytest-eagle3 lacks (sglang 0.5.23 pads DP batches "
        "in ForwardBatch._pad_inputs_to_size and asks the attention backend for "
        "get_cpu_graph_seq_len_fill_value, which torch_native lacks: AttributeError at the first forward)"
    )


def test_cpu_tp2(with_dp_padding_fix: None) -> None:
    got = reasons(fake_install(), "cpu", 2)
    assert {n for n, r in got.items() if r is None} == ON_CPU | {
        "dp-attention", "dp-attention-all-reduce", "two-batch-overlap", "attn-tp-input-scattered"}
    # The fake install has no add_norm.py: no fused path for the stand-in to serve.
    assert got["allreduce-fusion-off"].startswith(
        "all-reduce fusion off differs from plain only where fusion can run: "
        "TP>1 and CUDA SM90/SM100 (on cpu: the stand-in); on cpu the installed sglang 0.5.23")
    # Both reduce-scatter routes are proven from the workers' log lines (engine/route_proof.py).
    assert V.get_variant("dp-attention").reduce_scatter == ("DECODE", "dp_reduce_scatter")
    assert V.get_variant("attn-tp-input-scattered").reduce_scatter == ("EXTEND", "tp_reduce_scatter")


def test_cpu_tp2_fusion_pair_where_the_fused_path_is_installed(with_dp_padding_fix: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    monkeypatch.setattr(SGLangInstall, "fusion_code", lambda self: SimpleNamespace(refusal=None))
    got = reasons(fake_install(), "cpu", 2)
    assert {n for n, r in got.items() if r is None} == ON_CPU | {
        "dp-attention", "dp-attention-all-reduce", "two-batch-overlap", "allreduce-fusion-on", "allreduce-fusion-off",
        "attn-tp-input-scattered"}
    on, off = V.get_variant("allreduce-fusion-on"), V.get_variant("allreduce-fusion-off")
    # On cpu the stand-in's switch, not FlashInfer's flags; fusion on needs an engine, off is the capture engine.
    assert on.args_for(fake_install(), 2, "cpu") == {V.CPU_ALLREDUCE_FUSION: True}
    assert on.args_for(fake_install(), 2) == {"flashinfer_allreduce_fusion_backend": "auto"}
    assert on.own_engine("cpu") and not off.own_engine("cpu") and off.own_engine("cuda")
    assert on.pair == "allreduce-fusion-off"


def test_cuda_by_architecture() -> None:
    install = fake_install()
    hopper = reasons(install, "cuda", 8, "9.0")
    assert all(r is None for n, r in hopper.items() if n != "single-batch-overlap"), hopper
    assert hopper["single-batch-overlap"].endswith("this GPU is sm90")  # SGLang refuses SBO on SM90
    assert reasons(install, "cuda", 8, (10, 0))["single-batch-overlap"] is None
    assert reasons(install, "cuda", 8, "sm80")["single-batch-overlap"] is None
    ampere = reasons(install, "cuda", 8, "sm80")
    assert ampere["allreduce-fusion-on"].endswith("; this GPU is sm80")
    assert ampere["cuda-graph-on"] is None and ampere["two-batch-overlap"] is None
    assert reasons(install, "cuda", 2, (10, 3))["allreduce-fusion-on"] is None
    assert reasons(install, "cuda", 2, "12.0")["allreduce-fusion-on"].endswith("this GPU is sm120")
    unknown = reasons(install, "cuda", 2, None)
    assert unknown["allreduce-fusion-on"].endswith("the GPU architecture of this run is unknown")
    assert reasons(install, "cuda", 1, "9.0")["allreduce-fusion-on"].endswith("this case runs at TP 1")


def test_missing_flag_is_named() -> None:
    install = fake_install(FLAGS_0523 - {"chunked-prefill-size"}, version="0.4.0")
    reason = V.get_variant("chunked-prefill").requirements(install, "cpu", 1)
    assert reason == (
        "chunked prefill (chunk 16) needs --chunked-prefill-size; the installed sglang 0.4.0 "
        "(/fake/sglang) has no --chunked-prefill-size server argument"
    )
    # Flags are checked before hardware: a fork without the flag says so even on CPU.
    no_dp = fake_install(FLAGS_0523 - {"attn-dp-size", "enable-dp-attention"})
    reason = V.get_variant("dp-attention").requirements(no_dp, "cpu", 1)
    assert reason == (
        "DP attention needs TP>=2 (attn_dp_size = tp); the installed sglang 0.5.23 (/fake/sglang) "
        "has no --attn-dp-size server argument (nor the older --enable-dp-attention)"
    )


def test_older_spelling_is_used_when_the_new_one_is_missing() -> None:
    old = fake_install(FLAGS_OLD, version="0.5.9")
    assert V.get_variant("dp-attention").args_for(old, 4) == {
        "enable_dp_attention": True, "dp_size": 4, "enable_dp_lm_head": True, "moe_dense_tp_size": 1,
    }
    assert V.get_variant("allreduce-fusion-on").args_for(old, 2) == {"enable_flashinfer_allreduce_fusion": True}
    assert V.get_variant("cuda-graph-off").args_for(old, 1) == {"disable_cuda_graph": True}
    new = fake_install()
    assert V.get_variant("dp-attention").args_for(new, 2) == {
        "attn_dp_size": 2, "enable_dp_lm_head": True, "moe_dense_tp_size": 1,
    }
    assert V.get_variant("two-batch-overlap").args_for(new, 8)["enable_two_batch_overlap"] is True
    assert V.get_variant("plain").args_for(new, 1) == {}
    with pytest.raises(ValueError, match="has no --enable-two-batch-overlap server argument"):
        V.get_variant("two-batch-overlap").args_for(fake_install(FLAGS_0523 - {"enable-two-batch-overlap"}), 2)


def test_request_fields_and_ids() -> None:
    assert V.get_variant("decode").request["decode_steps"] > 0
    assert V.get_variant("radix-cache-hit").request["repeat"] == 2
    assert V.get_variant("batch").request["batch"] is True
    assert V.get_variant("chunked-prefill").server_args == {"chunked_prefill_size": V.CHUNK_SIZE}
    first_k = V.get_variant("ids-at-first-k-dense").ids
    last = V.get_variant("ids-last-capturable").ids
    assert first_k is not None and last is not None
    assert first_k(8, 1) == (0, 1, 2) and first_k(4, 3) == (0, 3) and first_k(6, 0) == (0, 1)
    assert last(8, 1) == (0, 4, 7) and last(4, 1) == (0, 2, 3)
    with pytest.raises(KeyError, match="known: plain, decode"):
        V.get_variant("nope")


@pytest.mark.parametrize(("text", "want"), [
    ("sm90", "sm90"), ("sm_100", "sm100"), ("9.0", "sm90"), ("10.3", "sm103"), ("90", "sm90"),
    ((8, 0), "sm80"), (None, None), ("hopper", None), ("9.x", None),
])
def test_normalize_arch(text: object, want: str | None) -> None:
    assert normalize_arch(text) == want  # type: ignore[arg-type]


def test_format_matrix(with_dp_padding_fix: None) -> None:
    text = format_matrix(fake_install(), "cpu", 2)
    lines = text.splitlines()
    assert lines[0] == "eagle3 variants for sglang 0.5.23 (/fake/sglang), device cpu, tp 2:"
    assert "attn_dp_size=2 enable_dp_lm_head=True moe_dense_tp_size=1" in text
    # + DP attention, its all-reduce pair, TBO, input-scattered
    assert lines[-1] == f"{len(ON_CPU) + 4} of {len(V.VARIANTS)} variants run here"


# --- against the installed SGLang --------------------------------------------

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")


@needs_sglang
def test_every_variant_flag_is_accepted_by_the_installed_sglang() -> None:
    from pytest_eagle3.sglang_source.install import probe

    install = probe(default_cache_dir()[0])
    for variant in V.VARIANTS:
        spelling = variant.spelling_for(install)
        assert spelling is not None, variant.requirements(install, "cuda", 8, "9.0")
        if spelling is not variant.server_args:  # pragma: no cover - depends on the install
            pytest.fail(f"{variant.name}: {install.describe()} lacks the preferred spelling "
                        f"{dict(variant.server_args)}")


@needs_sglang
def test_list_variants_option(pytester: pytest.Pytester, clean_eagle3_env: None) -> None:
    pytester.makepyfile("def test_never_runs(): raise AssertionError('ran')")
    cache = str(default_cache_dir()[0])
    result = pytester.runpytest_subprocess("--eagle3-list-variants", "--tp", "2", "--device", "cpu",
                                           "--eagle3-cache", cache, "-p", "no:cacheprovider")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "eagle3 variants for sglang *, device cpu, tp 2:",
        "  plain  *",
        "*-> runs",
        "  radix-cache-hit  *",
        "*-> runs",
        # "runs" says only what collection keeps: an engine of its own needs --eagle3-slow on cpu.
        "  dp-attention * attn_dp_size=2 enable_dp_lm_head=True moe_dense_tp_size=1*",
        "*-> left out of this run: needs an SGLang engine of its own (minutes on cpu); run with --eagle3-slow",
        "  allreduce-fusion-on  *pytest_eagle3_cpu_allreduce_fusion=True",
        "*-> left out of this run: needs an SGLang engine of its own (minutes on cpu); run with --eagle3-slow",
        "  allreduce-fusion-off  *pytest_eagle3_cpu_allreduce_fusion=False",
        "*-> runs",
        "6 of 17 variants run here",
    ])
    assert "test_never_runs" not in result.stdout.str()
    assert "passed" not in result.stdout.str() and "collected" not in result.stdout.str()


def test_list_variants_without_sglang(pytester: pytest.Pytester, clean_eagle3_env: None) -> None:
    # A shadowing package that fails on import stands for a broken install.
    fork = pytester.mkpydir("sglang")
    (fork / "launch_server.py").write_text("raise ImportError('broken fork')\n")
    result = pytester.runpytest_subprocess("--eagle3-list-variants", "--eagle3-cache",
                                           str(pytester.path / "cache"), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --eagle3-list-variants: SGLang * fails to start: *broken fork*"])


# --- reduced-dsv3 ---------------------------------------------------------------


def test_reduced_dsv3_has_production_widths() -> None:
    from pytest_eagle3.target.checkpoint.dsv3_config import Dims
    from pytest_eagle3.target.spec import TargetSpec, list_presets, resolve_target

    assert "reduced-dsv3" in list_presets()
    spec = resolve_target("reduced-dsv3")
    assert isinstance(spec, TargetSpec)
    cfg = spec.config
    production = {
        "hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
        "first_k_dense_replace": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    }
    assert {k: cfg[k] for k in production} == production
    assert cfg["torch_dtype"] == "bfloat16" and cfg["rope_scaling"]["type"] == "yarn"
    assert spec.facts.num_layers == 4 and cfg["moe_intermediate_size"] >= 128
    assert all(spec.facts.num_attention_heads % tp == 0 for tp in (1, 2, 4, 8))
    assert spec.init.pinned_experts >= cfg["num_experts_per_tok"]
    # The prompts fixture (ids < 2048, stratified over 8 shards) covers every vocab shard.
    assert cfg["vocab_size"] == 2048
    # The checkpoint builder accepts the layout (no torch needed for this check).
    dims = Dims.from_config(cfg)
    assert [dims.is_moe(i) for i in range(dims.layers)] == [False, True, True, True]
    assert cache_key(spec) != cache_key(resolve_target("tiny-dsv3"))  # type: ignore[union-attr]


@pytest.mark.parametrize(("T", "info", "repeat", "rows"), [
    (13, {"chunked_prefill_size": 4096, "disable_radix_cache": True, "page_size": 1}, 1, 13),
    (13, {"chunked_prefill_size": 8, "disable_radix_cache": True, "page_size": 1}, 1, 5),
    (16, {"chunked_prefill_size": 8, "disable_radix_cache": True, "page_size": 1}, 1, 8),
    (9, {"chunked_prefill_size": 8, "disable_radix_cache": True, "page_size": 1}, 1, 1),
    (13, {"chunked_prefill_size": -1, "disable_radix_cache": True, "page_size": 1}, 1, 13),
    (13, {"chunked_prefill_size": 4096, "disable_radix_cache": False, "page_size": 1}, 2, 1),
    (13, {"chunked_prefill_size": 4096, "disable_radix_cache": False, "page_size": 64}, 2, 13),
    (70, {"chunked_prefill_size": 4096, "disable_radix_cache": False, "page_size": 64}, 2, 6),
    (13, {"chunked_prefill_size": 4096, "disable_radix_cache": False, "page_size": 1}, 1, 13),
    (13, {"chunked_prefill_size": 4096, "disable_radix_cache": True, "page_size": 1}, 2, 13),
    # a hybrid linear-attention model's cache matches at chunk boundaries only (measured, chunk 16)
    (5, {"chunked_prefill_size": 16, "disable_radix_cache": False, "page_size": 1,
         "uses_mamba_radix_cache": True, "mamba_radix_cache_strategy": "no_buffer"}, 2, 5),
    (23, {"chunked_prefill_size": 16, "disable_radix_cache": False, "page_size": 1,
          "uses_mamba_radix_cache": True, "mamba_radix_cache_strategy": "no_buffer"}, 2, 7),
    (23, {"chunked_prefill_size": -1, "disable_radix_cache": False, "page_size": 1,
          "uses_mamba_radix_cache": True, "mamba_radix_cache_strategy": "no_buffer"}, 2, 23),
    (23, {"chunked_prefill_size": 16, "disable_radix_cache": False, "page_size": 1,
          "uses_mamba_radix_cache": False, "mamba_radix_cache_strategy": "auto"}, 2, 1),
])
def test_prefill_rows_follow_the_engines_resolved_settings(T, info, repeat, rows) -> None:
    assert prefill_rows(T, info, repeat=repeat) == rows


def test_a_flag_sglang_resolved_away_means_the_path_was_not_taken() -> None:
    info = {"chunked_prefill_size": 4096, "enable_dp_attention": True, "dp_size": 2, "disable_cuda_graph": True}
    assert path_not_taken("dp-attention", {"enable_dp_attention": True, "dp_size": 2}, info) is None
    assert path_not_taken("x", {"not_reported": 3}, info) is None
    msg = path_not_taken("chunked-prefill", {"chunked_prefill_size": 8}, info)
    assert msg == ("chunked-prefill: path not taken: the engine was started with chunked_prefill_size=8, but "
                   "SGLang's /server_info reports chunked_prefill_size=4096 (it resolved the flag away; "
                   "nothing was verified)")
    assert "disable_cuda_graph=True" in path_not_taken("cuda-graph-on", {"disable_cuda_graph": False}, info)


def test_a_row_shaping_path_that_changed_no_rows_was_not_exercised() -> None:
    info = {"chunked_prefill_size": 8, "disable_radix_cache": True, "page_size": 1}
    assert path_not_exercised("chunked-prefill", {"chunked_prefill_size": 8}, 1, [9, 13], info) is None
    msg = path_not_exercised("chunked-prefill", {"chunked_prefill_size": 8}, 1, [5, 8], info)
    assert msg.startswith("chunked-prefill: path not exercised: with SGLang's resolved chunked_prefill_size=8, "
                          "page_size=1, every prompt (5..8 tokens)")
    radix = {"chunked_prefill_size": 4096, "disable_radix_cache": False, "page_size": 64}
    assert path_not_exercised("radix-cache-hit", {"disable_radix_cache": False}, 2, [13, 40], radix) is not None
    assert path_not_exercised("radix-cache-hit", {"disable_radix_cache": False}, 2, [13, 70], radix) is None
    assert path_not_exercised("plain", {}, 1, [3], info) is None


def test_cuda_graphs_must_be_engaged_not_only_asked_for() -> None:
    """sglang 0.5.23 echoes --cuda-graph-backend-decode as given; the backend it uses
    is the resolved cuda_graph_config.decode.backend ('disabled' on cpu)."""
    on = V.get_variant("cuda-graph-on")
    info = {"cuda_graph_backend_decode": "full", "cuda_graph_config": {"decode": {"backend": "disabled"}}}
    msg = path_not_taken(on.name, dict(on.server_args), info, on.engaged)
    assert msg == ("cuda-graph-on: path not taken: SGLang's /server_info reports "
                   "cuda_graph_config.decode.backend='disabled', the path needs != 'disabled' (nothing was verified)")
    info["cuda_graph_config"]["decode"]["backend"] = "full"
    assert path_not_taken(on.name, dict(on.server_args), info, on.engaged) is None
    off = V.get_variant("cuda-graph-off")
    assert path_not_taken(off.name, {}, info, off.engaged) is not None
    assert path_not_taken(on.name, {}, {}, on.engaged) is None  # an SGLang that does not report it


def test_radix_hits_and_chunked_prefill_ride_on_the_wide_case_s_engine() -> None:
    # The default run takes both paths on an engine it starts anyway: on cpu the
    # wide case's engine chunks and keeps its radix cache; on cuda (page sizes up
    # to 64 reject chunk 16) only the radix cache is shared.
    install = fake_install(FLAGS_0523)
    assert V.shared_engine_args(install, "cpu", 2) == {"disable_radix_cache": False,
                                                        "chunked_prefill_size": V.CHUNK_SIZE}
    assert V.shared_engine_args(install, "cuda", 2) == {"disable_radix_cache": False}
    assert not V.get_variant("radix-cache-hit").own_engine("cpu")
    assert not V.get_variant("chunked-prefill").own_engine("cpu")
    assert V.get_variant("chunked-prefill").own_engine("cuda")
    assert V.get_variant("ids-at-first-k-dense").own_engine("cpu")
    assert V.shared_engine_args(fake_install(FLAGS_0523 - {"chunked-prefill-size"}), "cpu", 1) == {
        "disable_radix_cache": False}
