"""SGLang's own ``set_eagle3_layers_to_capture``, run on a stand-in model.

:func:`call_method` compiles that one method from the installed source and
runs it on a stand-in ``self`` (a config with ``num_hidden_layers = L``, an
inner model with ``L`` layers), reading back the ``layers_to_capture`` it sets:
the rule *is* SGLang's code, run on the id list asked about.  What the
stand-in cannot evaluate raises :class:`Unreadable` (the rule is then unknown,
never a guess); what SGLang's method itself rejects raises
:class:`~pytest_eagle3.conventions.SetupFailed`.
"""

from __future__ import annotations

import ast
import builtins
import textwrap
import typing
from typing import Any, Callable, Sequence

from pytest_eagle3.conventions import SetupFailed
from pytest_eagle3.sglang_source.model_files import METHOD, FoundMethod, ModelFileReader, ParsedFile

#: Attributes whose assignment in ``__init__`` names a delegate or inner model.
_DELEGATES = ("model", "language_model")


#: Which pipeline stage the stand-in is: the last (the rank that captures) unless
#: :func:`call_method` is asked about an earlier one.
_stage = {"last": True}


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
            return _stage["last"]
        raise Unreadable(f"it branches on {self._name}, which this reader cannot evaluate")


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

    def __init__(self, name: str, run: "_Run", where: tuple[ParsedFile, ast.ClassDef] | None) -> None:
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
    """One call of the installed method on a stand-in; raises :class:`Unreadable`."""

    def __init__(self, reader: ModelFileReader, num_layers: int) -> None:
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


class Unreadable(Exception):
    """The stand-in cannot evaluate what SGLang's method does (the message says why)."""


#: The builtins SGLang's method may use on the stand-in (no I/O, no imports).
_SAFE_BUILTINS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bool", "dict", "enumerate", "filter", "getattr", "hasattr", "int", "isinstance",
    "len", "list", "map", "max", "min", "range", "reversed", "set", "setattr", "sorted", "str", "sum",
    "tuple", "zip", "print", "AttributeError", "Exception", "IndexError", "KeyError", "NotImplementedError",
    "RuntimeError", "TypeError", "ValueError", "AssertionError", "None", "True", "False")
    if hasattr(builtins, name)}


def _module_constants(mod: ParsedFile) -> dict[str, Any]:
    """Module-level names bound to a literal (``_FLAG = False``): their real values."""
    out: dict[str, Any] = {}
    for node in mod.tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)):
            out[node.targets[0].id] = node.value.value
    return out


def _compile(reader: "ModelFileReader", method: FoundMethod) -> Callable[..., Any]:
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


def call_method(reader: ModelFileReader, top: tuple[ParsedFile, ast.ClassDef], ids: Sequence[int] | None,
                num_layers: int, *, last_stage: bool = True) -> list[int]:
    """``layers_to_capture`` as SGLang's method on ``top`` sets it for ``ids`` and ``num_layers`` layers.

    ``last_stage=False``: as on an earlier pipeline stage (``pp_group.is_last_rank``
    false); a method that returns there sets nothing, which raises :class:`Unreadable`
    ("it set no layers_to_capture").

    Raises:
        Unreadable: the method does what the stand-in cannot evaluate.
        SetupFailed: SGLang's method rejects the ids (IndexError, KeyError, ValueError, TypeError).
    """
    run = _Run(reader, num_layers)
    this = _Model("self", run, top)
    _stage["last"] = last_stage
    try:
        getattr(this, METHOD)(None if ids is None else list(ids))
    except Unreadable:
        raise
    except Exception as exc:  # noqa: BLE001 - what SGLang's method raised, sorted below
        if run.unknown is not None:
            raise Unreadable(run.unknown) from None
        standin = any(n in str(exc) for n in ("_StandIn", "_Model", "_Config", "pytest_eagle3"))
        if isinstance(exc, (IndexError, KeyError, ValueError)) or (isinstance(exc, TypeError) and not standin):
            raise SetupFailed(f"{type(exc).__name__}: {exc}") from None
        raise Unreadable(f"it raised {type(exc).__name__}: {exc} on the stand-in") from None
    finally:
        _stage["last"] = True
    if run.unknown is not None:
        raise Unreadable(run.unknown)
    if not run.assigned:
        why = f" (delegates to {', '.join(run.unresolved)})" if run.unresolved else ""
        raise Unreadable(f"it set no layers_to_capture on the stand-in{why}")
    return [int(v) for v in run.assigned[-1][1]]
