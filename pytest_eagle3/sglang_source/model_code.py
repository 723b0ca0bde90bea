"""The installed SGLang's EAGLE-3 capture rules, read from its model files.

SGLang decides which residual-stream snapshots feed an EAGLE-3 draft in the
*target model's* file, and the rule differs between model files of one release
(sglang 0.5.23: ``deepseek_v2.py`` adds 1 only when the first id is 1,
``llama.py`` always adds 1, ``gpt_oss.py`` keeps ids whose largest is ``L``)
and between a fork and the upstream release its version number suggests
(sglang-kt 0.7.2 adds 1 to every id, like upstream 0.5.12).  So nothing here
looks at a version number.  For the architecture a target's ``config.json``
names, this module:

1. finds the class SGLang registers for it: the ``EntryClass`` of a file in
   ``srt/models/`` (SGLang's ``srt/models/registry.py`` imports every such file
   and keys its entry classes by ``__name__``);
2. finds ``set_eagle3_layers_to_capture`` on that class or its bases, across
   files when a base is imported from another model file, and follows
   delegation (``self.language_model.set_eagle3_layers_to_capture(...)``,
   ``kimi_k25.py``) to the class the constructor assigns;
3. compiles that one method from the installed source and runs it on a
   stand-in ``self`` (a config with ``num_hidden_layers = L``, an inner model
   with ``L`` layers), reading back the ``layers_to_capture`` it sets: the
   rule *is* SGLang's code, run on the id list asked about;
4. reads the capture loop of the inner model's ``forward`` to tell whether
   layer 0 (the embedding, ``hs[0]``) can be captured: a capture of
   ``hidden_states + residual`` while ``residual`` is still ``None`` before
   layer 0 is a ``TypeError`` at the first forward (upstream <= 0.5.13 and
   sglang-kt 0.7.2 ``deepseek_v2.py``); a capture handed to the decoder layer
   (``captured_last_layer_outputs=`` since 0.5.14) or guarded against ``None``
   can.

Nothing imports SGLang (a fork's modules may crash at import on a CPU
machine); reading and running the rule takes well under a second.
:func:`read_rules` returns an :class:`~pytest_eagle3.conventions.IdRule` whose
``source`` names the file and line, or one whose kind is ``unknown`` with the
reason, never a guess.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pytest_eagle3.conventions import (
    EmbeddingCapture,
    IdRule,
    SetupFailed,
    classify,
    unknown_rule,
)

#: The method SGLang's model runner calls with the draft's ids.
METHOD = "set_eagle3_layers_to_capture"
#: Attributes whose assignment in ``__init__`` names a delegate or inner model.
_DELEGATES = ("model", "language_model")
#: Names of the list the capture loop reads.
_CAPTURE_NAMES = ("layers_to_capture", "_is_layer_to_capture")


@dataclass(frozen=True)
class _Module:
    rel: str  # "srt/models/deepseek_v2.py"
    text: str
    tree: ast.Module
    classes: dict[str, ast.ClassDef]
    imports: dict[str, tuple[str, str]]  # local name -> (module dotted path, original name)
    module_aliases: dict[str, str]  # ``import sglang.srt.models.x as x`` -> {"x": "sglang.srt.models.x"}


@dataclass(frozen=True)
class _Method:
    module: _Module
    cls: str
    node: ast.FunctionDef

    @property
    def where(self) -> str:
        return f"{self.module.rel}:{self.node.lineno}"

    @property
    def label(self) -> str:
        return f"{self.cls}.{self.node.name}"


class _Reader:
    """Parses model files of one installed ``sglang`` package on demand."""

    def __init__(self, location: Path) -> None:
        self.location = Path(location)
        self._modules: dict[str, _Module | None] = {}
        self.compiled: dict[tuple[str, int], Callable[..., Any]] = {}
        #: Base classes named in a file that no file here defines (``find_method`` could not look there).
        self.unresolved_bases: list[str] = []

    def module(self, rel: str) -> _Module | None:
        if rel not in self._modules:
            self._modules[rel] = self._parse(rel)
        return self._modules[rel]

    def _parse(self, rel: str) -> _Module | None:
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
        return _Module(rel, text, tree, classes, imports, aliases)

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
            if mod is not None and architecture in _entry_names(mod.tree):
                found.append(rel)
        return found

    def resolve_class(self, mod: _Module, name: str, depth: int = 0) -> tuple[_Module, ast.ClassDef] | None:
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

    def find_method(self, mod: _Module, cls: ast.ClassDef, name: str, depth: int = 0) -> _Method | None:
        """``name`` on ``cls`` or its bases, depth first, left to right (Python's MRO
        for the single-inheritance chains SGLang's model classes use)."""
        if depth > 12:
            return None
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return _Method(mod, cls.name, node)
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

    def _resolve_base(self, mod: _Module, base: ast.AST) -> tuple[_Module, ast.ClassDef] | None:
        if isinstance(base, ast.Name):
            return self.resolve_class(mod, base.id)
        if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            dotted = mod.module_aliases.get(base.value.id)
            if dotted and dotted.startswith("sglang."):
                other = self.module(dotted[len("sglang."):].replace(".", "/") + ".py")
                if other is not None:
                    return self.resolve_class(other, base.attr)
        return None

    def attribute_class(self, mod: _Module, cls: ast.ClassDef, attr: str) -> tuple[_Module, ast.ClassDef] | None:
        """The class ``__init__`` assigns to ``self.<attr>`` (``self.model = DeepseekV2Model(...)``,
        or through a ``self._init_model(...)`` helper that returns one); ``None`` when
        it is chosen at run time or cannot be found."""
        init = self.find_method(mod, cls, "__init__")
        if init is None:
            return None
        for node in ast.walk(init.node):
            if not isinstance(node, ast.Assign):
                continue
            if not any(isinstance(t, ast.Attribute) and t.attr == attr and _is_self(t.value) for t in node.targets):
                continue
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                found = self.resolve_class(init.module, value.func.id)
                if found is not None:
                    return found
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and _is_self(value.func.value):
                helper = self.find_method(mod, cls, value.func.attr)
                if helper is not None:
                    for ret in ast.walk(helper.node):
                        if (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call)
                                and isinstance(ret.value.func, ast.Name)):
                            found = self.resolve_class(helper.module, ret.value.func.id)
                            if found is not None:
                                return found
        return None


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _entry_names(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            names += [n.id for n in items if isinstance(n, ast.Name)]
    return names


# ------------------------------------------------------------ running the method


class _StandIn:
    """Any attribute is another stand-in and calls return one: what the method
    reads besides the config and the inner model (``get_parallel()``, a logger).
    Its truth value is known only for ``pp_group.is_last_rank`` (the rank that
    captures); a branch on any other stand-in makes the rule unknown, never a guess."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = _StandIn(f"{self._name}.{name}")
        object.__setattr__(self, name, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _StandIn(f"{self._name}()")

    def __bool__(self) -> bool:
        if self._name.endswith("is_last_rank"):
            return True
        raise _Unreadable(f"it branches on {self._name}, which this reader cannot evaluate")


class _Config(_StandIn):
    def __init__(self, num_layers: int) -> None:
        super().__init__("config")
        object.__setattr__(self, "num_hidden_layers", num_layers)
        object.__setattr__(self, "text_config", self)

    def get_text_config(self, *args: Any, **kwargs: Any) -> "_Config":
        return self

    def __bool__(self) -> bool:
        return True


class _Model(_StandIn):
    """A stand-in model object: records every ``layers_to_capture`` assignment,
    runs the real ``set_eagle3_layers_to_capture`` of its class when it has one."""

    def __init__(self, name: str, run: "_Run", where: tuple[_Module, ast.ClassDef] | None) -> None:
        super().__init__(name)
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_where", where)
        object.__setattr__(self, "config", run.config)
        object.__setattr__(self, "layers", [_StandIn(f"{name}.layers[{i}]") for i in range(run.num_layers)])

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "layers_to_capture":
            self._run.assigned.append((self._name, value))  # read at the end: may be filled in place
        object.__setattr__(self, name, value)

    def __bool__(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        if name == METHOD:
            if self._where is None and self._name != "self":
                # A delegate whose class is chosen at run time: whether it has the
                # method, and what it does, is unknown.
                self._run.unknown = f"it delegates to {self._name}, whose class this reader cannot find"
                raise AttributeError(name)
            if self._where is not None and self._run.reader.find_method(
                    self._where[0], self._where[1], METHOD) is None:
                raise AttributeError(name)  # the class has no such method, as in Python
            return self._run.bound(self)
        if name in _DELEGATES:
            child = self._run.child(self, name)
            object.__setattr__(self, name, child)
            return child
        return super().__getattr__(name)


class _Run:
    """One call of the installed method on a stand-in; raises :class:`_Unreadable`."""

    def __init__(self, reader: _Reader, num_layers: int) -> None:
        self.reader = reader
        self.num_layers = num_layers
        self.config = _Config(num_layers)
        self.assigned: list[tuple[str, list[int]]] = []
        self.unresolved: list[str] = []
        self.unknown: str | None = None

    def child(self, parent: _Model, attr: str) -> _Model:
        where = None
        if parent._where is not None:
            where = self.reader.attribute_class(parent._where[0], parent._where[1], attr)
            if where is None:
                self.unresolved.append(f"{parent._where[1].name}.{attr}")
        return _Model(f"{parent._name}.{attr}", self, where)

    def bound(self, model: _Model) -> Callable[..., Any]:
        method = None
        if model._where is not None:
            method = self.reader.find_method(model._where[0], model._where[1], METHOD)

        def call(layer_ids: Any = None, *args: Any, **kwargs: Any) -> None:
            assert method is not None
            _compile(self.reader, method)(model, layer_ids, *args, **kwargs)

        return call


class _Unreadable(Exception):
    pass


#: The builtins SGLang's method may use on the stand-in (no I/O, no imports).
_SAFE_BUILTINS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bool", "dict", "enumerate", "filter", "getattr", "hasattr", "int", "isinstance",
    "len", "list", "map", "max", "min", "range", "reversed", "set", "setattr", "sorted", "str", "sum",
    "tuple", "zip", "print", "AttributeError", "Exception", "IndexError", "KeyError", "NotImplementedError",
    "RuntimeError", "TypeError", "ValueError", "AssertionError", "None", "True", "False")
    if hasattr(builtins, name)}


def _module_constants(mod: _Module) -> dict[str, Any]:
    """Module-level names bound to a literal (``_FLAG = False``): their real values."""
    out: dict[str, Any] = {}
    for node in mod.tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)):
            out[node.targets[0].id] = node.value.value
    return out


def _compile(reader: "_Reader", method: _Method) -> Callable[..., Any]:
    """SGLang's method compiled alone, once per reader: the real builtins it may
    use, the module's literal constants, and stand-ins for every other name
    (decorators are not applied: the body is the rule)."""
    key = (method.module.rel, method.node.lineno)
    cached = reader.compiled.get(key)
    if cached is not None:
        return cached
    node = method.node
    source = textwrap.dedent(ast.get_source_segment(method.module.text, node) or "")
    constants = _module_constants(method.module)
    namespace: dict[str, Any] = {"__builtins__": _SAFE_BUILTINS, "__name__": f"pytest_eagle3_standin_{node.name}"}
    for name in sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)}):
        if name in _SAFE_BUILTINS:
            continue
        if name in constants:
            namespace[name] = constants[name]
        elif hasattr(typing, name):
            namespace[name] = getattr(typing, name)
        else:
            namespace[name] = _StandIn(name)
    exec(compile(source, f"<{method.where}>", "exec"), namespace)  # noqa: S102 - SGLang's own method, sandboxed
    reader.compiled[key] = namespace[node.name]
    return reader.compiled[key]


def _call(reader: _Reader, top: tuple[_Module, ast.ClassDef], ids: Sequence[int] | None,
          num_layers: int) -> list[int]:
    run = _Run(reader, num_layers)
    this = _Model("self", run, top)
    try:
        getattr(this, METHOD)(None if ids is None else list(ids))
    except _Unreadable:
        raise
    except Exception as exc:  # noqa: BLE001 - what SGLang's method raised, sorted below
        if run.unknown is not None:
            raise _Unreadable(run.unknown) from None
        standin = any(n in str(exc) for n in ("_StandIn", "_Model", "_Config", "pytest_eagle3"))
        if isinstance(exc, (IndexError, KeyError, ValueError)) or (isinstance(exc, TypeError) and not standin):
            raise SetupFailed(f"{type(exc).__name__}: {exc}") from None
        raise _Unreadable(f"it raised {type(exc).__name__}: {exc} on the stand-in") from None
    if run.unknown is not None:
        raise _Unreadable(run.unknown)
    if not run.assigned:
        why = f" (delegates to {', '.join(run.unresolved)})" if run.unresolved else ""
        raise _Unreadable(f"it set no layers_to_capture on the stand-in{why}")
    return [int(v) for v in run.assigned[-1][1]]


# --------------------------------------------------------- layer-0 capture


def _capture_loop_facts(method: _Method) -> EmbeddingCapture:
    """Whether the ``forward`` in ``method`` can capture layer 0, from its capture loop."""
    fn = method.node
    where = method.module.rel
    loops = [n for n in ast.walk(fn) if isinstance(n, ast.For) and _mentions(n, _CAPTURE_NAMES)]
    for loop in loops:
        none_residual = min((n.lineno for n in ast.walk(fn)
                             if isinstance(n, ast.Assign) and n.lineno < loop.lineno
                             and isinstance(n.value, ast.Constant) and n.value.value is None
                             and any(isinstance(t, ast.Name) and t.id == "residual" for t in n.targets)),
                            default=None)
        for node in ast.walk(loop):
            # capture handed to the decoder layer: keyword=... if i in self.layers_to_capture else None
            if isinstance(node, ast.keyword) and isinstance(node.value, ast.IfExp) and _mentions(node.value.test,
                                                                                                   _CAPTURE_NAMES):
                return EmbeddingCapture(True, f"{where}:{node.value.lineno}",
                                        f"{method.label} hands the capture to the decoder layer "
                                        f"({node.arg}=), which stores the residual stream it formed")
        for node in ast.walk(loop):
            if isinstance(node, ast.If) and _mentions(node.test, _CAPTURE_NAMES):
                appended = [c.args[0] for c in ast.walk(node) if isinstance(c, ast.Call)
                            and isinstance(c.func, ast.Attribute) and c.func.attr == "append" and c.args]
                if not appended:
                    continue
                unguarded = [a for a in appended if _adds_residual(a)]
                if unguarded and none_residual is not None and not _guards_residual(node):
                    line = unguarded[0].lineno
                    return EmbeddingCapture(
                        False, f"{where}:{line}",
                        f"{method.label} captures hidden_states + residual ({where}:{line}) "
                        f"while residual is None before layer 0 ({where}:{none_residual}): "
                        f"TypeError at the first forward")
                if unguarded and none_residual is None:
                    break  # residual is set elsewhere (a previous stage): not decided here
                return EmbeddingCapture(True, f"{where}:{appended[0].lineno}",
                                        f"{method.label} captures a tensor defined before layer 0 too")
    return EmbeddingCapture(None, method.where, f"{method.label} has no capture loop this reader recognises")


def _last_layer_capture(method: _Method) -> str:
    """``file:line`` where the ``forward`` in ``method`` captures layer index ``L``
    (the last layer's output): a test ``X in self.layers_to_capture`` whose ``X``
    is an attribute (``self.end_layer``, ``gpt_oss.py``) or a name assigned
    ``len(...)`` (``num_layers = len(self.layers)``, ``gemma3_causal.py``), not a
    loop's variable or an expression of one; ``""`` when there is none."""
    fn = method.node
    loop_vars = {n.id for f in ast.walk(fn) if isinstance(f, ast.For) for n in ast.walk(f.target)
                 if isinstance(n, ast.Name)}
    lengths = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and isinstance(n.value.func, ast.Name) and n.value.func.id == "len"
               for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In)
                and _mentions(node.comparators[0], _CAPTURE_NAMES)):
            continue
        left = node.left
        if isinstance(left, ast.Attribute) and _is_self(left.value) or (
                isinstance(left, ast.Name) and left.id in lengths and left.id not in loop_vars):
            return f"{method.module.rel}:{node.lineno}"
    return ""


