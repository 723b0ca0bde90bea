"""End to end on CPU: the packaged suite against the real SGLang installed here.

One inner pytest session runs the packaged suite at ``--tp 2`` (engines at TP 1
and TP 2) plus a deliberately wrong test that reuses one of the suite's engines,
so each engine starts once.  About 5 minutes on 2 cores.  The inner run writes
JUnit XML; each test below checks one thing about it.
"""

from __future__ import annotations

import re

import psutil
import pytest

from tests.inner_run import InnerRun, run_inner, run_processes

pytestmark = pytest.mark.e2e

#: A test whose contract is off by one: it reads the vllm-first-id-1 ids
#: [1, L//2, L-2] as SGLang's own "input of layer v" while SGLang adds +1 to a
#: list starting with 1 (PR #25454).  It declares no engine: it runs on a capture
#: engine without the suite's shared paths, which it shares with the inspect-fix
#: test (the id switch serves both lists).  The comparison must fire and name the
#: snapshot each slot really holds.
WRONG_LAYER_TEST = '''
import pytest
from pytest_eagle3.suite.outcome import fail_if_bad
from pytest_eagle3.verdicts.compare import compare_slots
from pytest_eagle3.planning import cases
from pytest_eagle3.planning.declare import case_needs


@pytest.mark.tp(1)
@pytest.mark.parametrize("eagle3_case", ["vllm-first-id-1"])
def test_contract_without_offset(eagle3_case, eagle3_capture, eagle3_reference, eagle3_model_config, eagle3_sglang):
    L, H = eagle3_model_config.num_layers, eagle3_model_config.hidden_size
    ids = list(cases.resolve(eagle3_case, L, H, eagle3_sglang.id_rule()).ids)
    cap = eagle3_capture(ids)[0]
    report = compare_slots(cap.prefill, eagle3_reference[0], expected=ids,
                           num_layers=L, hidden_size=H, tol=1e-3)
    fail_if_bad(report)


@pytest.mark.tp(1)
@pytest.mark.parametrize("eagle3_case", ["inspect-fix"])
def test_inspect_fix_is_what_sglang_captures(eagle3_case, eagle3_capture, eagle3_reference, eagle3_model_config,
                                            eagle3_sglang):
    """pytest-eagle3 inspect's fix for vllm-first-id-1 lists 1 second; SGLang must
    capture the contract [hs[1], hs[4], hs[6]] from it, in layer order."""
    from pytest_eagle3.contracts.idfix import ids_for

    L, H = eagle3_model_config.num_layers, eagle3_model_config.hidden_size
    contract = list(cases.resolve("vllm-first-id-1", L, H, eagle3_sglang.id_rule()).contract.to_snapshot_indices(L))
    fix = ids_for(contract, L, eagle3_sglang.id_rule())
    assert fix is not None and fix[0] != 1
    cap = eagle3_capture(list(fix))[0]
    report = compare_slots(cap.prefill, eagle3_reference[0], expected=contract,
                           num_layers=L, hidden_size=H, tol=1e-3)
    fail_if_bad(report)


@pytest.mark.tp(1)
@pytest.mark.eagle3_engines(*case_needs([cases.WIDE_CASE]))
def test_server_info_proves_the_plain_path(eagle3_engine_request, eagle3_capture):
    """The path proof on the real engine's /server_info: the capture engine returns
    the rows its settings imply (the last chunk of the longer prompts), and a
    variant flag this engine does not have is named."""
    from pytest_eagle3.engine.variant_proof import path_not_taken, prefill_rows

    req = eagle3_engine_request  # the capture engine: radix cache on, chunked prefill (shared with the suite)
    caps = eagle3_capture.run(req)
    info = eagle3_capture.server_info(req)
    assert [c.prefill.shape[0] for c in caps] == [prefill_rows(len(c.prompt), info) for c in caps]
    assert any(c.prefill.shape[0] < len(c.prompt) for c in caps)  # the longer prompts were chunked
    assert path_not_taken("plain", req.extra_args, info) is None
    msg = path_not_taken("chunked-prefill", {"chunked_prefill_size": 8}, info)
    assert msg is not None and "but SGLang's /server_info reports chunked_prefill_size=" in msg, msg
'''

