"""Contract fixtures: ``fixtures/contracts/*.json``, each a draft config a user could write.

File format (JSON object)::

    {"name": "specforge-default-ids",
     "description": "...",
     "stack": "specforge-hf",             # a STACKS name
     "ids": [1, "L//2-1", "L-4"],         # or null: the config declares no ids
     "options": {},                       # optional translator options
     "expected": "[out(L1), out(L3), out(L4)]",   # human form on FIXTURE_NUM_LAYERS layers
     "notes": "..."}

An id is an int or an expression in ``L`` (the target's layer count) with
``+ - * //`` and int literals, so one fixture scales to any target.  ``ids`` is
both what the stack was given and what the draft config declares.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_eagle3.contracts.contract import Contract
from pytest_eagle3.contracts.stacks import translate
from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.target.spec import fixtures_dir

#: The layer count ``expected`` is written for (tiny-dsv3).
FIXTURE_NUM_LAYERS = 8

BAD_FIXTURE_MSG = "contract fixture {path} is invalid: {error}"
BAD_EXPR_MSG = "id {expr!r} is not an int or an expression in L with + - * // and ints"
_KEYS = frozenset({"name", "description", "stack", "ids", "options", "expected", "notes"})
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b}


def eval_id(expr: int | str, num_layers: int) -> int:
    """``3`` -> 3, ``"L//2-1"`` -> ``num_layers // 2 - 1`` (no names but ``L``, no calls).

    Raises:
        Eagle3ContractError: anything else.
    """
    if isinstance(expr, int) and not isinstance(expr, bool):
        return expr

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id == "L":
            return num_layers
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(node)

    try:
        if not isinstance(expr, str):
            raise ValueError(expr)
        return ev(ast.parse(expr.strip(), mode="eval"))
    except (ValueError, SyntaxError):
        raise Eagle3ContractError(BAD_EXPR_MSG.format(expr=expr)) from None


@dataclass(frozen=True)
class ContractFixture:
    """One fixture resolved for a target.

    Attributes:
        name, description, stack, expected, notes: from the file.
        ids_spec: ``ids`` as written (ints and expressions), None for no ids.
        ids: ``ids`` evaluated for ``num_layers``: what the draft config declares.
        options: translator options from the file.
        num_layers: the target's layer count it was resolved for.
        contract: the translated contract, None when it is invalid on this target.
        error: why it is invalid on this target (the translator's message), else None.
        file: the fixture file.
    """

    name: str
    description: str
    stack: str
    ids_spec: tuple[int | str, ...] | None
    ids: tuple[int, ...] | None
    expected: str
    notes: str
    num_layers: int
    contract: Contract | None
    error: str | None = None
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    file: Path | None = None

    @property
    def declares_ids(self) -> bool:
        return self.ids is not None


def contracts_dir() -> Path:
    """``fixtures/contracts`` (``pytest_eagle3/data/contracts`` in a wheel)."""

    return fixtures_dir() / "contracts"


def load_contract_fixture(
    file: str | Path,
    num_layers: int,
    *,
    hidden_size: int | None = None,
    sglang_version: str | None = None,
) -> ContractFixture:
    """Read one fixture file and translate it for an ``num_layers``-layer target.

    A fixture whose ids the stack rejects on this target (e.g. EAGLE's layers
    collapsing on 6 layers) comes back with ``contract=None`` and ``error`` set;
    a malformed file raises.

    Raises:
        Eagle3ContractError: unreadable JSON, unknown or missing keys, a bad id expression.
    """
    path = Path(file)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        unknown = set(data) - _KEYS
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
        missing = {"name", "stack", "ids", "expected"} - set(data)
        if missing:
            raise ValueError(f"missing keys {sorted(missing)}")
        spec = data["ids"]
        if spec is not None and not isinstance(spec, list):
            raise ValueError(f"ids must be a list or null, got {spec!r}")
        options = dict(data.get("options") or {})
    except (OSError, ValueError) as exc:
        raise Eagle3ContractError(BAD_FIXTURE_MSG.format(path=path, error=exc)) from None
    ids = None if spec is None else tuple(eval_id(v, num_layers) for v in spec)
    if data["stack"] == "specforge-sglang" and "sglang_version" not in options and sglang_version:
        options["sglang_version"] = sglang_version
    contract, error = None, None
    try:
        contract = translate(
            data["stack"], ids, num_layers=num_layers, hidden_size=hidden_size,
            source=f"fixture {data['name']}", **options,
        )
    except Eagle3ContractError as exc:
        error = str(exc)
    return ContractFixture(
        name=str(data["name"]), description=str(data.get("description", "")), stack=str(data["stack"]),
        ids_spec=None if spec is None else tuple(spec), ids=ids, expected=str(data["expected"]),
        notes=str(data.get("notes", "")), num_layers=num_layers, contract=contract, error=error,
        options=options, file=path,
    )


def load_contract_fixtures(
    num_layers: int,
    *,
    hidden_size: int | None = None,
    sglang_version: str | None = None,
    directory: str | Path | None = None,
) -> list[ContractFixture]:
    """Every ``*.json`` in ``directory`` (default :func:`contracts_dir`), sorted by name.

    Raises:
        Eagle3ContractError: a malformed file, or two files with one name.
    """
    d = Path(directory) if directory is not None else contracts_dir()
    out = [
        load_contract_fixture(f, num_layers, hidden_size=hidden_size, sglang_version=sglang_version)
        for f in sorted(d.glob("*.json"))
    ]
    names = [f.name for f in out]
    for n in names:
        if names.count(n) > 1:
            raise Eagle3ContractError(f"two contract fixtures in {d} are named {n!r}")
    return sorted(out, key=lambda f: f.name)
