"""Readers of one fact in one Python file of a stack, by its syntax tree (``ast``).

Each reader finds its anchor (a function or class, by qualified name such as
``ArrowDataset._get_raw_data``) and returns what it found there as one line of
normalized text (``ast.unparse``: comments and line breaks do not count), with
the anchor's lines.  A fact holds when that text equals the recorded one
(:mod:`pytest_eagle3.stack_source.facts`).  Nothing is imported or executed.
Stdlib only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, Sequence

Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True)
class Found:
    """What a reader found.

    Attributes:
        text: the normalized text compared with the recorded fact.
        first_line: the anchor's first line (1-based), ``None`` for facts about a whole file.
        last_line: its last line.
        context: lines of the anchor that show what is there instead, when the text is not the recorded one.
    """

    text: str
    first_line: int | None = None
    last_line: int | None = None
    context: tuple[str, ...] = ()

    @property
    def lines(self) -> str:
        """``"103-140"``, ``"103"`` or ``""``."""
        if self.first_line is None:
            return ""
        if self.last_line in (None, self.first_line):
            return str(self.first_line)
        return f"{self.first_line}-{self.last_line}"


def find_scope(tree: ast.AST, qualname: str) -> Scope | None:
    """The function or class ``qualname`` (``Class.method``, ``func``) at module level or nested, else ``None``."""
    node: ast.AST = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        match = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.name == part), None)
        if match is None:
            return None
        node = match
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None


def _statements(scope: Scope) -> Iterator[ast.stmt]:
    for node in ast.walk(scope):
        if isinstance(node, ast.stmt) and node is not scope:
            yield node


def _mentioning(scope: Scope, word: str) -> tuple[str, ...]:
    """Simple statements of ``scope`` whose text mentions ``word``, as ``LINE: text``."""
    out = []
    for stmt in _statements(scope):
        if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef)):
            continue
        text = ast.unparse(stmt)
        if word in text:
            out.append(f"{stmt.lineno}: {text.splitlines()[0][:160]}")
    return tuple(sorted(set(out), key=lambda s: int(s.split(":")[0])))[:6]


def _found(scope: Scope, text: str, context: tuple[str, ...] = ()) -> Found:
    return Found(text, scope.lineno, scope.end_lineno, context)


@dataclass(frozen=True)
class Returns:
    """The expression ``qualname`` returns (its last ``return`` with a value)."""

    qualname: str

    def read(self, scope: Scope) -> Found:
        values = [s.value for s in _statements(scope) if isinstance(s, ast.Return) and s.value is not None]
        if not values:
            return _found(scope, "returns nothing")
        return _found(scope, ast.unparse(max(values, key=lambda v: v.lineno)))


@dataclass(frozen=True)
class AssignedLiteral:
    """The first list or tuple literal ``qualname`` assigns to the name ``target``."""

    qualname: str
    target: str

    def read(self, scope: Scope) -> Found:
        for stmt in _statements(scope):
            if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.List, ast.Tuple))
                    and any(isinstance(t, ast.Name) and t.id == self.target for t in stmt.targets)):
                return _found(scope, ast.unparse(stmt.value))
        return _found(scope, f"no list assigned to {self.target}", _mentioning(scope, self.target))


def _keys(scope: Scope) -> list[str]:
    """``obj.key`` for every ``getattr(obj, "key")``, ``obj.get("key")`` and ``obj["key"]`` in source order."""
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(scope):
        obj: ast.AST | None = None
        key: ast.AST | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2:
            obj, key = node.args[0], node.args[1]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args:
            obj, key = node.func.value, node.args[0]
        elif isinstance(node, ast.Subscript):
            obj, key = node.value, node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((node.lineno, node.col_offset, f"{ast.unparse(obj)}.{key.value}"))
    return [k for _, _, k in sorted(found)]


@dataclass(frozen=True)
class KeysRead:
    """The config keys ``qualname`` reads, in source order (``hf_config.eagle_aux_hidden_state_layer_ids``, ...)."""

    qualname: str

    def read(self, scope: Scope) -> Found:
        return _found(scope, ", ".join(_keys(scope)) or "reads no key")


@dataclass(frozen=True)
class Contains:
    """Whether ``qualname`` holds each snippet (as ``ast.unparse`` writes it); ``word``:
    what the context lines of a changed function mention."""

    qualname: str
    snippets: Sequence[str]
    word: str

    def read(self, scope: Scope) -> Found:
        body = ast.unparse(scope)
        parts = [s if s in body else f"no `{s}`" for s in self.snippets]
        missing = any(p.startswith("no `") for p in parts)
        return _found(scope, "; ".join(parts), _mentioning(scope, self.word) if missing else ())


@dataclass(frozen=True)
class Order:
    """Whether, in ``qualname``, the first statement holding the text ``first``
    comes before the first holding ``then`` (as ``ast.unparse`` writes them)."""

    qualname: str
    first: str
    then: str

    def read(self, scope: Scope) -> Found:
        lines: dict[str, int | None] = {self.first: None, self.then: None}
        for stmt in _statements(scope):
            if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                continue
            text = ast.unparse(stmt)
            for pattern in lines:
                if lines[pattern] is None and pattern in text:
                    lines[pattern] = stmt.lineno
        a, b = lines[self.first], lines[self.then]
        if a is None or b is None:
            gone = self.first if a is None else self.then
            return _found(scope, f"no statement holding `{gone}`")
        return _found(scope, f"`{self.first}` {'before' if a < b else 'after'} `{self.then}`",
                      (f"{a}: {self.first}", f"{b}: {self.then}"))


Reader = Returns | AssignedLiteral | KeysRead | Contains | Order


def read(source: str, reader: Reader) -> Found | None:
    """Run ``reader`` on a file's ``source``; ``None`` when its anchor is not in the file.

    Raises:
        SyntaxError: the file is not Python this interpreter can parse.
    """
    scope = find_scope(ast.parse(source), reader.qualname)
    return None if scope is None else reader.read(scope)