#: Per-rank detectors must fire on a deliberately wrong tensor recorded inside a
#: real TP worker (the recorder's fault switch), through the checks the suite uses.
#: Shares the suite's TP 2 engine of the wide case (its shared paths' server args).
FAULT_TEST = '''
import pytest
from pytest_eagle3.suite.outcome import fail_if_bad
from pytest_eagle3.conventions import predict
from pytest_eagle3.verdicts.rankcheck import check_rank_embeddings, check_rank_slots, check_ranks_agree
from pytest_eagle3.planning import cases

FAULTS = {
    "unreduced-embedding": {"kind": "unreduced-embedding", "rank": 1, "slot": 0},
    "partial-sum": {"kind": "partial-sum", "rank": 1, "slot": 1, "fraction": 0.5},
}


@pytest.mark.tp(2)
@pytest.mark.parametrize("eagle3_case", [cases.WIDE_CASE])
@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("check", ["embedding", "agree", "slots"])
def test_fault_fires(check, fault, eagle3_case, eagle3_capture, eagle3_reference, eagle3_model_config,
                     eagle3_sglang):
    f = eagle3_model_config
    ids = list(cases.resolve(eagle3_case, f.num_layers, f.hidden_size, eagle3_sglang.id_rule()).ids)
    expected = list(predict(ids, f.num_layers, eagle3_sglang.id_rule()).snapshots)
    from pytest_eagle3.engine.variants import shared_engine_args

    _, records = eagle3_capture.with_ranks(ids, fault=FAULTS[fault],
                                           extra_args=shared_engine_args(eagle3_sglang, "cpu", 2))
    if check == "embedding":
        report = check_rank_embeddings(records, eagle3_reference, slot=0, hidden_size=f.hidden_size,
                                       vocab_size=f.vocab_size)
    elif check == "agree":
        report = check_ranks_agree(records, hidden_size=f.hidden_size)
    else:
        report = check_rank_slots(records, eagle3_reference, expected=expected,
                                  num_layers=f.num_layers, hidden_size=f.hidden_size)
    fail_if_bad(report)
'''

