"""``pytest-eagle3 self-test``: prove the packaged suite catches every wiring fault
injected into the SGLang installed here.

For each kind of the fault catalog (:data:`pytest_eagle3.worker.faults.CATALOG`)
one child ``pytest --pyargs pytest_eagle3.suite --eagle3-fault KIND`` runs the
smallest part of the suite that exercises it
(:func:`pytest_eagle3.planning.selftest.self_test_plan`: one engine per kind).  The
fault is installed inside every SGLang process of that child (through the
``sglang.srt.plugins`` hooks), so it changes SGLang's own computation, not
pytest-eagle3's copy of its output.  A kind is **caught** when every selected
test fails and each failure names the kind (the diagnosis tag ``[kind]`` of
:mod:`pytest_eagle3.verdicts.diagnose`).  One more child runs the union of those
selections with no fault: the **control**, which must pass (a suite that fails
everything would otherwise "catch" every fault).

Exit codes: 0 every kind caught and the control passed; 1 otherwise; 2 usage
(ours, or the child pytest's: the arguments after ``--`` are passed to each).
Arguments after ``--`` go to every child pytest (``--device cuda``,
``--eagle3-target PATH``, ``--eagle3-cache DIR``).

Nothing here imports torch or sglang: the children do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence
from pytest_eagle3.cli.selftest_grammar import grammar_test, render_grammar
from pytest_eagle3.planning.selftest import contrast_plan, self_test_args, self_test_env, self_test_plan
from pytest_eagle3.worker.env import FIX_ENV
from pytest_eagle3.worker.faults import NEEDS_PP, NEEDS_TBO
from pytest_eagle3.worker.faults import RUN_LEVEL, named_as

#: Verdicts of one kind.
CAUGHT = "caught"
MISSED = "MISSED"  # some selected test passed: the fault went unnoticed
UNNAMED = "UNNAMED"  # failed, but the message does not name the kind
NOT_RUN = "NOT RUN"  # the child collected or ran nothing it should have (error, skip, missing)
UNCONFINED = "UNCONFINED"  # a test that confines the fault (a contrast) failed with it on

#: pytest's exit status for a usage error (``pytest.ExitCode.USAGE_ERROR``).
USAGE_ERROR = 4

DESCRIPTION = """\
Run the packaged suite once per fault kind injected into the installed SGLang's
own capture path (pytest-eagle3's fault catalog), and once without a fault.
Each faulted run must fail naming its kind; the clean run must pass.  One
SGLang engine per run: about 1-2 minutes per kind on 2 CPU cores."""

EPILOG = """\
exit: 0 every fault caught and named, control passed; 1 a fault missed or
unnamed, or the control failed; 2 usage error.  Arguments after -- go to each
child pytest, e.g.:  pytest-eagle3 self-test --tp 2 -- --device cuda"""


@dataclass
class ChildRun:
    """One child pytest: its exit status, per-test outcome and message, its output."""

    returncode: int
    outcomes: dict[str, str]  # test name with params -> passed/failed/skipped/xfailed/error
    messages: dict[str, str]  # test name -> failure/skip message (full text)
    output: str
    seconds: float
    #: The run-level diagnosis of the child (its ``--eagle3-report``'s ``diagnosis``), if any.
    diagnosis: dict | None = None


@dataclass
class KindResult:
    """What one child with a fault (``kind``) or without (``kind`` is ``None``) showed."""

    kind: str | None
    tp: int
    tests: tuple[str, ...]
    verdict: str
    detail: str
    seconds: float
    log: Path | None = None
    #: The upstream fix (``PYTEST_EAGLE3_UPSTREAM_FIX``) the child's engines ran with, if any.
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == CAUGHT if self.kind else self.verdict == "passed"


@dataclass
class SelfTestResult:
    kinds: list[KindResult] = field(default_factory=list)
    control: KindResult | None = None
    #: The first line of a child's usage error (pytest exit 4), if any: the
    #: arguments after ``--`` are wrong, and every child would say the same.
    usage_error: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.kinds) and all(k.ok for k in self.kinds) and self.control is not None and self.control.ok


def parse_junit(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Outcome and message of every ``testcase`` of a JUnit XML file (pytest's
    ``--junitxml``), by test name with its parameters.  Outcomes: ``passed``,
    ``failed``, ``error``, ``skipped``, ``xfailed``."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                if tag == "skipped" and node.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                message = (node.get("message") or "") + "\n" + (node.text or "")
                break
        outcomes[name] = outcome
        messages[name] = message
    return outcomes, messages


def run_child(work: Path, tests: Sequence[str], tp: int, fault: str | None, extra: Sequence[str] = (),
              env: dict[str, str] | None = None) -> ChildRun:
    """``python -m pytest --pyargs pytest_eagle3.suite --eagle3-tp TP -k TESTS [--eagle3-fault F]``
    from the current directory (so relative paths in ``extra`` mean what they
    mean to the user), writing ``junit.xml``, ``report.json`` and ``output.txt``
    into ``work`` (no ``tests``: the default selection, no ``-k``).  Files left
    there by an earlier run are removed first."""
    work = Path(work).absolute()
    work.mkdir(parents=True, exist_ok=True)
    junit, report = work / "junit.xml", work / "report.json"
    junit.unlink(missing_ok=True)
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "pytest_eagle3.suite", "--eagle3-tp", str(tp),
           *(["-k", " or ".join(tests)] if tests else []), "-p", "no:cacheprovider", "-rA",
           f"--junitxml={junit}", f"--eagle3-report={report}", *extra]
    if fault:
        cmd += ["--eagle3-fault", fault]
    child_env = {k: v for k, v in (os.environ if env is None else env).items()
                 if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_EAGLE3_FAULT")}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=child_env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    output = proc.stdout + proc.stderr
    (work / "output.txt").write_text(output)
    outcomes, messages = parse_junit(junit) if junit.exists() else ({}, {})
    diagnosis = None
    if report.exists():
        try:
            diagnosis = json.loads(report.read_text()).get("diagnosis")
        except ValueError:
            diagnosis = None
    return ChildRun(proc.returncode, outcomes, messages, output, seconds, diagnosis)


def judge(kind: str | None, tests: Sequence[str], run: ChildRun,
          contrasts: Sequence[str] = ()) -> tuple[str, str]:
    """``(verdict, detail)`` of a child run: for a fault, :data:`CAUGHT` only when
    every selected test failed naming ``[kind]`` (a kind the run-level diagnosis
    names, :data:`~pytest_eagle3.worker.faults.RUN_LEVEL`: some selected test
    failed, naming its per-test tag if it has one, every ``contrasts`` test
    passed, and the child's run-level diagnosis has the kind's tag); for the
    control, ``"passed"`` only when every selected test passed."""
    tail = (run.output.strip().splitlines()[-1:] or ["no output"])[0]
    if run.returncode not in (0, 1):  # interrupted, internal or usage error, nothing collected, killed
        return NOT_RUN, f"the child pytest exited {run.returncode}: {tail}"
    missing = [t for t in [*tests, *contrasts] if t not in run.outcomes]
    if missing:
        return NOT_RUN, f"{len(missing)} of {len(tests)} tests did not run ({missing[0]}); exit {run.returncode}: {tail}"
    if kind is None:
        bad = [t for t in [*tests, *contrasts] if run.outcomes[t] != "passed"]
        if bad:
            return "FAILED", f"{bad[0]} {run.outcomes[bad[0]]}: {_first_line(run.messages[bad[0]])}"
        return "passed", f"{len(tests)} passed"
    for t in contrasts:
        if run.outcomes[t] != "passed":
            return UNCONFINED, f"{t} {run.outcomes[t]} with the fault on: {_first_line(run.messages[t])}"
    if kind in RUN_LEVEL:
        return _judge_run_level(kind, tests, run)
    for t in tests:
        outcome = run.outcomes[t]
        if outcome == "passed":
            return MISSED, f"{t} passed with the fault on"
        if outcome != "failed":
            return NOT_RUN, f"{t} {outcome}: {_first_line(run.messages[t])}"
        if f"[{named_as(kind)}]" not in run.messages[t]:
            return UNNAMED, f"{t} failed without naming [{named_as(kind)}]: {_first_line(run.messages[t])}"
    first = tests[0]
    return CAUGHT, f"{first}: {_tagged_line(run.messages[first], named_as(kind))}"


def _judge_run_level(kind: str, tests: Sequence[str], run: ChildRun) -> tuple[str, str]:
    """A kind whose evidence lies across tests: caught when a selected test failed
    (naming its per-test tag, where it has one) and the run-level diagnosis has
    the kind's tag (:data:`~pytest_eagle3.worker.faults.RUN_LEVEL`)."""
    odd = [t for t in tests if run.outcomes[t] not in ("passed", "failed")]
    if odd:
        return NOT_RUN, f"{odd[0]} {run.outcomes[odd[0]]}: {_first_line(run.messages[odd[0]])}"
    failed = [t for t in tests if run.outcomes[t] == "failed"]
    if not failed:
        return MISSED, f"every selected test passed with the fault on ({', '.join(tests)})"
    tag = named_as(kind)
    for t in failed:
        if tag is not None and f"[{tag}]" not in run.messages[t]:
            return UNNAMED, f"{t} failed without naming [{tag}]: {_first_line(run.messages[t])}"
    want, diag = RUN_LEVEL[kind], run.diagnosis or {}
    headline = str(diag.get("headline") or "no run-level diagnosis")
    if diag.get("tag") != want:
        return UNNAMED, f"the run-level diagnosis is not [{want}]: {headline[:300]}"
    # Quote a test that reports the cause in full, not one that points to it.
    first = next((t for t in failed if not _first_line(run.messages[t]).startswith(("same cause", "Failed: same"))),
                 failed[0])
    lead = f"{first}: {_tagged_line(run.messages[first], tag)}; " if tag is not None else ""
    return CAUGHT, f"{lead}run: {headline[:300]}"


def self_test(work: Path, *, no_tp: int = 1, kinds: Sequence[str] | None = None, extra: Sequence[str] = (),
              progress: Callable[[str], None] = print,
              runner: Callable[..., ChildRun] | None = None) -> SelfTestResult:
    """Run every kind of the plan (or ``kinds``), then the control.

    ``no_tp``: the TP size of kinds that need no TP > 1 (1 or 2); kinds in
    :data:`pytest_eagle3.worker.faults.NEEDS_TP` always run at TP 2.
    ``runner(work_dir, tests, tp, fault, extra) -> ChildRun`` runs one child
    (default :func:`run_child`); for a kind that needs an environment of its own
    (:func:`pytest_eagle3.planning.selftest.self_test_env`) it also gets ``env=``,
    the whole environment of that child.

    Raises:
        ValueError: an unknown kind.
    """

    runner = runner or run_child
    plan, contrasts = self_test_plan(no_tp), contrast_plan(no_tp)
    chosen = sorted(plan) if not kinds else list(dict.fromkeys(kinds))
    unknown = [k for k in chosen if k not in plan]
    if unknown:
        raise ValueError(f"unknown fault kind {unknown[0]!r}; known: {', '.join(sorted(plan))}")
    result = SelfTestResult()
    total = len(chosen) + 1
    for n, kind in enumerate(chosen, 1):
        tp, tests = plan[kind]
        progress(f"[{n}/{total}] fault {kind} at TP {tp}: {', '.join(tests)}")
        confine = contrasts.get(kind, ())
        env = self_test_env(kind)
        fix = {**os.environ, **env}.get(FIX_ENV) or None
        if fix:
            progress(f"      with upstream fix {fix} ({FIX_ENV})")
        run = runner(work / kind, (*tests, *confine), tp, kind, [*extra, *self_test_args(kind)],
                     **({"env": {**os.environ, **env}} if env else {}))
        if run.returncode == USAGE_ERROR:
            result.usage_error = _usage_line(run.output)
            return result
        verdict, detail = judge(kind, tests, run, confine)
        result.kinds.append(KindResult(kind, tp, tests, verdict, detail, run.seconds, work / kind / "output.txt", fix))
        progress(f"      {verdict} in {run.seconds:.0f} s: {detail}")
    tests = tuple(sorted({t for k in chosen for t in (*plan[k][1], *contrasts.get(k, ()))}))
    tp = max(plan[k][0] for k in chosen)
    # The control runs every path the faults did (in-place norms, fused all-reduce).
    # The control at PP only when every chosen kind runs at PP (its tests pass at PP with
    # the relay: tests/e2e/test_pp.py); a mixed run keeps its control at PP 1, with the
    # TBO fix where a TBO kind is chosen (its test passes only with it).
    at_pp = all(k in NEEDS_PP for k in chosen)
    paths = [a for k in dict.fromkeys(self_test_args(k) for k in chosen if at_pp or k not in NEEDS_PP) for a in k]
    env = {key: value for k in chosen if at_pp for key, value in self_test_env(k).items()}
    if not at_pp:  # the TBO tests pass only with the fix that captures per micro-batch (not a PP kind's)
        env = next((self_test_env(k) for k in chosen if k in NEEDS_TBO), env)
    fix = {**os.environ, **env}.get(FIX_ENV) or None
    progress(f"[{total}/{total}] control, no fault, at TP {tp}: {len(tests)} tests, "
             + (f"with upstream fix {fix} ({FIX_ENV})" if fix else "no upstream fix"))
    run = runner(work / "control", tests, tp, None, [*extra, *paths], **({"env": {**os.environ, **env}} if env else {}))
    verdict, detail = judge(None, tests, run)
    result.control = KindResult(None, tp, tests, verdict, detail, run.seconds, work / "control" / "output.txt", fix)
    progress(f"      {verdict} in {run.seconds:.0f} s: {detail}")
    return result


def render(result: SelfTestResult) -> list[str]:
    """The summary table: fault | TP | verdict | the test that catches it | its message."""
    lines = ["pytest-eagle3 self-test: fault -> test that catches it -> message"]
    width = max([len("(no fault)"), *(len(k.kind or "") for k in result.kinds)])
    for k in result.kinds:
        lines.append(f"  {k.kind:<{width}} TP {k.tp}  {k.verdict:<8} {k.detail}{_with_fix(k)}")
    if result.control is not None:
        c = result.control
        lines.append(f"  {'(no fault)':<{width}} TP {c.tp}  {c.verdict:<8} {c.detail}{_with_fix(c)}")
    bad = [k for k in result.kinds if not k.ok] + ([result.control] if result.control and not result.control.ok else [])
    for k in bad:
        lines.append(f"  log of {k.kind or 'the control'}: {k.log}")
    caught = sum(k.ok for k in result.kinds)
    control = "passed" if result.control is not None and result.control.ok else "FAILED"
    lines.append(f"{caught} of {len(result.kinds)} faults caught and named; control {control}")
    return lines


def _with_fix(k: KindResult) -> str:
    return f" [with upstream fix {k.fix}]" if k.fix else ""


def add_self_test_parser(sub: "argparse._SubParsersAction") -> None:
    p = sub.add_parser("self-test", help="prove the suite catches each wiring fault injected into your SGLang",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, choices=(1, 2), default=1,
                   help="TP size of the kinds that need no TP > 1 (those that do always run at TP 2)")
    p.add_argument("--kind", action="append", default=None, metavar="KIND",
                   help="only this fault kind (repeatable; default: the whole catalog)")
    p.add_argument("--grammar", type=int, default=None, metavar="N",
                   help="instead of the catalog: N faults sampled from the grammar (a confinement by TP size, "
                        "TP rank and forward mode x an effect), each through the default selection at TP 2; "
                        "each run's diagnosis must name its confinement (about 4 min each on 2 CPU cores)")
    p.add_argument("--seed", type=int, default=0, help="the grammar's seed (same seed, same faults)")
    p.add_argument("--sample", type=int, action="append", default=None, metavar="K",
                   help="with --grammar N: only sample K of the N (repeatable; to rerun one)")
    p.add_argument("--work-dir", default=None,
                   help="where each child run writes its output.txt and junit.xml (default: a new temp dir)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: arguments for each child pytest")


def cmd_self_test(args: argparse.Namespace) -> int:
    extra = [a for a in args.pytest_args if a != "--"] if args.pytest_args else []
    if args.grammar is not None and (args.kind or args.grammar < 1):
        print("pytest-eagle3 self-test: --grammar N takes N >= 1 and no --kind", file=sys.stderr)
        return 2
    if args.sample and (args.grammar is None or not all(1 <= k <= args.grammar for k in args.sample)):
        print("pytest-eagle3 self-test: --sample K needs --grammar N with 1 <= K <= N", file=sys.stderr)
        return 2
    unknown = [k for k in args.kind or () if k not in self_test_plan()]
    if unknown:
        print(f"pytest-eagle3 self-test: unknown fault kind {unknown[0]!r}; known: "
              f"{', '.join(sorted(self_test_plan()))}", file=sys.stderr)
        return 2
    try:
        if args.work_dir:
            work = Path(args.work_dir).expanduser().absolute()
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(tempfile.mkdtemp(prefix="pytest-eagle3-self-test-"))
    except OSError as exc:
        print(f"pytest-eagle3 self-test: --work-dir {args.work_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"pytest-eagle3 self-test: logs under {work}", flush=True)
    if args.grammar is not None:
        return _grammar(args, work, extra)
    result = self_test(work, no_tp=args.tp, kinds=args.kind, extra=extra, progress=lambda m: print(m, flush=True))
    if result.usage_error is not None:
        print(f"pytest-eagle3 self-test: the child pytest rejected its arguments: {result.usage_error}",
              file=sys.stderr)
        return 2
    print("\n".join(render(result)))
    return 0 if result.ok else 1


def _grammar(args: argparse.Namespace, work: Path, extra: list[str]) -> int:
    results = grammar_test(work, args.grammar, args.seed, run_child, extra=extra, only=args.sample,
                           progress=lambda m: print(m, flush=True))
    print("\n".join(render_grammar(results, args.seed, args.grammar)))
    return 0 if results and all(r.ok for r in results) else 1


def _usage_line(output: str) -> str:
    """pytest's ``ERROR: ...`` usage line of a child's output (else its last line)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("ERROR: ")), lines[-1] if lines else "no output")


def _first_line(message: str) -> str:
    return next((line.strip() for line in message.splitlines() if line.strip()), "")[:300]


def _tagged_line(message: str, kind: str) -> str:
    """The first message line naming ``[kind]`` (the diagnosis), else the first line."""
    tag = f"[{kind}]"
    line = next((line.strip() for line in message.splitlines() if tag in line), None)
    if line is None:
        return _first_line(message)
    if len(line) > 300 and tag not in line[:300]:
        line = line[:300 - len(tag) - 5] + " ... " + tag  # the table must show the name
    return line[:300]
