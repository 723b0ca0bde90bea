"""``--eagle3-plan``: a GPU run reviewed on this CPU machine, nothing started.

The packaged suite at ``--device cuda --tp 8`` must list exactly the capture
engines its id-list cases start (one per id list at TP 1, the wide case at TP 2,
4 and 8), on the one block of 8 pretended GPUs, account for every selected test,
and run none.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from pytest_eagle3.plugin import plan
# Imported here, before any pytester snapshot: pytester drops modules first
# imported during a test from sys.modules, and a later import would load a copy
# that a monkeypatch of the first does not reach.
from pytest_eagle3.sglang_source import install
from pytest_eagle3.planning import collect, declare, request
from pytest_eagle3.plugin.resolve import MSG_PLAN_GPUS_ALONE
from pytest_eagle3.settings import default_cache_dir
from pytest_eagle3.target.spec import TargetSpec

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")

#: The user's cache, read before clean_eagle3_env hides it: the SGLang flag list
#: is cached there (``launch_server --help`` takes seconds); nothing else is written.
CACHE = str(default_cache_dir()[0])

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")

SUMMARY = re.compile(r"^nothing was started: (\d+) engine\(s\) for (\d+) selected test\(s\); (\d+) skipped; "
                     r"(\d+) decided at run time; (\d+) without an engine$")
#: Server args the capture of an id list sets; an engine with others is a variant's.
CAPTURE_ARGS = {"enable_return_aux_hidden_states", "speculative_algorithm", "return_aux_hidden_state_layer_ids"}
ENGINE_LINE = re.compile(r"^engine \d+: (tp\d+-cuda-[0-9a-f]{10}) \(TP (\d)\) for (\d+) test\(s\)$")


def expected_engines() -> set[tuple[int, tuple[int, ...] | None]]:
    """``(tp, ids)`` of every capture engine the suite starts at --tp 8 on cuda
    with no server args beyond the capture ones, from the suite's declarations
    (id-list cases, path variants)."""
    from pytest_eagle3.engine.variants import VARIANTS
    from pytest_eagle3.settings import GpuProbe, Settings

    facts = TargetSpec.preset("gpu-dsv3").facts
    sglang = install.probe(CACHE)
    settings = Settings(tp=8, device="cuda", gpu=GpuProbe(8, "test"), plan=True)
    out: set[tuple[int, tuple[int, ...] | None]] = set()
    for need in declare.case_needs() + declare.variant_needs(VARIANTS):
        for tp in (1, 2, 4, 8):
            ctx = declare.NeedContext(settings, tp, sglang, facts)
            if collect.collect_reason(need, ctx) is None and not request.resolve(need, ctx).extra_args:
                out.add((tp, request.resolve(need, ctx).ids))
    return out


def planned_engines(lines: list[str]) -> dict[str, dict]:
    """name -> {"tp", "tests", "chosen", "env", "command", "nodeids"} parsed from the plan."""
    engines: dict[str, dict] = {}
    current = None
    for line in lines:
        match = ENGINE_LINE.match(line)
        if match:
            current = engines[match.group(1)] = {"tp": int(match.group(2)), "tests": int(match.group(3)),
                                                 "nodeids": []}
            continue
        if current is None:
            continue
        if not line.startswith("  "):
            current = None
        elif line.startswith("    "):
            current["nodeids"].append(line.strip())
        elif ": " in line:
            key, _, value = line.strip().partition(": ")
            current[key] = value
    return engines


@needs_sglang
def test_gpu_run_of_the_packaged_suite_is_planned_on_cpu(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_eagle3.suite", "--device", "cuda", "--tp", "8", "--eagle3-plan",
        f"--eagle3-cache={CACHE}", "-p", "no:cacheprovider",
    )
    out = result.stdout.str()
    assert result.ret == 0, out + result.stderr.str()
    result.stdout.fnmatch_lines([
        "*= eagle3 plan =*",
        "nothing was started: * engine(s) for * selected test(s); * skipped; * decided at run time; 0 without an engine",
        "run: device cuda, --tp 8, target gpu-dsv3, sglang *",
        "cuda recipe: dtype bfloat16, attention sglang default (fa3 on sm90), cuda graphs on",
        "GPUs: 8 (--eagle3-plan: pretending 8 GPUs (*)); blocks of 8: 0,1,2,3,4,5,6,7; *",
    ])
    assert "starting SGLang" not in out and "ready in" not in out
    assert re.search(r"no tests ran in ", out)
    assert result.parseoutcomes().get("passed", 0) == 0

    # Every selected test is accounted for, each exactly once.
    summary = next(SUMMARY.match(line) for line in result.stdout.lines if SUMMARY.match(line))
    n_engines, used, skipped, runtime, free = map(int, summary.groups())
    collected = int(re.search(r"collected (\d+) items", out).group(1))
    # A declared test none of whose needs applies is collected once as a placeholder
    # and dropped (it is in the "left out" summary): at most one per test function.
    assert 0 <= collected - (used + skipped + runtime + free) <= 10, (collected, used, skipped, runtime, free)

    engines = planned_engines(result.stdout.lines)
    # A test with an engine set (a pair) is listed under each engine, counted once.
    assert len(engines) == n_engines and len({n for e in engines.values() for n in e["nodeids"]}) == used
    seen = []
    for name, info in engines.items():
        chosen = dict(re.findall(r"(\w+)=(\[[^]]*\]|\S+)", info["chosen"]))
        ids_match = re.search(r"\[([0-9, ]*)\]", chosen.get("return_aux_hidden_state_layer_ids", ""))
        ids = tuple(int(v) for v in ids_match.group(1).split(",")) if ids_match else None
        if set(chosen) - {"tp", "device"} <= CAPTURE_ARGS:
            seen.append((info["tp"], ids))
        assert info["tests"] == len(info["nodeids"]) >= 1
        assert all(f"[tp{info['tp']}-" in n or f"-tp{info['tp']}]" in n for n in info["nodeids"]), info
        # The one block of 8 GPUs, whatever the engine's TP; the command is the engine's own.
        assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in info["env"]
        assert f"--tp-size {info['tp']} " in info["command"]
        assert "--enable-return-aux-hidden-states" in info["command"]
        assert "--device cpu" not in info["command"] and "SGLANG_USE_CPU_ENGINE" not in info["env"]
        assert info["command"].endswith(f"--nccl-port {plan.NCCL_PLACEHOLDER} --port {plan.PORT_PLACEHOLDER}")
    assert sorted(seen, key=str) == sorted(expected_engines(), key=str)  # one engine per (tp, ids), shared


@needs_sglang
def test_plan_ignores_n_and_starts_no_worker(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_eagle3.suite", "--device", "cuda", "--tp", "2", "--eagle3-plan",
        f"--eagle3-cache={CACHE}", "-n", "auto", "-k", "kimi and tp2",
    )
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([
        "GPUs: 8 (*); blocks of 2: 0,1 | 2,3 | 4,5 | 6,7; *",
        "xdist: -n 4 (switched off for the plan;*); -n auto would run 4 worker(s)",
        "engine 1: tp2-cuda-* (TP 2) for * test(s)",
        "  nccl_port: from the block's window (15000-15099, 15200-15299, 15400-15499, 15600-15699)",
        "  env: CUDA_VISIBLE_DEVICES=<the worker block> *",
    ])
    assert "created:" not in result.stdout.str() and "[gw0]" not in result.stdout.str()


INNER = """
import pytest
from pytest_eagle3.planning.declare import case_needs