@pytest.fixture(scope="module")
def inner(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    """The packaged suite + the wrong-layer and fault tests, once, at --tp 2."""
    return run_inner(
        tmp_path_factory.mktemp("e2e"),
        ["--pyargs", "pytest_eagle3.suite", "test_wrong_layer.py", "test_rank_faults.py", "--tp", "2"],
        files={"test_wrong_layer.py": WRONG_LAYER_TEST, "test_rank_faults.py": FAULT_TEST},
    )


def _select(run: InnerRun, prefix: str) -> dict[str, str]:
    return {name: outcome for name, outcome in run.outcomes.items() if name.startswith(prefix)}


CASES = ("default-no-ids", "kimi-embedding-first", "specforge-default-ids", "speculators-default-ids",
         "vllm-first-id-1")
WIDE = "kimi-embedding-first"


def test_embedding_all_reduce_complete_at_tp1_and_tp2(inner: InnerRun) -> None:
    got = _select(inner, "test_embedding_rows_complete_on_every_shard")
    assert got == {  # TP 4 and 8 are left out at --tp 2
        f"test_embedding_rows_complete_on_every_shard[tp{tp}-{WIDE}]": "passed" for tp in (1, 2)
    }, inner.output[-4000:]


def test_capture_order_follows_sglang_rule_for_every_id_list(inner: InnerRun) -> None:
    got = _select(inner, "test_capture_order")
    expected = {f"test_capture_order[tp1-{case}]": "passed" for case in CASES}
    expected[f"test_capture_order[tp2-{WIDE}]"] = "passed"  # TP 4 and 8: left out at --tp 2
    assert got == expected, inner.output[-4000:]


def test_contract_verdicts_pinned_for_this_sglang(inner: InnerRun) -> None:
    """sglang 0.5.23: every fixture contract is fed as trained, except a vLLM-style list
    starting with 1, which SGLang's first-id rule (PR #25454) shifts by one layer."""
    name = "test_draft_receives_its_training_contract[tp{tp}-{case}]"
    got = _select(inner, "test_draft_receives_its_training_contract")
    expected = {name.format(case=case, tp=1): "passed" for case in CASES}
    expected[name.format(case="vllm-first-id-1", tp=1)] = "xfailed"
    expected[name.format(case=WIDE, tp=2)] = "passed"
    assert got == expected, inner.output[-4000:]
    reason = inner.messages[name.format(case="vllm-first-id-1", tp=1)]
    assert "known incompatibility of sglang 0.5.23" in reason
    assert "trained on [out(L0), out(L3), out(L5)] = hs[1], hs[4], hs[6]" in reason
    assert "its id rule (+1 only when the first id is 1" in reason and "captures hs[2], hs[5], hs[7]" in reason
    assert "slot 0: holds hs[2] (input of layer 2, rel.err " in reason


def test_what_did_not_run_is_one_line_per_reason(inner: InnerRun) -> None:
    """The suite's own tests are generated only where they run: nothing of the
    packaged suite skips; what was left out is one summary line per reason."""
    suite_skips = [n for n, o in inner.outcomes.items() if o == "skipped"]
    assert suite_skips == [], suite_skips
    summary = inner.output.split("eagle3 left out", 1)[-1]
    assert "left out: needs --tp 4; this run has --tp 2" in summary
    assert "left out: needs an SGLang engine of its own (minutes on cpu); run with --eagle3-slow" in summary
    assert " skipped" not in inner.output.splitlines()[-1], inner.output.splitlines()[-1]


def test_plan_and_run_agree_engine_for_engine(inner: InnerRun, tmp_path) -> None:
    """``--eagle3-plan`` of the packaged suite lists exactly the engines the run
    started for it (the run also started one for its two hand-written id-list tests)."""
    plan = run_inner(tmp_path, ["--pyargs", "pytest_eagle3.suite", "--tp", "2", "--eagle3-plan"])
    planned = set(re.findall(r"^engine \d+: (tp\d-cpu-[0-9a-f]{10}) ", plan.output, re.M))
    summary = inner.output.split("eagle3 engines", 1)[-1]
    started = set(re.findall(r"^(tp\d-cpu-[0-9a-f]{10}) .*: ready in ", summary, re.M))
    assert planned and planned <= started and len(started - planned) == 1, (planned, started)


def test_wrong_layer_capture_is_diagnosed(inner: InnerRun) -> None:
    name = "test_contract_without_offset[vllm-first-id-1]"
    assert inner.outcomes[name] == "failed"
    message = inner.messages[name]
    # L = 8: ids [1, 4, 6] -> SGLang captures inputs of layers 2, 5, 7.
    assert "aux hidden states: 3 of 3 slots wrong" in message
    assert "slot 0: holds hs[2] (input of layer 2, rel.err " in message
    assert "expected hs[1] (input of layer 1, rel.err " in message
    assert "slot 2: holds hs[7] (input of layer 7, rel.err " in message


def test_acceptance_meets_the_gate_and_has_power(inner: InnerRun) -> None:
    got = _select(inner, "test_draft_acceptance_meets_the_gate") | _select(inner, "test_acceptance_gate_has_power") \
        | _select(inner, "test_draft_path_agrees_with_capture_only")
    assert got == {
        "test_draft_acceptance_meets_the_gate[tp1-acceptance]": "passed",
        "test_draft_acceptance_meets_the_gate[tp2-acceptance]": "passed",
        "test_acceptance_gate_has_power[tp1-acceptance]": "passed",
        "test_draft_path_agrees_with_capture_only[tp1-acceptance]": "passed",
        # The MLA draft (SGLang's Eagle3DeepseekV2ForCausalLM); its fc_norm and norm_output
        # variants need --eagle3-slow on cpu.
        "test_draft_acceptance_meets_the_gate[tp1-acceptance-mla]": "passed",
        "test_acceptance_gate_has_power[tp1-acceptance-mla]": "passed",
    }, inner.output[-4000:]


def test_the_draft_reads_the_accepted_path_on_the_chain_engines(inner: InnerRun) -> None:
    """What the draft is fed, after every prefill and verify, on every TP rank (the main job's
    chain engines); the token tree and the other schedule need engines of their own."""
    assert _select(inner, "test_draft_reads_the_accepted_path") == {
        "test_draft_reads_the_accepted_path[tp1-acceptance]": "passed",
        "test_draft_reads_the_accepted_path[tp2-acceptance]": "passed",
    }, inner.output[-4000:]
    assert re.search(r"test_draft_reads_the_accepted_path\[tp2-acceptance\]: draft fed \d+ prefill rows \(0 at chunk "
                     r"ends\) and \d+ accepted-path rows after \d+ verifies, TP ranks 0, 1", inner.output)
    summary = inner.output.split("eagle3 left out", 1)[-1]
    assert "left out: the tree speculative shape needs engines of its own" in summary


def test_per_rank_checks_pass_at_tp2(inner: InnerRun) -> None:
    got = _select(inner, "test_every_rank_") | _select(inner, "test_ranks_hold_identical_captures")
    assert {k: v for k, v in got.items() if "tp2" in k} == {
        f"test_every_rank_embedding_complete[tp2-{WIDE}]": "passed",
        f"test_ranks_hold_identical_captures[tp2-{WIDE}]": "passed",
        f"test_every_rank_fully_reduced[tp2-{WIDE}]": "passed",
        "test_every_rank_agrees_in_verify[tp2-acceptance]": "passed",  # speculative decoding's verify forwards
    }, inner.output[-4000:]


def test_paths_sharing_the_wide_engine_pass_at_tp1_and_tp2(inner: InnerRun) -> None:
    got = _select(inner, "test_captures_identical_through_path")
    # Chunked prefill and radix-cache hits run on the wide case's engines without --eagle3-slow.
    for variant in ("plain", "decode", "batch", "chunked-prefill", "radix-cache-hit"):
        for tp in (1, 2):
            assert got[f"test_captures_identical_through_path[tp{tp}-{variant}]"] == "passed", inner.output[-4000:]


def _fault(inner: InnerRun, check: str, fault: str) -> str:
    name = f"test_fault_fires[{check}-{fault}-{WIDE}]"
    assert inner.outcomes.get(name) == "failed", (name, inner.outcomes.get(name))
    return inner.messages[name]


def test_unreduced_embedding_on_one_rank_is_named(inner: InnerRun) -> None:
    message = _fault(inner, "embedding", "unreduced-embedding")
    assert "rank 1: embedding: " in message and "rows are exact zeros" in message
    assert "vocab shard 0 of 2" in message


def test_ranks_disagree_names_the_rank(inner: InnerRun) -> None:
    message = _fault(inner, "agree", "unreduced-embedding")
    assert "ranks disagree" in message and "rank 1, forward 0 (EXTEND), slot 0:" in message
    assert "rank 1, forward 0 (EXTEND), slot 1" in _fault(inner, "agree", "partial-sum")


def test_partial_sum_on_one_rank_is_named(inner: InnerRun) -> None:
    message = _fault(inner, "slots", "partial-sum")
    assert "slot 1 on rank 1 holds 0.5 x hs[3] (input of layer 3)" in message
    assert "a partial sum, the all-reduce is missing or incomplete on rank 1" in message


def test_faults_stay_in_the_recorder(inner: InnerRun) -> None:
    """A fault touches only its slot on its rank: the embedding check passes under
    a partial sum in slot 1, the slot check fails under a broken embedding."""
    assert inner.outcomes[f"test_fault_fires[slots-unreduced-embedding-{WIDE}]"] == "failed"
    assert inner.outcomes[f"test_fault_fires[embedding-partial-sum-{WIDE}]"] == "passed"


def test_path_proof_reads_the_real_server_info(inner: InnerRun) -> None:
    name = "test_server_info_proves_the_plain_path[tp1-kimi-embedding-first]"
    assert inner.outcomes[name] == "passed", inner.messages[name]


def test_inspect_fix_confirmed_by_the_engine(inner: InnerRun) -> None:
    assert inner.outcomes["test_inspect_fix_is_what_sglang_captures[inspect-fix]"] == "passed", \
        inner.messages["test_inspect_fix_is_what_sglang_captures[inspect-fix]"]


def test_engine_log_attached_to_the_failure(inner: InnerRun) -> None:
    assert "sglang log tp1-cpu-" in inner.output


def test_one_engine_per_configuration(inner: InnerRun) -> None:
    # TP 1: the capture engine (every id list, switched between requests), one for
    # the two hand-written id-list tests, and speculative decoding with the shipped
    # draft and with the MLA draft; TP 2: the capture engine and the shipped draft's.
    # Each starts once: the summary lists every start.
    summary = inner.output.split("eagle3 engines", 1)[-1]
    ready = [line for line in summary.splitlines() if ": ready in " in line]
    assert len(ready) == 4 + 2, summary


def test_no_sglang_process_left_behind(inner: InnerRun) -> None:
    leftovers = []
    for proc in run_processes(inner.mark):
        try:
            leftovers.append(f"{proc.pid} {proc.name()}: {' '.join(proc.cmdline())[:200]}")
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    assert not leftovers


def test_inspect_verdicts_agree_with_the_engine(inner: InnerRun, tmp_path) -> None:
    """``pytest-eagle3 inspect`` (no engine) predicts, for every fixture contract, the
    outcome the real engine measured: match <-> passed, mismatch <-> xfailed."""
    from pytest_eagle3.sglang_source.install import locate
    from pytest_eagle3.cli.preflight import inspect_draft
    from pytest_eagle3.planning import cases
    from pytest_eagle3.suite.support import write_draft_config

    version = locate()[0]
    measured_to_verdict = {"passed": "match", "xfailed": "mismatch"}
    for case in CASES:
        fixture = cases.resolve(case, 8, 256, version)
        draft = write_draft_config(tmp_path / case, fixture.ids, 256)
        verdict = inspect_draft(draft, num_layers=8, sglang_version=version, target_hidden_size=256,
                                stack=fixture.stack, options=fixture.options).verdict
        measured = inner.outcomes[f"test_draft_receives_its_training_contract[tp1-{case}]"]
        assert verdict == measured_to_verdict[measured], (case, verdict, measured)
