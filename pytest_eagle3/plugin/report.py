"""``--eagle3-report FILE.json``: what every pytest-eagle3 test measured, for machines.

Registered in ``pytest_configure`` when the option is given.  Tests and
fixtures leave their facts as ``record_property`` entries named ``eagle3_*``
(so they survive pytest-xdist and reach JUnit XML too), and every verdict that
goes through :func:`pytest_eagle3.suite.outcome.fail_if_bad` is added as an
``eagle3_verdict`` entry.  At the end of the run the file is written at once
(temporary name, then rename).

Schema (version :data:`SCHEMA`; fields are only added, never renamed)::

    {"schema": 1,
     "pytest_eagle3": "0.1.0",
     "sglang": {"version": "0.5.23", "location": "/.../sglang", "commit": "abc123..." | null},
     "run": {"device": "cpu", "tp": 2, "target": "tiny-dsv3", "exit_status": 0,
             "bisect": {"verdict": "good"|"bad"|"untestable", "exit": 0|1|125, "first": "..."} | null,
             "fault": "partial-sum" | null, "upstream_fix": "gemma3-capture-residual" | null,
             "prompts": "/path/to/prompts.json" | null},
     "engines": [{"name": "tp1-cpu-...", "args": "...", "ready_seconds": 24.1}],
     "tests": [{"nodeid": "...", "outcome": "passed"|"failed"|"skipped"|"xfailed"|"xpassed"|"error",
                "duration_s": 1.2, "message": "first line of the failure or skip" | null,
                "properties": {"eagle3_ids": [0, 3, 5], "eagle3_engine": "tp1-cpu-... (...)",
                               "eagle3_contract": "[embedding, out(L2), out(L4)]", ...},
                "verdicts": [{"ok": false, "verdict": "...",
                              "slots": [{"slot": 0, "expected": "hs[0]", "expected_rel_err": 0.0,
                                         "best": "hs[0]", "best_rel_err": 0.0, "ok": true}],
                              "lines": ["rank 1: ..."]}],
                "observations": [{"check": "captures", "ok": true, "mode": "later-chunk", ...}]}],
     "diagnosis": {"tag": "path-only", "headline": "[path-only] wrong only on cache-hit; ...",
                   "evidence": ["  wrong: ...", "  right: ..."], "lacking": []} | null}

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_eagle3.verdicts import summary
from pytest_eagle3.sglang_source.install import sglang_location_and_version
from pytest_eagle3.plugin.current_item import TracksCurrentItem
from pytest_eagle3.plugin.diagnosis import OBSERVATION_PROPERTY
from pytest_eagle3.plugin.run import get_run, get_settings
from pytest_eagle3.worker.env import FIX_ENV

SCHEMA = 1
VERDICT_PROPERTY = "eagle3_verdict"


class ReportWriter(TracksCurrentItem):
    """Collects the per-test facts of one run and writes the JSON report."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config = config
        self.path = Path(path)
        self.tests: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"<ReportWriter {self.path}>"

    def __hash__(self) -> int:
        return id(self)

    def pytest_eagle3_verdict(self, config: pytest.Config, report: Any) -> None:
        if self.item is not None:
            self.item.user_properties.append((VERDICT_PROPERTY, summary.report_record(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = [(k, v) for k, v in report.user_properties if str(k).startswith("eagle3_")]
        entry = self.tests.get(report.nodeid)
        if entry is None:
            entry = self.tests.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed",
                                                          "duration_s": 0.0, "message": None,
                                                          "properties": {}, "verdicts": []})
        entry["duration_s"] = round(entry["duration_s"] + float(report.duration), 3)
        for key, value in props:
            if key == VERDICT_PROPERTY:
                if value not in entry["verdicts"]:
                    entry["verdicts"].append(value)
            elif key == OBSERVATION_PROPERTY:
                if report.when == "call":  # the teardown report repeats the properties
                    entry.setdefault("observations", []).append(value)
            else:
                entry["properties"][key] = value
        outcome = _outcome(report)
        if outcome is not None:
            entry["outcome"] = outcome
            entry["message"] = _first_line(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):
            return

        settings = get_settings(self.config)
        run = get_run(self.config)
        bisect = run.bisect_result
        data = {
            "schema": SCHEMA,
            "pytest_eagle3": _version("pytest-eagle3"),
            "sglang": sglang_identity(),
            "run": {"device": settings.device, "tp": settings.tp, "target": settings.target,
                    "exit_status": int(session.exitstatus), "bisect": bisect, "fault": settings.fault,
                    "upstream_fix": _upstream_fix(),
                    "prompts": None if settings.prompts is None else str(settings.prompts)},
            "engines": [{"name": e.description.split(" ", 1)[0], "args": e.description,
                         "ready_seconds": round(e.start_seconds, 1)} for e in run.engines],
            "tests": list(self.tests.values()),
            "diagnosis": _diagnosis(run),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def _upstream_fix() -> str | None:
    """The upstream fix the engines of this run inherit (``PYTEST_EAGLE3_UPSTREAM_FIX``), as named."""
    return os.environ.get(FIX_ENV, "").strip() or None


def _diagnosis(run: Any) -> dict[str, Any] | None:
    """The run-level diagnosis (:mod:`pytest_eagle3.plugin.diagnosis`), or ``None``."""
    result = run.diagnosis.result() if run.diagnosis is not None else None
    return result.to_json() if result is not None else None


def _outcome(report: pytest.TestReport) -> str | None:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when == "call":
        return report.outcome
    if report.failed:
        return "error" if report.when == "setup" else "failed"
    if report.skipped:
        return "skipped"
    return None


def _first_line(report: pytest.TestReport) -> str | None:
    if report.passed and not hasattr(report, "wasxfail"):
        return None
    if hasattr(report, "wasxfail") and report.wasxfail:
        return str(report.wasxfail).splitlines()[0]
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).splitlines()[0]
    text = str(getattr(report, "longreprtext", "") or longrepr or "")
    lines = [line for line in text.splitlines() if line.strip()]
    failed = [line[2:] for line in lines if line.startswith("E ")]
    return (failed or lines or [None])[0]


def sglang_identity() -> dict[str, Any]:
    """Version, location and (for a git checkout) commit of the importable SGLang,
    without importing it."""

    location, version = sglang_location_and_version()
    commit = None
    if location is not None:
        try:
            proc = subprocess.run(["git", "-C", str(location), "rev-parse", "HEAD"], capture_output=True,
                                  text=True, timeout=10)
            commit = proc.stdout.strip() or None if proc.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"version": version, "location": str(location) if location else None, "commit": commit}


def _version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
