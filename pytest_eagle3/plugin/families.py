"""``--eagle3-target families``: the suite once per model-family preset.

Every other target is one model for the whole session (its checkpoint,
reference and engines are session-wide); ``families`` runs the same pytest
command once per family preset (the packaged presets that are not DeepSeek-V3,
:func:`family_presets`, read from ``fixtures/targets``), each in its own pytest process with
``--eagle3-target <preset>`` (and, with ``--eagle3-report FILE``, its own
``FILE-<preset>.json``; likewise ``--junitxml`` and pytest-html's ``--html``
get ``-<preset>`` before their suffix, so no family overwrites another's
file), one after another, its output streamed as it comes,
and ends with one line per family.  It starts with the installed SGLang's
EAGLE-3 model files that no preset covers, each with why (also under
``--eagle3-plan``, which each child then plans).  The exit status is the worst of theirs:
a usage or internal error (a child killed by a signal counts as one), else
failed tests, else 0 (all "no tests" is 5).  Ctrl-C reaches the running child
too; the parent waits for it to stop its engines, then stops.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.sglang_source.install import locate
from pytest_eagle3.target.checkpoint.families import is_deepseek
from pytest_eagle3.target.family_coverage import coverage, summary
from pytest_eagle3.target.spec import preset_configs

#: The ``--eagle3-target`` value that selects every family preset.
FAMILIES = "families"
HEADER = "=== eagle3 family {preset} ({i}/{n}): {command}"
SUMMARY = "eagle3 family {preset}: {outcome} (exit {code}, {seconds:.0f} s)"
#: Before the children: the coverage of the installed SGLang's EAGLE-3 model files.
COVERAGE = "eagle3 families: {summary}"
NOT_RUN = "eagle3 family file not run: {file}: {reason}"
_OUTCOMES = {0: "passed", 1: "tests failed", 2: "interrupted", 3: "internal error", 4: "usage error",
             5: "no tests collected"}


def family_presets() -> list[str]:
    """The packaged target presets whose ``config.json`` is not DeepSeek-V3, sorted."""
    return [name for name, config in preset_configs().items() if not is_deepseek(config)]


#: Per-run output files a child would overwrite: (option dest, flag, default suffix).
#: ``xmlpath`` is pytest's ``--junitxml``; ``htmlpath`` is pytest-html's ``--html``.
OUTPUT_FILES = (("xmlpath", "--junitxml", ".xml"), ("htmlpath", "--html", ".html"))


def _report_for(report: Path, preset: str, suffix: str = ".json") -> Path:
    return report.with_name(f"{report.stem}-{preset}{report.suffix or suffix}")


def child_args(config: pytest.Config, preset: str, report: Path | None) -> list[str]:
    """The child pytest's arguments for ``preset``: the invoking ones, then
    ``--eagle3-target preset`` and a per-preset name for every output file
    given (``--eagle3-report``, ``--junitxml``, ``--html``); later options win."""
    child = [*config.invocation_params.args, "--eagle3-target", preset]
    if report is not None:
        child += ["--eagle3-report", str(_report_for(report, preset))]
    for dest, flag, suffix in OUTPUT_FILES:
        path = getattr(config.option, dest, None)
        if path:
            child.append(f"{flag}={_report_for(Path(path), preset, suffix)}")
    return child


def worst(codes: list[int]) -> int:
    """Exit status of the whole run from the per-family ones: a child killed by a
    signal (negative status) or exiting outside pytest's 0-5 counts as an
    internal error (3); no family at all is "no tests" (5)."""
    if not codes:
        return 5
    codes = [c if 0 <= c <= 5 else 3 for c in codes]
    for bad in (3, 4, 2):
        if bad in codes:
            return bad
    if 1 in codes:
        return 1
    if all(c == 5 for c in codes):
        return 5
    return 0


def coverage_lines() -> list[str]:
    """One line saying how many of the installed SGLang's EAGLE-3 model files the
    family presets cover, then one per file they do not, with why
    (:mod:`pytest_eagle3.target.family_coverage`); nothing when SGLang is missing
    (each child then says so)."""
    try:
        _version, location = locate()
    except Eagle3Error:
        return []
    items = coverage(location)
    return [COVERAGE.format(summary=summary(items))] + [
        NOT_RUN.format(file=c.family.file, reason=c.reason()) for c in items if not c.presets]


def run_families(config: pytest.Config, report: Path | None) -> int:
    """Run the invoking pytest command once per :func:`family_presets` entry; returns the exit status."""
    presets = family_presets()
    for line in coverage_lines():
        print(line, flush=True)
    results = []
    for i, preset in enumerate(presets, 1):
        child = child_args(config, preset, report)
        command = [sys.executable, "-m", "pytest", *child]
        print(HEADER.format(preset=preset, i=i, n=len(presets), command=" ".join(child)), flush=True)
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=config.invocation_params.dir)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            # The child got the same SIGINT: let it stop its engines and write its report.
            proc.wait()
            code = 2
        results.append((preset, code, time.monotonic() - start))
        if code == 2:
            break
    print("", flush=True)
    for preset, code, seconds in results:
        print(SUMMARY.format(preset=preset, outcome=_OUTCOMES.get(code, "exit status"), code=code,
                             seconds=seconds), flush=True)
    return worst([code for _, code, _ in results])
