"""The model files of an installed SGLang package, parsed without importing them.

:class:`ModelFileReader` finds the class SGLang registers for an architecture
(the ``EntryClass`` of a file in ``srt/models/``; SGLang's
``srt/models/registry.py`` imports every such file and keys its entry classes
by ``__name__``), a method on that class or its bases (across files when a base
is imported from another model file), and the class ``__init__`` assigns to an
attribute (``self.model = DeepseekV2Model(...)``).  Used by
:mod:`pytest_eagle3.sglang_source.model_code`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

#: The method SGLang's model runner calls with the draft's ids.
METHOD = "set_eagle3_layers_to_capture"


@dataclass(frozen=True)
class ParsedFile:
    """One parsed model file: its classes and what it imports."""

    rel: str  # "srt/models/deepseek_v2.py"
    text: str
    tree: ast.Module
    classes: dict[str, ast.ClassDef]
    imports: dict[str, tuple[str, str]]  # local name -> (module dotted path, original name)
    module_aliases: dict[str, str]  # ``import sglang.srt.models.x as x`` -> {"x": "sglang.srt.models.x"}


@dataclass(frozen=True)
class FoundMethod:
    """A method definition found on a class of a parsed file."""

    module: ParsedFile
    cls: str
    node: ast.FunctionDef

    @property
    def where(self) -> str:
        return f"{self.module.rel}:{self.node.lineno}"

    @property
    def label(self) -> str:
        return f"{self.cls}.{self.node.name}"


class ModelFileReader:
    """Parses model files of one installed ``sglang`` package on demand."""

    def __init__(self, location: Path) -> None:
        self.location = Path(location)
        self._modules: dict[str, ParsedFile | None] = {}
        self.compiled: dict[tuple[str, int], Callable[..., Any]] = {}
        #: Base classes named in a file that no file here defines (``find_method`` could not look there).
        self.unresolved_bases: list[str] = []

    def module(self, rel: str) -> ParsedFile | None:
        if rel not in self._modules:
            self._modules[rel] = self._parse(rel)
        return self._modules[rel]

    def _parse(self, rel: str) -> ParsedFile | None:
        try:
            text = (self.location / rel).read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            return None
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        imports: dict[str, tuple[str, str]] = {}
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    imports[alias.asname or alias.name] = (node.module, alias.name)
                    aliases.setdefault(alias.asname or alias.name, f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        return ParsedFile(rel, text, tree, classes, imports, aliases)

    def entry_files(self, architecture: str) -> list[str]:
        """Model files whose ``EntryClass`` names ``architecture``."""
        found = []
        models = self.location / "srt" / "models"
        try:
            paths = sorted(models.glob("*.py"))
        except OSError:
            return []
        for path in paths:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError:
                continue
            if "EntryClass" not in text or architecture not in text:
                continue
            rel = f"srt/models/{path.name}"
            mod = self.module(rel)
            if mod is not None and architecture in entry_names(mod.tree):
                found.append(rel)
        return found

    def resolve_class(self, mod: ParsedFile, name: str, depth: int = 0) -> tuple[ParsedFile, ast.ClassDef] | None:
        if depth > 8:
            return None
        if name in mod.classes:
            return mod, mod.classes[name]
        if name in mod.imports:
            dotted, original = mod.imports[name]
            if dotted.startswith("sglang."):
                other = self.module(dotted[len("sglang."):].replace(".", "/") + ".py")
                if other is not None:
                    return self.resolve_class(other, original, depth + 1)
        return None

    def find_method(self, mod: ParsedFile, cls: ast.ClassDef, name: str, depth: int = 0) -> FoundMethod | None:
        """``name`` on ``cls`` or its bases, depth first, left to right (Python's MRO
        for the single-inheritance chains SGLang's model classes use)."""
        if depth > 12:
            return None
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return FoundMethod(mod, cls.name, node)
        for base in cls.bases:
            found = self._resolve_base(mod, base)
            if found is None:
                if not (isinstance(base, ast.Attribute) and base.attr == "Module") and not (
                        isinstance(base, ast.Name) and base.id in ("object", "Generic", "ABC")):
                    self.unresolved_bases.append(f"{mod.rel}:{cls.lineno} {cls.name}({ast.unparse(base)})")
                continue
            method = self.find_method(found[0], found[1], name, depth + 1)
            if method is not None:
                return method
        return None

    def class_attribute(self, mod: ParsedFile, cls: ast.ClassDef, name: str,
                        depth: int = 0) -> tuple[ParsedFile, ast.expr] | None:
        """``(file, value)`` of a class-level ``name = value`` on ``cls`` or its bases
        (0.5.23 ``srt/models/qwen3_5_text.py``: ``body_cls = qwen3_5.Qwen3_5ForCausalLM``);
        ``None`` where neither assigns it."""
        if depth > 12:
            return None
        for node in cls.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return mod, node.value
        for base in cls.bases:
            found = self._resolve_base(mod, base)
            if found is not None:
                held = self.class_attribute(found[0], found[1], name, depth + 1)
                if held is not None:
                    return held
        return None

    def _resolve_base(self, mod: ParsedFile, base: ast.AST) -> tuple[ParsedFile, ast.ClassDef] | None:
        if isinstance(base, ast.Name):
            return self.resolve_class(mod, base.id)
        if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            dotted = mod.module_aliases.get(base.value.id)
            if dotted and dotted.startswith("sglang."):
                other = self.module(dotted[len("sglang."):].replace(".", "/") + ".py")
                if other is not None:
                    return self.resolve_class(other, base.attr)
        return None

    def attribute_class(self, mod: ParsedFile, cls: ast.ClassDef, attr: str,
                        overrides: dict[str, tuple[ParsedFile, str]] | None = None,
                        depth: int = 0) -> tuple[ParsedFile, ast.ClassDef] | None:
        """The class ``__init__`` assigns to ``self.<attr>`` (``self.model = DeepseekV2Model(...)``,
        through a ``self._init_model(...)`` helper that returns one, or through a class
        parameter's default when ``cls`` defines that ``__init__``: 0.5.23
        ``srt/models/qwen3_vl.py``, ``self.model = language_model_cls(...)`` with
        ``language_model_cls=Qwen3LLMModel``, or through a class attribute:
        ``srt/models/qwen3_5_text.py``, ``self.model = self.body_cls(...)`` with
        ``body_cls = qwen3_5.Qwen3_5ForCausalLM``).  A subclass whose own ``__init__``
        only hands a parameter on to its base's sets that parameter's default for
        the base (``srt/models/qwen3_5.py``, ``Qwen3_5ForConditionalGeneration``:
        ``language_model_cls=Qwen3_5ForCausalLM``, then ``super().__init__``).
        ``None`` when it is chosen at run time or cannot be found."""
        init = self.find_method(mod, cls, "__init__")
        if init is None or depth > 8:
            return None
        overrides = dict(overrides or {})
        for node in ast.walk(init.node):
            if not isinstance(node, ast.Assign):
                continue
            if not any(isinstance(t, ast.Attribute) and t.attr == attr and is_self(t.value) for t in node.targets):
                continue
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                where, name = init.module, value.func.id
                if name in overrides:  # a parameter whose default a subclass set
                    where, name = overrides[name]
                elif init.cls == cls.name:  # a class parameter: its default, which this class's own init uses
                    name = parameter_default(init.node, name) or name
                found = self.resolve_class(where, name)
                if found is not None:
                    return found
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and is_self(value.func.value):
                held = self.class_attribute(mod, cls, value.func.attr)
                if held is not None:  # a class attribute that holds the class (``body_cls = qwen3_5.X``)
                    found = self._resolve_base(*held)
                    if found is not None:
                        return found
                helper = self.find_method(mod, cls, value.func.attr)
                if helper is not None:
                    for ret in ast.walk(helper.node):
                        if (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call)
                                and isinstance(ret.value.func, ast.Name)):
                            found = self.resolve_class(helper.module, ret.value.func.id)
                            if found is not None:
                                return found
        if init.cls == cls.name:  # this init assigns nothing: its base's does, with these defaults
            defaults = {k: (init.module, v) for k, v in parameter_defaults(init.node).items()}
            for base in cls.bases:
                found_base = self._resolve_base(mod, base)
                if found_base is not None:
                    found = self.attribute_class(*found_base, attr, {**defaults, **overrides}, depth + 1)
                    if found is not None:
                        return found
        return None


def parameter_defaults(func: ast.FunctionDef) -> dict[str, str]:
    """``{parameter: name}`` for each parameter of ``func`` that defaults to a plain name."""
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return {arg.arg: default.id for arg, default in pairs if isinstance(default, ast.Name)}


def parameter_default(func: ast.FunctionDef, name: str) -> str | None:
    """The name a parameter ``name`` of ``func`` defaults to (``language_model_cls=Qwen3LLMModel``),
    ``None`` when ``name`` is no parameter or its default is not a plain name."""
    return parameter_defaults(func).get(name)


def is_self(node: ast.AST) -> bool:
    """``node`` is the name ``self``."""
    return isinstance(node, ast.Name) and node.id == "self"


def entry_names(tree: ast.Module) -> list[str]:
    """The class names a model file's ``EntryClass`` lists."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            names += [n.id for n in items if isinstance(n, ast.Name)]
    return names
