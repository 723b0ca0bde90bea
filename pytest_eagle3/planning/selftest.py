"""The self-test plan: which packaged tests must catch each injected fault.

The faults themselves live in :mod:`pytest_eagle3.worker.faults` (injected into
SGLang's own computation); each packaged test names the kinds it must catch with
``@pytest.mark.eagle3_catches(*kinds, need=..., tp=None)``, and this module
reads those markers from pytest's own collection of the suite (a child
``pytest --collect-only``: the suite sits above every other package, so it is
never imported here) to pick the smallest part of ``pytest_eagle3.suite`` that
must fail naming each kind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pytest_eagle3.worker.env import FIX_ENV
from pytest_eagle3.worker.faults import (
    CATALOG, NEEDS_DP_ROUTE, NEEDS_FUSED_ALLREDUCE, NEEDS_INPLACE_NORM, NEEDS_PP, NEEDS_TBO, NEEDS_TP, NEEDS_TREE,
)

__all__ = ["NEEDS_TP", "Catch", "contrast_plan", "suite_catches", "self_test_args", "self_test_env", "self_test_plan"]

#: The marker a packaged test names the fault kinds it must catch with.
CATCHES_MARK = "eagle3_catches"


@dataclass(frozen=True)
class Catch:
    """One ``eagle3_catches`` marker: ``test`` must fail naming each of ``kinds``
    on its engine need ``need`` (the test id's part after the TP: a case or a
    path variant), at TP ``tp`` when the marker fixes it.  ``contrast``: instead,
    ``test`` must pass with the fault on: the evidence that confines a kind the
    run-level diagnosis names (:data:`pytest_eagle3.worker.faults.RUN_LEVEL`)."""

    test: str
    kinds: tuple[str, ...]
    need: str
    tp: int | None = None
    contrast: bool = False

    def test_id(self, tp: int) -> str:
        """``test_capture_order[tp2-kimi-embedding-first]``."""
        return f"{self.test}[tp{tp}-{self.need}]"


#: The child pytest that collects the packaged suite with the markers plugin.
COLLECT_ARGS = ("--pyargs", "pytest_eagle3.suite", "--collect-only", "-q", "--tp", "8", "--device", "cpu",
                "--eagle3-slow", "-p", "no:cacheprovider", "-p", "pytest_eagle3.plugin.catches")
NO_NEED = "{test}: {mark} needs need="
COLLECT_FAILED = "collecting the packaged suite for its {mark} markers failed (exit {rc}): {tail}"


@lru_cache(maxsize=None)
def suite_catches() -> tuple[Catch, ...]:
    """Every ``eagle3_catches`` marker of the packaged suite as pytest collects it
    (a child ``pytest --collect-only`` with :mod:`pytest_eagle3.plugin.catches`:
    markers on a function, its class and its module ``pytestmark`` alike), in
    collection order, then in the order the decorators are written.

    Raises:
        ValueError: a marker without ``need=``, or the collection failed (its last line).
    """
    with tempfile.TemporaryDirectory(prefix="eagle3-catches-") as tmp:
        out = Path(tmp) / "catches.json"
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
        proc = subprocess.run([sys.executable, "-m", "pytest", *COLLECT_ARGS, "--eagle3-catches-out", str(out),
                               "--rootdir", tmp], cwd=tmp, env=env, capture_output=True, text=True)
        if not out.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
            raise ValueError(COLLECT_FAILED.format(mark=CATCHES_MARK, rc=proc.returncode, tail=tail[0]))
        collected = json.loads(out.read_text())
    return parse_catches(collected)


def parse_catches(collected: dict) -> tuple[Catch, ...]:
    """:class:`Catch` entries from :mod:`pytest_eagle3.plugin.catches`'s JSON (test name ->
    its markers' ``kinds``, ``need``, ``tp``).

    Raises:
        ValueError: a marker without ``need=`` (:data:`NO_NEED`).
    """
    found = []
    for test, marks in collected.items():
        for mark in marks:
            if mark["need"] is None:
                raise ValueError(NO_NEED.format(test=test, mark=CATCHES_MARK))
            found.append(Catch(test, tuple(mark["kinds"]), str(mark["need"]),
                               None if mark["tp"] is None else int(mark["tp"]), bool(mark.get("contrast"))))
    return tuple(found)


def self_test_plan(no_tp: int = 1) -> dict[str, tuple[int, tuple[str, ...]]]:
    """kind -> (TP size, ids of the packaged tests that must fail naming it): the
    smallest part of ``pytest_eagle3.suite`` that catches each fault, one engine
    per kind (``pytest-eagle3 self-test`` runs it; ``tests/e2e/test_fault_self_test.py``),
    from the suite's ``eagle3_catches`` markers (:func:`suite_catches`).

    Kinds in :data:`NEEDS_TP` run at TP 2, the others at ``no_tp``, unless the
    marker fixes the TP: ``offset-missing`` on the embedding-first list
    ``[0, 3, 5]`` would ask for layer -1, which SGLang never captures (the packer
    then stops the scheduler at the first forward: "captured 2 of 3"), so
    ``test_capture_order`` catches it on SpecForge's default list ``[1, 3, 4]``
    (SGLang: ``[2, 4, 5]``; faulted: ``[1, 3, 4]``), a TP 1 case.

    Raises:
        ValueError: markers give one kind two TP sizes (or as :func:`suite_catches`).
    """
    tps: dict[str, int] = {}
    tests: dict[str, list[str]] = {}
    for catch in suite_catches():
        if catch.contrast:
            continue
        for kind in catch.kinds:
            tp = catch.tp if catch.tp is not None else 2 if kind in NEEDS_TP else no_tp
            if tps.setdefault(kind, tp) != tp:
                raise ValueError(f"{CATCHES_MARK}: {kind} at TP {tps[kind]} and TP {tp} ({catch.test})")
            tests.setdefault(kind, []).append(catch.test_id(tp))
    order = [k for k in CATALOG if k in tests] + [k for k in tests if k not in CATALOG]
    return {k: (tps[k], tuple(tests[k])) for k in order}


def contrast_plan(no_tp: int = 1) -> dict[str, tuple[str, ...]]:
    """kind -> ids of the packaged tests that must pass with it on (``contrast=True``
    markers), at the kind's TP size in :func:`self_test_plan`: the evidence the
    run-level diagnosis confines it with."""
    plan = self_test_plan(no_tp)
    out: dict[str, list[str]] = {}
    for catch in suite_catches():
        if catch.contrast:
            for kind in catch.kinds:
                if kind in plan:
                    out.setdefault(kind, []).append(catch.test_id(plan[kind][0]))
    return {k: tuple(v) for k, v in out.items()}


def self_test_args(kind: str | None) -> tuple[str, ...]:
    """Child pytest arguments that put a fault's engine on the path where the
    fault lives: ``--eagle3-cpu-norm inplace`` for the kinds in
    :data:`~pytest_eagle3.worker.faults.NEEDS_INPLACE_NORM`,
    ``--eagle3-cpu-allreduce-fusion`` for those in
    :data:`~pytest_eagle3.worker.faults.NEEDS_FUSED_ALLREDUCE` (both act on cpu
    only; a GPU runs these paths natively), ``--eagle3-pp 2`` for those in
    :data:`~pytest_eagle3.worker.faults.NEEDS_PP`, ``--eagle3-slow`` for those in
    :data:`~pytest_eagle3.worker.faults.NEEDS_TBO`,
    :data:`~pytest_eagle3.worker.faults.NEEDS_DP_ROUTE` and
    :data:`~pytest_eagle3.worker.faults.NEEDS_TREE` (the ``two-batch-overlap`` and
    ``dp-attention`` variants run at TP 2 on cpu only with it, the token-tree
    engine at all).  ``None``: none."""
    if kind in NEEDS_INPLACE_NORM:
        return ("--eagle3-cpu-norm", "inplace")
    if kind in NEEDS_FUSED_ALLREDUCE:
        return ("--eagle3-cpu-allreduce-fusion",)
    if kind in NEEDS_PP:
        return ("--eagle3-pp", "2")
    if kind in NEEDS_TBO or kind in NEEDS_DP_ROUTE or kind in NEEDS_TREE:
        return ("--eagle3-slow",)
    return ()


#: The upstream fix a PP kind's engines run with: it relays each stage's captures, which the fault corrupts.
PP_FIX = "pp-capture-relay"
#: The upstream fix a TBO kind's engines run with: it captures per micro-batch and merges, which the
#: fault corrupts (without it 0.5.23's TBO engine dies: ``[tbo-uncaptured]``).
TBO_FIX = "tbo-capture-per-microbatch"


def self_test_env(kind: str | None) -> dict[str, str]:
    """Environment a fault's child run adds: :data:`FIX_ENV` = :data:`PP_FIX` for the kinds in
    :data:`~pytest_eagle3.worker.faults.NEEDS_PP`, :data:`TBO_FIX` for those in
    :data:`~pytest_eagle3.worker.faults.NEEDS_TBO`; ``{}`` for the others."""
    if kind in NEEDS_PP:
        return {FIX_ENV: PP_FIX}
    return {FIX_ENV: TBO_FIX} if kind in NEEDS_TBO else {}