def _mentions(node: ast.AST, names: Sequence[str]) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr in names) or (isinstance(n, ast.Name) and n.id in names)
               for n in ast.walk(node))


def _adds_residual(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.IfExp) and _compares_residual_with_none(n.test):
            return False  # "x if residual is None else x + residual"
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            if any(isinstance(s, ast.Name) and s.id == "residual" for s in (n.left, n.right)):
                return True
    return False


def _compares_residual_with_none(test: ast.AST) -> bool:
    for n in ast.walk(test):
        if isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            if (any(isinstance(x, ast.Name) and x.id == "residual" for x in sides)
                    and any(isinstance(x, ast.Constant) and x.value is None for x in sides)):
                return True
    return False


def _guards_residual(node: ast.If) -> bool:
    """The capture ``if`` (or an ``if`` inside it) tests ``residual`` against None."""
    return any(isinstance(n, (ast.If, ast.IfExp)) and _compares_residual_with_none(n.test) for n in ast.walk(node))


# ------------------------------------------------------------------ entry point


@dataclass(frozen=True)
class ModelCode:
    """What the installed SGLang's model file says about EAGLE-3 capture.

    Attributes:
        architecture: the ``config.json`` architecture asked about.
        rule: the id rule (``rule.source`` names the file and line).
        file: the model file registering the architecture (``srt/models/deepseek_v2.py``),
            ``None`` when none does.
        capture_forward: the dotted ``forward`` of the inner model whose loop
            captures (``sglang.srt.models.gemma3_causal.Gemma3TextModel.forward``;
            the class that defines it, a base where the subclass inherits it),
            which the per-rank recorder hooks; ``None`` when not found.
    """

    architecture: str
    rule: IdRule
    file: str | None
    capture_forward: str | None = None


