"""What the capture loop of an inner model's ``forward`` says, read from its source.

:func:`capture_loop_facts` tells whether layer 0 (the embedding, ``hs[0]``) can
be captured: a capture of ``hidden_states + residual`` while ``residual`` is
still ``None`` before layer 0 is a ``TypeError`` at the first forward (upstream
<= 0.5.13 and sglang-kt 0.7.2 ``deepseek_v2.py``); a capture handed to the
decoder layer (``captured_last_layer_outputs=`` since 0.5.14) or guarded
against ``None`` can.  :func:`last_layer_capture` finds a capture of layer
index ``L`` (the last layer's output).
"""

from __future__ import annotations

import ast
from typing import Sequence

from pytest_eagle3.conventions import EmbeddingCapture
from pytest_eagle3.sglang_source.model_files import FoundMethod, is_self

#: Names of the list the capture loop reads.
_CAPTURE_NAMES = ("layers_to_capture", "_is_layer_to_capture")


def capture_loop_facts(method: FoundMethod) -> EmbeddingCapture:
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


def last_layer_capture(method: FoundMethod) -> str:
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
        if isinstance(left, ast.Attribute) and is_self(left.value) or (
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


#: Capture-site kinds :func:`capture_site` names.
SITE_BOUNDARY = "layer boundary"
SITE_APPEND = "model-loop append"
SITE_FLAGS = "per-layer flags"
SITE_UNKNOWN = "not recognised"


def capture_site(method: FoundMethod) -> tuple[str, str, str]:
    """Where the ``forward`` in ``method`` takes its captures: ``(kind, file:line, code)``.

    * :data:`SITE_BOUNDARY`: the loop hands a capture object to layer ``i``
      (``capture_output=aux_hidden_states.capture if i in self.layers_to_capture``,
      ``captured_last_layer_outputs=``; or the choice assigned to a name first and
      that name handed over: ``srt/models/qwen3_vl.py``), and the layer stores the
      stream it formed;
    * :data:`SITE_APPEND`: the loop appends a tensor itself
      (``aux_hidden_states.append(hidden_states)``: ``gemma3_causal.py``, ``longcat_flash.py``);
      ``code`` is the appended expression, as written;
    * :data:`SITE_FLAGS`: as the boundary, but the loop asks a flag the inner
      model's ``set_eagle3_layers_to_capture`` set on each layer
      (``getattr(layer, "_is_layer_to_capture", False)``: ``qwen2_moe.py``);
    * :data:`SITE_UNKNOWN` otherwise.
    """
    fn = method.node
    where = method.module.rel
    loops = [n for n in ast.walk(fn) if isinstance(n, ast.For)]
    nodes = [n for loop in loops for n in ast.walk(loop)] + list(ast.walk(fn))  # the layer loop's first
    for node in nodes:
        if isinstance(node, ast.keyword) and node.value is not None and isinstance(node.value, ast.IfExp) \
                and (_mentions(node.value.test, _CAPTURE_NAMES) or _names_flag(node.value.test)):
            return (SITE_FLAGS if _names_flag(node.value.test) else SITE_BOUNDARY, f"{where}:{node.value.lineno}",
                    f"{node.arg}={ast.unparse(node.value.body)} if {ast.unparse(node.value.test)}")
    passed = {n.value.id for n in ast.walk(fn) if isinstance(n, ast.keyword) and isinstance(n.value, ast.Name)}
    for node in nodes:  # the same choice named first and handed over by name (srt/models/qwen3_vl.py)
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in passed and isinstance(node.value, ast.IfExp)
                and (_mentions(node.value.test, _CAPTURE_NAMES) or _names_flag(node.value.test))):
            return (SITE_FLAGS if _names_flag(node.value.test) else SITE_BOUNDARY, f"{where}:{node.value.lineno}",
                    f"{node.targets[0].id}={ast.unparse(node.value.body)} if {ast.unparse(node.value.test)}")
    for node in nodes:
        if isinstance(node, ast.If) and _mentions(node.test, _CAPTURE_NAMES):
            appended = [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                        and c.func.attr == "append" and c.args]
            if appended:
                return SITE_APPEND, f"{where}:{appended[0].lineno}", ast.unparse(appended[0].args[0])
    return SITE_UNKNOWN, method.where, ""


def _names_flag(node: ast.AST) -> bool:
    """``getattr(layer, "_is_layer_to_capture", False)``: a per-layer flag set by
    the inner model's ``set_eagle3_layers_to_capture``."""
    return any(isinstance(n, ast.Constant) and n.value == "_is_layer_to_capture" for n in ast.walk(node)) or any(
        isinstance(n, ast.Attribute) and n.attr == "_is_layer_to_capture" for n in ast.walk(node))
