"""The self-test plan: which packaged tests must catch each injected fault.

The faults themselves live in :mod:`pytest_eagle3.worker.faults` (injected into
SGLang's own computation); each packaged test names the kinds it must catch with
``@pytest.mark.eagle3_catches(*kinds, need=..., tp=None)``, and this module
reads those markers from the suite's source (``pytest_eagle3/suite/test_*.py``,
parsed, not imported: the suite sits above every other package) to pick the
smallest part of ``pytest_eagle3.suite`` that must fail naming each kind.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pytest_eagle3.worker.faults import CATALOG, NEEDS_FUSED_ALLREDUCE, NEEDS_INPLACE_NORM, NEEDS_TP
from pytest_eagle3.planning import cases

__all__ = ["NEEDS_TP", "Catch", "suite_catches", "self_test_args", "self_test_plan"]

#: The packaged suite's test modules.
SUITE_DIR = Path(__file__).resolve().parent.parent / "suite"
#: The marker a packaged test names the fault kinds it must catch with.
CATCHES_MARK = "eagle3_catches"


@dataclass(frozen=True)
class Catch:
    """One ``eagle3_catches`` marker: ``test`` must fail naming each of ``kinds``
    on its engine need ``need`` (the test id's part after the TP: a case or a
    path variant), at TP ``tp`` when the marker fixes it."""

    test: str
    kinds: tuple[str, ...]
    need: str
    tp: int | None = None

    def test_id(self, tp: int) -> str:
        """``test_capture_order[tp2-kimi-embedding-first]``."""
        return f"{self.test}[tp{tp}-{self.need}]"


def _value(node: ast.expr, where: str) -> object:
    """A marker argument: a literal, or a constant of :mod:`pytest_eagle3.planning.cases`."""
    if isinstance(node, ast.Constant):
        return node.value
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    if name is not None and hasattr(cases, name):
        return getattr(cases, name)
    raise ValueError(f"{where}: {CATCHES_MARK} takes literals or pytest_eagle3.planning.cases constants, "
                     f"not {ast.unparse(node)}")


def _catches_of(path: Path) -> list[Catch]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test"):
            continue
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                    and dec.func.attr == CATCHES_MARK):
                continue
            where = f"{path.name}:{dec.lineno}"
            kw = {k.arg: _value(k.value, where) for k in dec.keywords}
            if "need" not in kw:
                raise ValueError(f"{where}: {CATCHES_MARK} needs need=")
            found.append(Catch(fn.name, tuple(str(_value(a, where)) for a in dec.args), str(kw["need"]),
                               None if kw.get("tp") is None else int(kw["tp"])))  # type: ignore[call-overload]
    return found


@lru_cache(maxsize=None)
def suite_catches(suite_dir: Path = SUITE_DIR) -> tuple[Catch, ...]:
    """Every ``eagle3_catches`` marker of the suite's test modules, in file
    order, then in the order the decorators are written.

    Raises:
        ValueError: a marker without ``need=`` or with an argument that is
            neither a literal nor a constant of :mod:`pytest_eagle3.planning.cases`.
    """
    return tuple(c for path in sorted(Path(suite_dir).glob("test_*.py")) for c in _catches_of(path))


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
        for kind in catch.kinds:
            tp = catch.tp if catch.tp is not None else 2 if kind in NEEDS_TP else no_tp
            if tps.setdefault(kind, tp) != tp:
                raise ValueError(f"{CATCHES_MARK}: {kind} at TP {tps[kind]} and TP {tp} ({catch.test})")
            tests.setdefault(kind, []).append(catch.test_id(tp))
    order = [k for k in CATALOG if k in tests] + [k for k in tests if k not in CATALOG]
    return {k: (tps[k], tuple(tests[k])) for k in order}


def self_test_args(kind: str | None) -> tuple[str, ...]:
    """Child pytest arguments that put a fault's engine on the path where the
    fault lives: ``--eagle3-cpu-norm inplace`` for the kinds in
    :data:`~pytest_eagle3.worker.faults.NEEDS_INPLACE_NORM`,
    ``--eagle3-cpu-allreduce-fusion`` for those in
    :data:`~pytest_eagle3.worker.faults.NEEDS_FUSED_ALLREDUCE` (both act on cpu
    only; a GPU runs these paths natively).  ``None``: none."""
    if kind in NEEDS_INPLACE_NORM:
        return ("--eagle3-cpu-norm", "inplace")
    if kind in NEEDS_FUSED_ALLREDUCE:
        return ("--eagle3-cpu-allreduce-fusion",)
    return ()