def read_rules(location: str | Path, architecture: str, *, probe_layers: int = 8) -> ModelCode:
    """Read the id rule and layer-0 capture of ``architecture`` from the SGLang package at ``location``.

    Args:
        location: the ``sglang`` package directory (``SGLangInstall.location``).
        architecture: a ``config.json`` ``architectures`` entry (``DeepseekV3ForCausalLM``).
        probe_layers: the layer count used to classify the rule into a named kind
            (the returned rule runs SGLang's method for any ``L`` asked later).

    Never raises for unreadable code: the rule's kind is then ``unknown``, with
    ``source`` saying which file and what failed.
    """
    return _read_rules(str(Path(location).resolve()), architecture, probe_layers, _stamp(location))


def _stamp(location: str | Path) -> float:
    """Changes when any model file changes (the cache of :func:`read_rules`)."""
    try:
        return max((p.stat().st_mtime_ns for p in (Path(location) / "srt" / "models").glob("*.py")), default=0)
    except OSError:
        return 0.0


@functools.lru_cache(maxsize=32)
def _read_rules(location: str, architecture: str, probe_layers: int, stamp: float) -> ModelCode:
    reader = _Reader(Path(location))
    files = reader.entry_files(architecture)
    if not files:
        return ModelCode(architecture, unknown_rule(
            f"no file in {location}/srt/models registers {architecture} (EntryClass): "
            f"this SGLang has no model for it"), None)
    rel = files[0]
    mod = reader.module(rel)
    assert mod is not None
    found = reader.resolve_class(mod, architecture)
    if found is None:
        return ModelCode(architecture, unknown_rule(f"{rel}: class {architecture} not found"), rel)
    method = reader.find_method(found[0], found[1], METHOD)
    if method is None and reader.unresolved_bases:
        return ModelCode(architecture, unknown_rule(
            f"{rel}: {METHOD} not found on {architecture}, whose base(s) this reader cannot find: "
            + ", ".join(reader.unresolved_bases[:3])), rel)
    if method is None:
        return ModelCode(architecture, unknown_rule(
            f"{rel}: {architecture} has no {METHOD}: this SGLang's model has no EAGLE-3 aux capture",
            supported=False), rel)
    inner = _inner_model(reader, found)
    embedding = (_capture_loop_facts(inner) if inner is not None
                 else EmbeddingCapture(None, method.where, "the inner model's forward was not found"))

    def layers(ids: Sequence[int] | None, num_layers: int) -> list[int]:
        return _call(reader, found, ids, num_layers)

    where = _delegation_chain(reader, found, method)
    forward = None
    if inner is not None and inner.module.rel.endswith(".py"):
        forward = "sglang." + inner.module.rel[:-3].replace("/", ".") + f".{inner.cls}.forward"
    last = _last_layer_capture(inner) if inner is not None else ""
    try:
        rule = classify(layers, probe_layers, source=where, embedding=embedding)
        return ModelCode(architecture, dataclasses.replace(rule, last_layer=last) if rule.known else rule, rel,
                         forward)
    except _Unreadable as exc:
        return ModelCode(architecture, unknown_rule(f"{method.where} ({method.label}): {exc}"), rel, forward)


