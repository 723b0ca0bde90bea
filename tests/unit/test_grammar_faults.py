"""The grammar on the real engine: sampled confinements as worker faults, and the
judge of a run's report (``pytest-eagle3 self-test --grammar N --seed S``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from pytest_eagle3.cli import selftest
from pytest_eagle3.cli.selftest_grammar import grammar_test, read_report, render_grammar
from pytest_eagle3.planning.grammar_faults import sample_faults, to_fault
from pytest_eagle3.verdicts.grammar import apply, classify, default_run, inside, judge_run, sample_confinement
from pytest_eagle3.verdicts.run_cause import diagnose_run
from pytest_eagle3.verdicts.separation import API_RANK
from pytest_eagle3.worker.env import FAULT_ENV
from pytest_eagle3.worker.faults import read_fault


def test_same_seed_same_faults_and_each_is_one_the_worker_takes() -> None:
    first, again = sample_faults(12, 3), sample_faults(12, 3)
    assert [s.fault for s in first] == [s.fault for s in again]
    assert [s.fault for s in first] != [s.fault for s in sample_faults(12, 4)]
    run = default_run()
    for s in first:
        assert read_fault({FAULT_ENV: s.fault_json}) == s.fault
        assert 0 < len(inside(run, s.conjunction)) < len(run)
        # partial-sum changes nothing at TP 1: drawn only inside TP 2.
        assert s.effect != "partial-sum" or s.fault.get("tp") == [2] or s.fault.get("rank") == [1]


def test_rank_0_stands_for_the_apis_captures_too() -> None:
    conj, fault = to_fault("no-residual", {"TP rank": (0,), "forward mode": ("decode", "prefill")})
    assert fault == {"kind": "no-residual", "rank": [0], "when": ["prefill", "decode"]}
    assert dict(conj)["TP rank"] == {"rank 0", API_RANK}


def test_the_judge_of_a_run_agrees_with_the_simulator() -> None:
    """On simulated runs (the comparisons inside the confinement wrong), the judge of a
    real run's report and the simulator's classifier say the same."""
    rng = random.Random(5)
    run = default_run()
    for _ in range(60):
        conj = sample_confinement(rng, run, rng.randint(1, 3))
        faulted = apply(run, conj, "no-residual")
        diag = diagnose_run(faulted)
        want, _ = classify(run, conj)
        got, why = judge_run(faulted, diag.named, conj)
        assert got == want or (want, got) == ("coarser", "exact"), (conj, diag.headline, why)


def test_a_fault_that_reached_further_than_sampled_is_off_target() -> None:
    run = default_run()
    conj, _ = to_fault("no-residual", {"forward mode": ("decode",)})
    wider, _ = to_fault("no-residual", {"forward mode": ("decode", "later-chunk")})
    faulted = apply(run, wider, "no-residual")
    got, why = judge_run(faulted, diagnose_run(faulted).named, conj)
    assert got == "off-target" and "wrong outside (tp 1, plain, later-chunk" in why


def test_a_named_cause_holding_a_right_comparison_is_wrong_and_none_is_unnamed() -> None:
    run = default_run()
    conj, _ = to_fault("no-residual", {"forward mode": ("decode",)})
    faulted = apply(run, conj, "no-residual")
    wider, _ = to_fault("no-residual", {"forward mode": ("decode", "later-chunk")})
    got, why = judge_run(faulted, wider, conj)
    assert got == "wrong" and why.startswith("the named cause holds")
    assert judge_run(faulted, (), conj)[0] == "unnamed"
    assert judge_run(faulted, conj, conj)[0] == "exact"


def test_grammar_test_runs_one_child_per_sample_and_reads_its_report(tmp_path: Path) -> None:
    run = default_run()
    calls = []

    def runner(where, tests, tp, fault, extra):
        calls.append((tests, tp, json.loads(fault)))
        sample = sample_faults(2, 7)[len(calls) - 1]
        faulted = apply(run, sample.conjunction, sample.effect)
        diag = diagnose_run(faulted)
        Path(where).mkdir(parents=True)
        report = {"tests": [{"observations": [o.to_json() for o in faulted]}], "diagnosis": diag.to_json()}
        (Path(where) / "report.json").write_text(json.dumps(report))
        return selftest.ChildRun(1, {}, {}, "", 1.0)

    results = grammar_test(tmp_path, 2, 7, runner, progress=lambda m: None)
    assert [c[:2] for c in calls] == [((), 2), ((), 2)]
    assert [c[2] for c in calls] == [s.fault for s in sample_faults(2, 7)]
    assert all(r.verdict in ("exact", "coarser") for r in results), [(r.verdict, r.why) for r in results]
    lines = render_grammar(results, 7)
    assert lines[0] == "pytest-eagle3 self-test --grammar 2 --seed 7: sampled confinement -> run-level cause"
    assert lines[-1].startswith("2 of 2 named exactly or coarser")
    obs, named, headline = read_report(tmp_path / "sample-1" / "report.json")
    assert len(obs) == len(run) and headline.startswith("[")


def test_a_child_without_a_report_is_not_run(tmp_path: Path) -> None:
    results = grammar_test(tmp_path, 1, 0, lambda *a: selftest.ChildRun(4, {}, {}, "usage", 0.5),
                           progress=lambda m: None)
    assert results[0].verdict == "NOT RUN" and "exit 4: no report at" in results[0].why
    assert not results[0].ok


def test_only_the_named_samples_rerun(tmp_path: Path) -> None:
    """``--sample K``: sample K of the same seed, with the same fault as in the whole run."""
    faults = []
    results = grammar_test(tmp_path, 4, 0, lambda where, tests, tp, fault, extra: faults.append(fault) or
                           selftest.ChildRun(4, {}, {}, "usage", 0.5), progress=lambda m: None, only=[3])
    assert [r.sample.index for r in results] == [3] and faults == [sample_faults(4, 0)[2].fault_json]
    assert render_grammar(results, 0, 4)[0].startswith("pytest-eagle3 self-test --grammar 4 --seed 0 --sample 3:")


def test_sample_needs_grammar(capsys) -> None:
    from pytest_eagle3.cli.main import main

    assert main(["self-test", "--sample", "2"]) == 2
    assert main(["self-test", "--grammar", "2", "--sample", "3"]) == 2
    assert "--sample K needs --grammar N with 1 <= K <= N" in capsys.readouterr().err