def test_no_engine():
    pass

@pytest.mark.skip(reason="not today")
@pytest.mark.eagle3_engines(*case_needs(["kimi-embedding-first"]))
def test_skipped(eagle3_need, eagle3_capture):
    pass

def test_engine_without_case(eagle3_capture):
    pass

@pytest.mark.tp(1)
@pytest.mark.eagle3_engines(*case_needs(["kimi-embedding-first"]))
def test_mapped(eagle3_need, eagle3_capture):
    pass
"""


@needs_sglang
def test_unmapped_tests_are_decided_at_run_time(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("--eagle3-plan", "--device", "cpu", f"--eagle3-cache={CACHE}")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([
        "nothing was started: 1 engine(s) for 1 selected test(s); 1 skipped; 1 decided at run time; "
        "1 without an engine",
        "GPUs: none (--device cpu: no lease; *)",
        "engine 1: tp1-cpu-* (TP 1) for 1 test(s)",
        "  env: * SGLANG_USE_CPU_ENGINE=1 *",
        "    test_inner.py::test_mapped[[]tp1-kimi-embedding-first[]]",
        "skipped, no engine starts for them (1):",
        "  not today:",
        "    test_inner.py::test_skipped[[]kimi-embedding-first[]]",
        "engine determined at run time:",
        "  test_inner.py::test_engine_without_case: " + plan.RUNTIME_NO_CASE.format(fixture="eagle3_capture"),
    ])


DECLARED = """
import pytest
from pytest_eagle3.planning.declare import case_needs

