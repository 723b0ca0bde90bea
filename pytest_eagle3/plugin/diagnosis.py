"""The ``eagle3 diagnosis`` section: the run-level cause, from every verdict of the run.

The packaged tests hand each verdict to :func:`observe` with its context
(path, forward mode, TP rank, the request's order on its engine); the
acceptance tests' figures (``eagle3_accept_length``, ``eagle3_offline``
properties) give the served-draft and offline levels.  Observations travel as
``eagle3_observation`` ``record_property`` entries, so they reach the
pytest-xdist controller.  After the last test the controller (or the single
process) calls :func:`pytest_eagle3.verdicts.run_cause.diagnose_run` and prints
the section; the JSON report (``--eagle3-report``) carries it as
``diagnosis``; every failed packaged test gets one line that points to it.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import math
import re
from collections.abc import Generator
from typing import Any, Mapping

import pytest

from pytest_eagle3.draft.wiring import CORRECT
from pytest_eagle3.plugin.current_item import TracksCurrentItem
from pytest_eagle3.plugin.session import item_tp
from pytest_eagle3.verdicts.observation import CHUNKS_JOINED
from pytest_eagle3.verdicts.run_cause import (
    OFFLINE, POINTER, SERVED, TITLE, Observation, RunDiagnosis, diagnose_run,
)
from pytest_eagle3.verdicts.within import position_ranges

#: Name the plugin is registered under (``pytest_configure``, :mod:`pytest_eagle3.plugin.hooks`).
PLUGIN_NAME = "eagle3-diagnosis"
OBSERVATION_PROPERTY = "eagle3_observation"
#: Marks the reports of tests that declare their engines (a project's own tests are not weighed).
PACKAGED_PROPERTY = "eagle3_packaged"
#: Name of the report section that points a failed test to the run's diagnosis.
POINTER_SECTION = "run-level diagnosis"
_TP_IN_ID = re.compile(r"\[tp(\d+)-")
_TAG = re.compile(r"\[([a-z][a-z0-9]*(?:-[a-z0-9]+)*)\]")


def _first_line(report: Any) -> str:
    try:
        text = report.message() if hasattr(report, "message") else str(getattr(report, "text", "") or "")
    except Exception:  # noqa: BLE001 - a report that cannot word itself still counts
        return ""
    return text.splitlines()[0] if text else ""


def observations_of(report: Any, where: Mapping[str, Any], ok: bool | None = None) -> list[dict[str, Any]]:
    """The observation(s) a verdict ``report`` (or ``None``) leaves with its context
    ``where``: one per (TP rank, request) for a per-rank report
    (``RankReport.outcomes``; ``where["modes"]``: each request's forward mode; an
    outcome of one chunk of a chunked prefill carries its own as a fifth item),
    else one."""
    base = {k: v for k, v in where.items() if k in Observation.__dataclass_fields__}
    if "ids" in base and base["ids"] is not None:
        base["ids"] = [int(i) for i in base["ids"]]
    passed = bool(getattr(report, "ok", True) if ok is None else ok)
    kinds = list(getattr(report, "kinds", ()) or ())
    slots = getattr(report, "slots", None) or []
    wrong = [v for v in slots if not v.ok]
    errors = [v.expected_err for v in slots if not math.isnan(v.expected_err)]
    right = bool(wrong) and all(v.best == v.expected for v in wrong)
    rows = getattr(report, "rows", None) or []
    if rows and not slots:
        # An embedding report: every row is compared with the embedding itself;
        # no zero row means the right snapshot, however far off.
        errors = [float(r.err) for r in rows if not math.isnan(float(r.err))]
        right = not passed and not any(getattr(r, "zero", False) for r in rows)
    line = "" if passed else _first_line(report)
    if not kinds and not passed:
        # A verdict that words its diagnosis: the ``[kind]`` tags of its text.
        kinds = list(dict.fromkeys(_TAG.findall(str(getattr(report, "text", "") or line))))
    slot_report = report if slots else getattr(report, "report", None)
    fields = {
        "ok": passed, "kinds": kinds,
        **_slot_fields(slot_report),
        "right_snapshots": right,
        # Which snapshots it examined (an embedding report: the embedding only) and got
        # wrong (a verdict's own comparison report, where it wraps one).
        "snapshots": [0] if rows and not slots else None,
        "wrong_snapshots": [int(v.expected) for v in (getattr(report, "slots", None)
                                                       or getattr(getattr(report, "report", None), "slots", None)
                                                       or []) if not v.ok],
        "worst_err": max(errors) if errors else None,
        "tol": getattr(report, "tol", None),
        "line": line,
    }
    outcomes = getattr(report, "outcomes", None)
    if outcomes:
        # A per-rank report: one observation per (rank, request), each with its
        # request's mode (``where["modes"]``, per request index).
        modes = list(where.get("modes") or [])
        out = []
        for rank, index, sub_ok, sub, *chunk in outcomes:
            entry = {**base, **observations_of(sub, {}, sub_ok)[0], "rank": int(rank)}
            if sub is not None:  # a comparison of request ``index`` (an agreement outcome indexes forwards)
                entry["request"] = int(index)
            if chunk:  # one chunk of a chunked prefill: its own mode, number, rows and slots
                entry.update(mode=chunk[0], chunk=int(chunk[1]), **_clipped(entry, chunk[2]))
                own = chunk[3] if len(chunk) > 3 else None
                if own is not None and not own.ok:  # the chunk's own comparison, not the whole request's
                    mine = observations_of(own, {}, False)[0]
                    entry.update({k: mine[k] for k in (*_SLOT_KEYS, "wrong_snapshots") if k in mine})
            elif index < len(modes):
                entry["mode"] = modes[index]
                entry["chunk"] = {"prefill": 1, "later-chunk": CHUNKS_JOINED}.get(modes[index], 0)
            out.append(entry)
        return out
    return [{**base, **fields}]


#: The fields :func:`_slot_fields` can set.
_SLOT_KEYS = ("slot_count", "wrong_slots", "rows", "wrong_rows")


def _slot_fields(report: Any) -> dict[str, Any]:
    """The slots and rows a slot comparison (:class:`~pytest_eagle3.verdicts.compare.SlotReport`)
    compared and got wrong, as :class:`~pytest_eagle3.verdicts.run_cause.Observation` fields."""
    slots = getattr(report, "slots", None) or ()
    if not slots:
        return {}
    out: dict[str, Any] = {"slot_count": len(slots), "wrong_slots": [int(v.slot) for v in slots if not v.ok]}
    first, count = getattr(report, "first_row", None), int(getattr(report, "row_count", 0) or 0)
    if isinstance(first, int) and count:
        out["rows"] = [first, first + count]
        out["wrong_rows"] = [list(r) for r in position_ranges(getattr(report, "wrong_rows", ()) or (), first)]
    return out


def _clipped(entry: Mapping[str, Any], span: Any) -> dict[str, Any]:
    """``entry``'s rows cut to one chunk's positions ``span`` (``(start, stop)``)."""
    a, b = int(span[0]), int(span[1])
    wrong = [[max(x, a), min(y, b)] for x, y in entry.get("wrong_rows") or () if min(y, b) > max(x, a)]
    return {"rows": [a, b], "wrong_rows": wrong}


class DiagnosisPlugin(TracksCurrentItem):
    """Collects the run's observations and prints the run-level diagnosis."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.observations: list[Observation] = []
        self._result: RunDiagnosis | None = None
        self._done = False
        self._failed: dict[str, str] = {}  # failed test -> its first line
        self._observed: set[str] = set()  # tests that left an observation

    def __hash__(self) -> int:
        return id(self)

    def observe(self, report: Any, where: Mapping[str, Any], ok: bool | None = None) -> None:
        """Record a verdict of the test in progress with its context (``where``:
        :class:`~pytest_eagle3.verdicts.run_cause.Observation` fields; ``test``
        and ``tp`` come from the test)."""
        item = self.item
        if item is None:
            return
        context = {"test": item.nodeid, "tp": item_tp(item), "check": "captures", **where}
        for entry in observations_of(report, context, ok):
            item.user_properties.append((OBSERVATION_PROPERTY, entry))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Generator[None, Any, Any]:
        report = yield
        if item.get_closest_marker("eagle3_engines") is not None:
            report.user_properties.append((PACKAGED_PROPERTY, True))  # ours: its failures count (xdist too)
        # Only a failure the diagnosis weighs: one that left evidence (not a setup error).
        evidence = any(k in (OBSERVATION_PROPERTY, "eagle3_accept_length") for k, _ in item.user_properties)
        if report.failed and report.when == "call" and evidence:
            report.sections.append((POINTER_SECTION, POINTER.format(title=TITLE)))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        ours = any(k == PACKAGED_PROPERTY for k, _ in report.user_properties)
        if ours and report.failed and not hasattr(report, "wasxfail") and report.nodeid not in self._failed:
            self._failed[report.nodeid] = _report_line(report)
        if report.when != "call":
            return
        props = report.user_properties
        if any(k in (OBSERVATION_PROPERTY, "eagle3_accept_length", "eagle3_offline") for k, _ in props):
            self._observed.add(report.nodeid)
        for key, value in props:
            if key == OBSERVATION_PROPERTY and isinstance(value, Mapping):
                self.observations.append(Observation.from_json(value))
        values = dict(props)
        if "eagle3_accept_length" in values and not hasattr(report, "wasxfail"):
            # A served draft's accept length against its gate (an XFAIL expects a collapse).
            self.observations.append(Observation(
                test=report.nodeid, check="acceptance", ok=report.passed, level=SERVED, tp=_tp_of(report.nodeid),
                path="speculative", mode="verify", value=float(values["eagle3_accept_length"]),
                line=_report_line(report)))
        offline = values.get("eagle3_offline")
        if isinstance(offline, Mapping) and CORRECT in offline:
            gates = values.get("eagle3_gates") or {}
            got = float(offline[CORRECT].get("accept_length", math.nan))
            gate = float(gates.get("min_accept_length", math.nan)) if isinstance(gates, Mapping) else math.nan
            ok = got >= gate if not math.isnan(gate) else report.passed
            self.observations.append(Observation(test=report.nodeid, check="acceptance", ok=bool(ok),
                                                 level=OFFLINE, tp=_tp_of(report.nodeid), path="speculative",
                                                 mode="verify", value=got))

    def result(self) -> RunDiagnosis | None:
        """The run's diagnosis (computed once, after the last test)."""
        if not self._done:
            unobserved = [(t, line) for t, line in self._failed.items() if t not in self._observed]
            self._result, self._done = diagnose_run(self.observations, unobserved), True
        return self._result

    def lines(self) -> list[str]:
        diag = self.result()
        return diag.lines() if diag is not None else []

    @pytest.hookimpl(wrapper=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> Generator[None, Any, Any]:
        # After every other section: the diagnosis closes the run's summary.
        result = yield
        if hasattr(self.config, "workerinput"):
            return result
        lines = self.lines()
        if lines:
            terminalreporter.section(TITLE, sep="-")
            for line in lines:
                terminalreporter.line(line)
        return result


def _tp_of(nodeid: str) -> int:
    found = _TP_IN_ID.search(nodeid)
    return int(found.group(1)) if found else 1


def _report_line(report: pytest.TestReport) -> str:
    if report.passed:
        return ""
    longrepr = report.longrepr
    text = str(getattr(longrepr, "reprcrash", None) and longrepr.reprcrash.message or longrepr or "")
    return text.splitlines()[0] if text else ""


def observe(config: pytest.Config | None, report: Any, where: Mapping[str, Any] | None,
            ok: bool | None = None) -> None:
    """Hand a verdict with its context to the run's :class:`DiagnosisPlugin` (no-op
    without ``config`` or ``where``, or when the plugin is not registered)."""
    if config is None or where is None:
        return
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if isinstance(plugin, DiagnosisPlugin):
        plugin.observe(report, where, ok)

