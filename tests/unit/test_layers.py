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
    frozenset({"errors", "libversions", "conventions", "reaper", "settings"}),  # shared facts and utilities
    frozenset({"worker"}),        # code that runs inside SGLang's processes: hooks, fills, faults, recorder
    frozenset({"sglang_source", "stack_source"}),  # static readers of SGLang's and the training stacks' files
    frozenset({"target"}),        # spec -> checkpoint -> reference
    frozenset({"engine"}),        # SGLang in a subprocess: config, recipes, server, pool, leases, variants
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
    "worker/sglang_hooks.py", "worker/site_hook/sitecustomize.py",
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


# ------------------------------------------------------------------ inside a package


def module_of(path: Path, root: Path) -> str:
    """``root/engine/cpu/recipe.py`` -> ``pytest_eagle3.engine.cpu.recipe`` (``__init__`` -> its package)."""
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("pytest_eagle3", *parts))


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the ``pytest_eagle3`` modules it imports (anywhere in the file).

    ``from package import name`` counts as an import of the submodule ``name``
    when there is one, else of the package."""
    files = {module_of(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")
                    base = base[: len(base) - node.level + (1 if is_package else 0)]
                    pkg = ".".join([*base, node.module] if node.module else base)
                else:
                    pkg = node.module or ""
                targets = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in files else pkg for a in node.names]
            else:
                continue
            for name in targets:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != module and name != "pytest_eagle3":
                    edges.add(name)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_import_circle_between_modules() -> None:
    """No module imports itself through others, inside a package or across packages."""
    cycles = import_cycles(import_graph(ROOT))
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_circle_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "a.py").write_text("from pytest_eagle3.engine import b\n")
    (tmp_path / "engine" / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "engine" / "c.py").write_text("import pytest_eagle3.engine.a\n")
    (tmp_path / "engine" / "d.py").write_text("from pytest_eagle3.engine.a import x\n")
    assert import_cycles(import_graph(tmp_path)) == [
        ["pytest_eagle3.engine.a", "pytest_eagle3.engine.b", "pytest_eagle3.engine.c"]]


#: The longest a module of the package may be, in lines.
MAX_MODULE_LINES = 450


def long_modules(root: Path) -> list[str]:
    return [f"{p.relative_to(root).as_posix()}: {n} lines" for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) >= MAX_MODULE_LINES]


def test_every_module_is_under_450_lines() -> None:
    """One job per module; a module that grows past this is doing two."""
    long = long_modules(ROOT)
    assert not long, f"modules of {MAX_MODULE_LINES} lines or more:\n" + "\n".join(long)


def test_the_length_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "small.py").write_text("x = 1\n" * (MAX_MODULE_LINES - 1))
    assert long_modules(tmp_path) == [f"big.py: {MAX_MODULE_LINES} lines"]