def _delegation_chain(reader: _Reader, top: tuple[_Module, ast.ClassDef], method: _Method) -> str:
    """``srt/models/deepseek_v2.py:3458 (DeepseekV2ForCausalLM.set_eagle3_layers_to_capture)``,
    with each delegation step before it."""
    steps = [f"{method.where} ({method.label})"]
    seen = 0
    mod, cls = top
    current = method
    while seen < 4:
        seen += 1
        calls = [n for n in ast.walk(current.node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == METHOD and isinstance(n.func.value, ast.Attribute) and _is_self(n.func.value.value)]
        if not calls:
            break
        attr = calls[0].func.value.attr
        target = reader.attribute_class(current.module, current.module.classes.get(current.cls, cls), attr)
        if target is None:
            break
        nxt = reader.find_method(target[0], target[1], METHOD)
        if nxt is None or nxt.node is current.node:
            break
        steps.append(f"{nxt.where} ({nxt.label})")
        current = nxt
    return " -> ".join(steps)


def _inner_model(reader: _Reader, top: tuple[_Module, ast.ClassDef]) -> _Method | None:
    """The ``forward`` of the model whose layers capture (``self.model`` of the
    causal-LM class, after following ``self.language_model``)."""
    current = top
    for _ in range(4):
        lm = reader.attribute_class(current[0], current[1], "language_model")
        if lm is not None and reader.find_method(lm[0], lm[1], METHOD) is not None:
            current = lm
            continue
        break
    model = reader.attribute_class(current[0], current[1], "model") or reader.attribute_class(
        current[0], current[1], "language_model")
    if model is None:
        return None
    return reader.find_method(model[0], model[1], "forward")


def method_files(location: str | Path) -> list[tuple[str, list[str]]]:
    """Every model file defining ``set_eagle3_layers_to_capture``, with its ``EntryClass`` names."""
    reader = _Reader(Path(location))
    out = []
    for path in sorted((Path(location) / "srt" / "models").glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if f"def {METHOD}" not in text:
            continue
        mod = reader.module(f"srt/models/{path.name}")
        out.append((f"srt/models/{path.name}", _entry_names(mod.tree) if mod is not None else []))
    return out
