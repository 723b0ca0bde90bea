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
   and keys its entry classes by ``__name__``; :mod:`pytest_eagle3.sglang_source.model_files`);
2. finds ``set_eagle3_layers_to_capture`` on that class or its bases, across
   files when a base is imported from another model file, and follows
   delegation (``self.language_model.set_eagle3_layers_to_capture(...)``,
   ``kimi_k25.py``) to the class the constructor assigns;
3. compiles that one method from the installed source and runs it on a
   stand-in ``self`` (a config with ``num_hidden_layers = L``, an inner model
   with ``L`` layers), reading back the ``layers_to_capture`` it sets: the
   rule *is* SGLang's code, run on the id list asked about
   (:mod:`pytest_eagle3.sglang_source.method_run`);
4. reads the capture loop of the inner model's ``forward`` to tell whether
   layer 0 (the embedding, ``hs[0]``) can be captured: a capture of
   ``hidden_states + residual`` while ``residual`` is still ``None`` before
   layer 0 is a ``TypeError`` at the first forward (upstream <= 0.5.13 and
   sglang-kt 0.7.2 ``deepseek_v2.py``); a capture handed to the decoder layer
   (``captured_last_layer_outputs=`` since 0.5.14) or guarded against ``None``
   can (:mod:`pytest_eagle3.sglang_source.capture_loop`).

Nothing imports SGLang (a fork's modules may crash at import on a CPU
machine); reading and running the rule takes well under a second.
:func:`read_rules` returns an :class:`~pytest_eagle3.conventions.IdRule` whose
``source`` names the file and line, or one whose kind is ``unknown`` with the
reason, never a guess.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pytest_eagle3.conventions import EmbeddingCapture, IdRule, classify, unknown_rule
from pytest_eagle3.sglang_source.capture_loop import capture_loop_facts, last_layer_capture
from pytest_eagle3.sglang_source.method_run import Unreadable, call_method
from pytest_eagle3.sglang_source.model_files import (
    METHOD,
    FoundMethod,
    ModelFileReader,
    ParsedFile,
    entry_names,
    is_self,
)


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
    reader = ModelFileReader(Path(location))
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
    inner = inner_forward(reader, found)
    embedding = (capture_loop_facts(inner) if inner is not None
                 else EmbeddingCapture(None, method.where, "the inner model's forward was not found"))

    def layers(ids: Sequence[int] | None, num_layers: int) -> list[int]:
        return call_method(reader, found, ids, num_layers)

    where = _delegation_chain(reader, found, method)
    forward = None
    if inner is not None and inner.module.rel.endswith(".py"):
        forward = "sglang." + inner.module.rel[:-3].replace("/", ".") + f".{inner.cls}.forward"
    last = last_layer_capture(inner) if inner is not None else ""
    try:
        rule = classify(layers, probe_layers, source=where, embedding=embedding)
        return ModelCode(architecture, dataclasses.replace(rule, last_layer=last) if rule.known else rule, rel,
                         forward)
    except Unreadable as exc:
        return ModelCode(architecture, unknown_rule(f"{method.where} ({method.label}): {exc}"), rel, forward)


def _delegation_chain(reader: ModelFileReader, top: tuple[ParsedFile, ast.ClassDef], method: FoundMethod) -> str:
    """``srt/models/deepseek_v2.py:3458 (DeepseekV2ForCausalLM.set_eagle3_layers_to_capture)``,
    with each delegation step before it."""
    steps = [f"{method.where} ({method.label})"]
    seen = 0
    mod, cls = top
    current = method
    while seen < 4:
        seen += 1
        calls = [n for n in ast.walk(current.node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == METHOD and isinstance(n.func.value, ast.Attribute) and is_self(n.func.value.value)]
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


def inner_forward(reader: ModelFileReader, top: tuple[ParsedFile, ast.ClassDef]) -> FoundMethod | None:
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
    reader = ModelFileReader(Path(location))
    out = []
    for path in sorted((Path(location) / "srt" / "models").glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if f"def {METHOD}" not in text:
            continue
        mod = reader.module(f"srt/models/{path.name}")
        out.append((f"srt/models/{path.name}", entry_names(mod.tree) if mod is not None else []))
    return out
