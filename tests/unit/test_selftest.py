"""``pytest-eagle3 self-test`` verdicts, table and exit codes, with a stand-in for
the child pytest (the real children run in ``tests/e2e/test_fault_self_test.py``)."""

from __future__ import annotations

from pytest_eagle3.worker.env import FIX_ENV
from pytest_eagle3.worker.faults import RUN_LEVEL, named_as

from pathlib import Path

import pytest

from pytest_eagle3.cli import main as cli_main
from pytest_eagle3.cli import selftest
from pytest_eagle3.planning.selftest import self_test_plan

TESTS = ("test_capture_order[tp1-kimi-embedding-first]", "test_every_rank_fully_reduced[tp2-kimi-embedding-first]")


def child(outcomes: dict[str, str], messages: dict[str, str] | None = None, rc: int = 1,
          diagnosis: dict | None = None) -> selftest.ChildRun:
    return selftest.ChildRun(rc, outcomes, messages or {t: "" for t in outcomes}, "last line of output", 3.0,
                             diagnosis)


@pytest.mark.parametrize(("outcomes", "messages", "verdict"), [
    ({t: "failed" for t in TESTS}, {t: "aux hidden states: 1 of 3 slots wrong\nslot 1: ... [partial-sum]" for t in TESTS},
     selftest.CAUGHT),
    ({TESTS[0]: "failed", TESTS[1]: "passed"}, {t: "[partial-sum]" for t in TESTS}, selftest.MISSED),
    ({t: "failed" for t in TESTS}, {TESTS[0]: "[partial-sum]", TESTS[1]: "matches no snapshot"}, selftest.UNNAMED),
    ({TESTS[0]: "failed"}, {TESTS[0]: "[partial-sum]"}, selftest.NOT_RUN),
    ({TESTS[0]: "failed", TESTS[1]: "skipped"}, {TESTS[0]: "[partial-sum]", TESTS[1]: "needs --tp 2"}, selftest.NOT_RUN),
])
def test_a_fault_is_caught_only_when_every_selected_test_fails_naming_it(outcomes, messages, verdict) -> None:
    got, detail = selftest.judge("partial-sum", TESTS, child(outcomes, messages))
    assert got == verdict, detail
    if verdict == selftest.CAUGHT:
        assert detail == f"{TESTS[0]}: slot 1: ... [partial-sum]"


def test_the_control_passes_only_when_everything_passed() -> None:
    assert selftest.judge(None, TESTS, child({t: "passed" for t in TESTS}, rc=0))[0] == "passed"
    verdict, detail = selftest.judge(None, TESTS, child({TESTS[0]: "passed", TESTS[1]: "failed"},
                                                        {TESTS[0]: "", TESTS[1]: "E boom"}))
    assert verdict == "FAILED" and "boom" in detail


def fake_runner(missed: str | None = None, control_fails: bool = False):
    """A child that fails every test naming the fault, except ``missed``; the
    control passes unless ``control_fails``."""
    calls = []
    envs = {}

    def run(where: Path, tests, tp, fault, extra, env=None):
        calls.append((where.name, tp, fault, tuple(extra)))
        envs[where.name] = env
        if fault is None:
            return child({t: "failed" if control_fails else "passed" for t in tests}, rc=int(control_fails))
        if fault == missed:
            return child({t: "passed" for t in tests}, rc=0)
        confine = selftest.contrast_plan(tp if tp == 2 else 1).get(fault, ())
        tag = RUN_LEVEL.get(fault)
        return child({t: "passed" if t in confine else "failed" for t in tests},
                     {t: f"slot 0 [{named_as(fault)}]" for t in tests},
                     diagnosis={"tag": tag, "headline": f"[{tag}] ..."} if tag else None)

    run.calls = calls
    run.envs = envs
    return run


