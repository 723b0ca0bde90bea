"""Imports run one way: each package of ``pytest_eagle3`` imports only packages
below it in :data:`LAYERS` (function-level and ``TYPE_CHECKING`` imports
included), so the data path spec -> checkpoint -> engine -> captures -> verdict
reads in the file list and no two packages depend on each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_eagle3

ROOT = Path(pytest_eagle3.__file__).parent
#: Bottom to top.  A package may import its own modules and any package of a
#: lower layer; packages of one layer do not import each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "libversions", "conventions", "reaper"}),  # shared facts and utilities
    frozenset({"target"}),        # spec -> checkpoint -> reference
    frozenset({"engine"}),        # SGLang in a subprocess, its install, CPU/CUDA recipes, faults
    frozenset({"capture"}),       # aux hidden states out of a running engine
    frozenset({"verdicts"}),      # captures against the reference
    frozenset({"contracts"}),     # training contracts and what a draft declares
    frozenset({"draft"}),         # EAGLE-3 drafts: build, train, offline power
    frozenset({"planning"}),      # which engines and cases a run needs
    frozenset({"plugin", "cli"}),  # pytest and the command line
    frozenset({"suite"}),         # the packaged tests
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def unit_of(path: Path) -> str:
    """``pytest_eagle3/engine/cpu/recipe.py`` -> ``engine``; ``pytest_eagle3/errors.py`` -> ``errors``."""
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_units(path: Path) -> list[tuple[int, str]]:
    """``(line, unit)`` of every ``pytest_eagle3`` import in a file, wherever it sits."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(("pytest_eagle3", *path.relative_to(ROOT).with_suffix("").parts))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: -node.level] if path.name != "__init__.py" else \
                    package.split(".")[: len(package.split(".")) - node.level]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names = [module] if module != "pytest_eagle3" else [f"pytest_eagle3.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "pytest_eagle3" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def violations() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        src = unit_of(path)
        if src == "__init__":
            continue
        for line, dst in imported_units(path):
            if dst == src or dst not in RANK:
                continue
            if src not in RANK:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {src} is in no layer")
            elif RANK[dst] >= RANK[src]:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {src} imports {dst} "
                           f"({'same layer' if RANK[dst] == RANK[src] else 'a layer above'})")
    return bad


def test_every_package_has_a_layer() -> None:
    units = {unit_of(p) for p in ROOT.rglob("*.py")} - {"__init__"}
    assert units <= set(RANK), f"not in LAYERS: {sorted(units - set(RANK))}"


def test_imports_run_one_way() -> None:
    bad = violations()
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_the_walker_sees_function_level_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: an import inside a function, against the order, is found."""
    fake = tmp_path / "pytest_eagle3"
    (fake / "engine").mkdir(parents=True)
    (fake / "engine" / "x.py").write_text("def f():\n    from pytest_eagle3.plugin import options\n")
    (fake / "target").mkdir()
    (fake / "target" / "y.py").write_text("if 1:\n    import pytest_eagle3.verdicts.compare\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    assert violations() == ["pytest_eagle3/engine/x.py:2: engine imports plugin (a layer above)",
                            "pytest_eagle3/target/y.py:2: target imports verdicts (a layer above)"]


#: Modules that run inside SGLang's own processes and load a hook set only when
#: it is enabled (its modules import torch and SGLang at their top): there, and
#: only there, a function imports pytest_eagle3 modules.
LAZY_HOOK_LOADERS = frozenset({
    "engine/sglang_hooks.py", "engine/site_hook/sitecustomize.py", "engine/cpu/patches.py",
})


def function_level_imports(root: Path) -> list[str]:
    """``path:line: module`` of every ``pytest_eagle3`` import inside a function."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." * node.level + (node.module or "")]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] == "pytest_eagle3" or name.startswith("."):
                        found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {name}")
    return found


def test_own_modules_are_imported_at_module_top() -> None:
    """Imports inside functions only for torch, transformers and sglang (and the
    hook loaders that run inside SGLang's processes)."""
    inside = [f for f in function_level_imports(ROOT) if f.split(":")[0] not in LAZY_HOOK_LOADERS]
    assert not inside, "pytest_eagle3 modules imported inside functions:\n" + "\n".join(inside)


def test_the_top_import_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "x.py").write_text("import torch\n\ndef f():\n    import torch\n"
                                               "    from pytest_eagle3.target import spec\n")
    assert function_level_imports(tmp_path) == ["engine/x.py:5: pytest_eagle3.target"]