@pytest.mark.tp(1, 2, 4)
@pytest.mark.eagle3_engines(*case_needs(["kimi-embedding-first", "vllm-first-id-1"]))
def test_declared(eagle3_engine_request, eagle3_capture):
    pass
"""


@needs_sglang
def test_declared_engines_are_generated_only_where_they_run(pytester: pytest.Pytester) -> None:
    """The declaration decides collection and the plan: the wide case at TP 1 and
    2, the other list at TP 1 only, TP 4 left out at --tp 2, one line per reason."""
    pytester.makepyfile(test_declared=DECLARED)
    result = pytester.runpytest_subprocess("--eagle3-plan", "--device", "cpu", "--tp", "2",
                                           f"--eagle3-cache={CACHE}")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([
        "collected 3 items",
        # One capture-only engine per TP size on cpu: it switches ids between requests.
        "nothing was started: 2 engine(s) for 3 selected test(s); 0 skipped; 0 decided at run time; "
        "0 without an engine",
        "engine 1: tp1-cpu-* (TP 1) for 2 test(s)",
        "  chosen: * chunked_prefill_size=16 disable_radix_cache=False *",
        "  ids, switched between requests (pytest_eagle3/worker/id_switch.py): [[]0, 3, 5[]]; [[]1, 4, 6[]]",
        "    test_declared.py::test_declared[[]tp1-kimi-embedding-first[]]",
        "    test_declared.py::test_declared[[]tp1-vllm-first-id-1[]]",
        "engine 2: tp2-cpu-* (TP 2) for 1 test(s)",
        "    test_declared.py::test_declared[[]tp2-kimi-embedding-first[]]",
        "*eagle3 left out*",
        "1 left out: " + collect.TP1_ONLY.format(wide="kimi-embedding-first"),
        "2 left out: " + collect.TP_ABOVE.format(needed=4, tp=2),
    ])
    verbose = pytester.runpytest_subprocess("--eagle3-plan", "--device", "cpu", "--tp", "2", "-v",
                                            f"--eagle3-cache={CACHE}")
    verbose.stdout.fnmatch_lines(["2 left out: *", "    *test_declared[[]tp4-kimi-embedding-first[]]",
                                  "    *test_declared[[]tp4-vllm-first-id-1[]]"])


def test_without_sglang_every_engine_is_decided_at_run_time(pytester: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_eagle3.errors import Eagle3SGLangMissing

    def missing(*args, **kwargs):
        raise Eagle3SGLangMissing("SGLang is not installed in this environment (test)")

    monkeypatch.setattr(install, "probe", missing)
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest("--eagle3-plan", "--device", "cuda", "--tp", "2", f"--eagle3-cache={pytester.path / 'cache'}")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "nothing was started: 0 engine(s) for 0 selected test(s); 1 skipped; 2 decided at run time; *",
        "run: device cuda, --tp 2, target gpu-dsv3, SGLang: SGLang is not installed in this environment (test)",
        "  test_inner.py::test_mapped[[]tp1-kimi-embedding-first[]]: SGLang: SGLang is not installed *",
    ])


def test_plan_gpus(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--eagle3-plan-gpus", "4")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{MSG_PLAN_GPUS_ALONE}*"])
    result = pytester.runpytest("--eagle3-plan", "--eagle3-plan-gpus", "4", "--tp", "8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tp 8 needs 8 GPUs on --device cuda but 4 are visible "
                                 "(--eagle3-plan: pretending 4 GPUs (--eagle3-plan-gpus))*"])
    result = pytester.runpytest("--eagle3-plan-gpus", "0", "--eagle3-plan")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--eagle3-plan-gpus: expected a positive number of GPUs, got '0'*"])


def test_plan_is_in_help(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["  --eagle3-plan *", "  --eagle3-plan-gpus=N *"])


def test_command_line_placeholders_are_not_quoted() -> None:
    from pytest_eagle3.engine.config import EngineConfig

    config = EngineConfig(model_path="/m x", tp=2, device="cuda",
                          server_args=(("model_path", "/m x"), ("tp_size", 2)), env=())
    line = plan.command_line(config, nccl_port=True)
    assert line == (f"{plan.Path(plan.sys.executable).name} -m sglang.launch_server --model-path '/m x' "
                    "--tp-size 2 --host 127.0.0.1 --nccl-port <port from the block window> --port <free port>")


@needs_sglang
def test_minus_m_gpu_tp8_plans_every_gpu_test_with_the_cuda_recipe(pytester: pytest.Pytester) -> None:
    """``pytest -m gpu --tp 8`` on an 8-GPU runner, reviewed here: every packaged test
    is planned, the GPU-only path variants included without --eagle3-slow, on the
    gpu-dsv3 preset with the CUDA recipe (bf16, CUDA graphs on)."""
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_eagle3.suite", "-m", "gpu", "--tp", "8", "--device", "cuda", "--eagle3-plan",
        "--eagle3-plan-gpus", "8", f"--eagle3-cache={CACHE}", "-p", "no:cacheprovider",
    )
    out = result.stdout.str()
    assert result.ret == 0, out + result.stderr.str()
    result.stdout.fnmatch_lines([
        "run: device cuda, --tp 8, target gpu-dsv3, sglang *",
        "cuda recipe: dtype bfloat16, attention sglang default (fa3 on sm90), cuda graphs on",
    ])
    summary = next(SUMMARY.match(line) for line in result.stdout.lines if SUMMARY.match(line))
    assert int(summary.group(3)) == 0 and int(summary.group(4)) == 0, out  # nothing skipped or left to run time
    for variant in ("cuda-graph-on", "cuda-graph-off", "allreduce-fusion-on", "allreduce-fusion-off",
                    "dp-attention", "two-batch-overlap", "attn-tp-input-scattered"):
        assert f"test_captures_identical_through_path[tp8-{variant}]" in out, variant
    for tp in (1, 2, 4, 8):
        assert f"test_capture_order[tp{tp}-kimi-embedding-first]" in out
    assert "test_every_rank_fully_reduced[tp8-kimi-embedding-first]" in out
    # gpu-dsv3 ships no trained draft yet: acceptance is left out, with the reason.
    assert "left out: acceptance needs a trained EAGLE-3 draft: target gpu-dsv3 ships none" in out
    assert "--dtype bfloat16" in out and "--disable-cuda-graph" not in out
    assert "run with --eagle3-slow" not in out


@needs_sglang
def test_acceptance_engine_sorts_next_to_the_capture_engine_of_its_ids(pytester: pytest.Pytester) -> None:
    """With one engine alive at a time, the test that compares the draft path with
    capture-only (acceptance engine, then the wide case's engine) must sit between
    the acceptance tests and the wide case's tests, so neither engine starts twice
    (otherwise the wide case's TP 1 engine starts twice)."""
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_eagle3.suite", "--tp", "2", "--device", "cpu", "--collect-only", "-q",
        f"--eagle3-cache={CACHE}", "-p", "no:cacheprovider",
    )
    ids = [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line]
    assert result.ret == 0 and ids, result.stdout.str() + result.stderr.str()
    agree = ids.index("test_draft_path_agrees_with_capture_only[tp1-acceptance]")
    acceptance = [i for i, name in enumerate(ids) if name.endswith("[tp1-acceptance]")]
    assert acceptance == list(range(agree - len(acceptance) + 1, agree + 1)), ids
    # On cpu one capture-only engine per TP size serves every id list (the id switch)
    # and the paths that share it.
    wide_engine = {f"[tp1-{name}]" for name in ("kimi-embedding-first", "default-no-ids", "specforge-default-ids",
                                                 "speculators-default-ids", "vllm-first-id-1", "plain", "decode",
                                                 "batch", "chunked-prefill", "radix-cache-hit")}
    wide_engine |= {"[tp2-allreduce-fusion-off]"}  # fusion off on cpu: the capture engine
    assert any(ids[agree + 1].endswith(tag) for tag in wide_engine), ids
    # Every engine group is contiguous: no group resumes after another started.
    wide_names = {tag.split("-", 1)[1] for tag in wide_engine}
    tags = [name[name.index("[tp") + 1:-1].split("-", 1) for name in ids if "[tp" in name]
    keys = [(tp, "wide" if rest + "]" in wide_names else rest) for tp, rest in tags]
    groups = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(groups) == len(set(groups)), groups


@needs_sglang
def test_a_variant_sorts_just_before_the_engine_of_its_pair(pytester: pytest.Pytester) -> None:
    """The rule is the engine set's, not the acceptance test's: a variant whose
    test also uses its pair's engine (unchunked prefill and the capture engine
    that chunks; all-reduce fusion on and off) sorts right before that engine's
    tests, so with one engine alive at a time each starts once."""
    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_eagle3.suite", "--tp", "2", "--device", "cpu", "--collect-only", "-q", "--eagle3-slow",
        f"--eagle3-cache={CACHE}", "-p", "no:cacheprovider", "-k", "test_paths or test_capture_order",
    )
    ids = [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line]
    assert result.ret == 0 and ids, result.stdout.str() + result.stderr.str()
    for variant, after in (("tp1-unchunked-prefill", "[tp1-"), ("tp2-allreduce-fusion-on", "[tp2-")):
        at = ids.index(f"test_captures_identical_through_path[{variant}]")
        nxt = ids[at + 1]
        # The next test runs on the capture engine of that TP size (a case or a shared path).
        assert after in nxt and not any(own in nxt for own in ("ids-at", "ids-last", "dp-attention")), ids


@needs_sglang
def test_a_run_that_fuses_every_engine_leaves_the_fusion_pair_out(pytester: pytest.Pytester) -> None:
    from pytest_eagle3.planning.collect import FUSED_RUN

    result = pytester.runpytest_subprocess(
        "--pyargs", "pytest_eagle3.suite", "--tp", "2", "--device", "cpu", "--collect-only", "-q", "--eagle3-slow",
        "--eagle3-cpu-allreduce-fusion", f"--eagle3-cache={CACHE}", "-p", "no:cacheprovider", "-k", "test_paths",
    )
    out = result.stdout.str()
    assert result.ret == 0 and "[tp2-plain]" in out, out
    assert "allreduce-fusion" not in "".join(line for line in result.stdout.lines if "::" in line)
    assert f"2 left out: {FUSED_RUN}" in out