def test_every_kind_then_the_control_with_the_users_arguments(tmp_path) -> None:
    runner = fake_runner()
    result = selftest.self_test(tmp_path, no_tp=2, extra=["--device", "cuda"], progress=lambda m: None, runner=runner)
    plan = self_test_plan(2)
    assert result.ok and [k.kind for k in result.kinds] == sorted(plan)
    assert runner.calls[-1][0] == "control" and runner.calls[-1][2] is None and runner.calls[-1][1] == 2
    assert all(extra[:2] == ("--device", "cuda") for *_, extra in runner.calls)
    paths = {k: extra[2:] for k, _, f, extra in runner.calls}
    assert paths["aliased-capture"] == ("--eagle3-cpu-norm", "inplace")
    assert paths["before-fused-allreduce"] == ("--eagle3-cpu-allreduce-fusion",)
    assert paths["partial-sum"] == ()
    assert paths["pp-earlier-stage-zeroed"] == ("--eagle3-pp", "2")
    assert runner.envs["pp-earlier-stage-zeroed"][FIX_ENV] == "pp-capture-relay" and runner.envs["partial-sum"] is None
    assert paths["tbo-microbatch-dropped"] == ("--eagle3-slow",)
    assert paths["partial-before-dp-reduce-scatter"] == ("--eagle3-slow",)
    assert runner.envs["partial-before-dp-reduce-scatter"] is None
    assert runner.envs["tbo-microbatches-swapped"][FIX_ENV] == "tbo-capture-per-microbatch"
    # A mixed run's control stays at PP 1, with the TBO fix its two-batch-overlap test passes only with;
    # a PP-only run's control runs at PP 2 with the relay.
    assert paths["control"] == ("--eagle3-cpu-norm", "inplace", "--eagle3-cpu-allreduce-fusion", "--eagle3-slow")
    assert runner.envs["control"][FIX_ENV] == "tbo-capture-per-microbatch"
    pp_only = fake_runner()
    selftest.self_test(tmp_path / "pp", kinds=["pp-earlier-stage-zeroed"], progress=lambda m: None, runner=pp_only)
    assert pp_only.calls[-1][3] == ("--eagle3-pp", "2") and pp_only.envs["control"][FIX_ENV] == "pp-capture-relay"
    assert {(k, tp) for k, tp, f, _ in runner.calls if f} == {(k, plan[k][0]) for k in plan}
    table = selftest.render(result)
    assert table[-1] == f"{len(plan)} of {len(plan)} faults caught and named; control passed"
    # The table names the upstream fix each child's engines ran with, the control's too.
    assert result.control.fix == "tbo-capture-per-microbatch"
    assert table[-2].endswith("[with upstream fix tbo-capture-per-microbatch]")
    assert "with upstream fix" not in next(line for line in table if line.lstrip().startswith("partial-sum "))


@pytest.mark.parametrize(("missed", "control_fails"), [("reversed-order", False), (None, True)])
def test_a_missed_fault_or_a_failing_control_exits_1_and_points_at_the_log(
        monkeypatch, tmp_path, capsys, missed, control_fails) -> None:
    monkeypatch.setattr(selftest, "run_child", fake_runner(missed, control_fails))
    rc = cli_main.main(["self-test", "--kind", "reversed-order", "--kind", "partial-sum",
                        "--work-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1, out
    who = missed or "the control"
    assert f"log of {who}: {tmp_path / (missed or 'control') / 'output.txt'}" in out
    assert ("MISSED" in out) == bool(missed) and ("control FAILED" in out) == control_fails


def test_an_unknown_kind_is_a_usage_error_before_anything_runs(tmp_path, capsys) -> None:
    rc = cli_main.main(["self-test", "--kind", "nope", "--work-dir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown fault kind 'nope'; known: aliased-capture, before-fused-allreduce" in err
    assert not (tmp_path / "w").exists()



def test_a_child_that_did_not_run_is_never_caught_even_with_an_old_junit_xml(tmp_path, monkeypatch) -> None:
    """A junit.xml left by an earlier run must not be read as this run's; a child
    that exits with a usage error makes the verb exit 2 with pytest's line."""
    old = tmp_path / "offset-twice"
    old.mkdir()
    (old / "junit.xml").write_text('<testsuites><testsuite><testcase name="test_capture_order[tp1-kimi-embedding-first]">'
                                   '<failure message="[offset-twice]"/></testcase></testsuite></testsuites>')
    monkeypatch.chdir(tmp_path)
    rc = cli_main.main(["self-test", "--kind", "offset-twice", "--work-dir", str(tmp_path), "--", "--tp", "3"])
    assert rc == 2
    assert not (old / "junit.xml").exists()
    assert "ERROR: --eagle3-tp/--tp" in (old / "output.txt").read_text()


def test_children_run_from_the_callers_directory_with_a_relative_work_dir(tmp_path, monkeypatch) -> None:
    """Relative paths after -- and a relative --work-dir mean what they mean to the user."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.json").write_text("[[1, 2, 3]]")
    run = selftest.run_child(Path("rel") / "kind", ("test_capture_order[tp1-kimi-embedding-first]",), 1, None,
                             ["--co", "--eagle3-prompts", "p.json", "--device", "cpu"])
    assert (tmp_path / "rel" / "kind" / "junit.xml").is_file(), run.output[-2000:]
    assert run.returncode == 0, run.output[-2000:]
    assert selftest.judge(None, ("test_capture_order[tp1-kimi-embedding-first]",), run)[0] == selftest.NOT_RUN


def test_a_work_dir_that_is_a_file_is_one_line(tmp_path, capsys) -> None:
    f = tmp_path / "file"
    f.write_text("")
    assert cli_main.main(["self-test", "--work-dir", str(f / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pytest-eagle3 self-test: --work-dir {f / 'sub'}: "), err


def test_a_long_diagnosis_keeps_its_tag_in_the_table() -> None:
    """The diagnosis line of before-fused-allreduce is longer than the table's 300
    characters, with its tag at the end: the table still shows the tag."""
    line = "slot 1 holds layer 2's post-attention residual + rank 0's MLP share: " + "x" * 300 + \
        " [before-fused-allreduce]"
    shown = selftest._tagged_line("first line\n" + line, "before-fused-allreduce")
    assert len(shown) <= 300 and shown.endswith(" ... [before-fused-allreduce]")
    assert selftest._tagged_line("short [partial-sum]", "partial-sum") == "short [partial-sum]"


RUN = ("test_captures_identical_through_path[tp1-radix-cache-hit]", "test_capture_order[tp1-kimi-embedding-first]")


@pytest.mark.parametrize(("outcomes", "diagnosis", "verdict"), [
    ({RUN[0]: "failed", RUN[1]: "passed"}, {"tag": "path-only", "headline": "[path-only] wrong only on cache-hit"},
     selftest.CAUGHT),
    ({RUN[0]: "failed", RUN[1]: "passed"}, {"tag": "global", "headline": "[global] every mode fails"},
     selftest.UNNAMED),
    ({RUN[0]: "failed", RUN[1]: "passed"}, None, selftest.UNNAMED),
    ({RUN[0]: "failed", RUN[1]: "failed"}, {"tag": "path-only", "headline": "[path-only] ..."}, selftest.UNCONFINED),
    ({RUN[0]: "passed", RUN[1]: "passed"}, {"tag": "clean", "headline": "[clean] ..."}, selftest.MISSED),
])
def test_a_run_level_kind_is_caught_only_when_the_run_names_it(outcomes, diagnosis, verdict) -> None:
    """A kind confined to radix-cache hits: its test fails naming the computation,
    the contrast passes, and the run-level diagnosis says [path-only]."""
    run = child(outcomes, {RUN[0]: "slot 1 holds ... [no-residual]", RUN[1]: ""}, diagnosis=diagnosis)
    got, detail = selftest.judge("no-residual-on-cache-hit", RUN[:1], run, contrasts=RUN[1:])
    assert got == verdict, detail
    if verdict == selftest.CAUGHT:
        assert detail == f"{RUN[0]}: slot 1 holds ... [no-residual]; run: [path-only] wrong only on cache-hit"
