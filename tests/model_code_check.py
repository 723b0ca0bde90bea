"""Run in a subprocess with the CPU engine's environment: every model file of the
installed SGLang that defines ``set_eagle3_layers_to_capture``, its *real*
method (imported from SGLang) against the rule :mod:`pytest_eagle3.sglang_source.model_code`
read from the file, for several id lists.

Prints one JSON object: ``{"checked": [...], "not_imported": [...], "disagree": [...]}``.
Used by ``tests/unit/test_model_code.py``.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

from pytest_eagle3.conventions import SetupFailed
from pytest_eagle3.sglang_source.model_code import method_files, read_rules
from pytest_eagle3.sglang_source.model_files import METHOD, ModelFileReader

L = 8
ID_LISTS = ([0, 3, 5], [1, 3, 4], [2, 4, 5], [2, 4, 8], [6, 0, 4], None)


class _Config:
    num_hidden_layers = L

    def __init__(self) -> None:
        self.text_config = self

    def get_text_config(self, *args, **kwargs):
        return self


class _Plain:
    """An inner model without its own method: what the capture loop reads."""

    def __init__(self) -> None:
        self.layers = [types.SimpleNamespace() for _ in range(L)]
        self.config = _Config()


def _instance(reader: ModelFileReader, mod, cls_node, real_cls):
    obj = object.__new__(real_cls)
    object.__setattr__(obj, "config", _Config())
    object.__setattr__(obj, "pp_group", types.SimpleNamespace(is_last_rank=True))
    object.__setattr__(obj, "layers", [types.SimpleNamespace() for _ in range(L)])
    for attr in ("model", "language_model"):
        found = reader.attribute_class(mod, cls_node, attr)
        value = _Plain()
        if found is not None and reader.find_method(found[0], found[1], METHOD) is not None:
            inner_mod = importlib.import_module("sglang." + found[0].rel[:-3].replace("/", "."))
            value = _instance(reader, found[0], found[1], getattr(inner_mod, found[1].name))
        try:
            object.__setattr__(obj, attr, value)
        except AttributeError:  # a read-only property (Gemma4's ``model``): the method reads through it
            pass
    return obj


def _captured(obj, depth: int = 0):
    got = obj.__dict__.get("layers_to_capture")
    for attr in ("model", "language_model"):
        inner = obj.__dict__.get(attr)
        if inner is not None and depth < 4:
            deeper = _captured(inner, depth + 1)
            if deeper is not None:
                return deeper
    return got


def main() -> None:
    # The CPU tier's fills for forks (a CUDA query at import), as in every engine process.
    from pytest_eagle3.worker.cpu import fills, forks

    for fill in fills.FILLS:
        if fill.apply.__module__ == forks.__name__:
            fills.apply(fill)
    import sglang

    location = Path(list(sglang.__path__)[0])
    reader = ModelFileReader(location)
    out: dict = {"checked": [], "not_imported": [], "disagree": []}
    for rel, names in method_files(location):
        try:
            module = importlib.import_module("sglang." + rel[:-3].replace("/", "."))
        except Exception as exc:  # noqa: BLE001 - a model file that needs CUDA to import
            out["not_imported"].append(f"{rel}: {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}")
            continue
        for name in ("get_parallel", "get_pp_group"):
            if name in module.__dict__:
                module.__dict__[name] = lambda: types.SimpleNamespace(
                    pp_group=types.SimpleNamespace(is_last_rank=True), is_last_rank=True)
        mod = reader.module(rel)
        for name in names:
            found = reader.resolve_class(mod, name)
            if found is None or reader.find_method(found[0], found[1], METHOD) is None:
                continue
            rule = read_rules(location, name).rule
            for ids in ID_LISTS:
                try:
                    real = getattr(module, name)
                    obj = _instance(reader, found[0], found[1], real)
                    getattr(real, METHOD)(obj, None if ids is None else list(ids))
                    want = _captured(obj)
                    want = list(want) if want is not None else None
                except (IndexError, KeyError, TypeError, ValueError) as exc:
                    want = f"raises {type(exc).__name__}"
                except Exception as exc:  # noqa: BLE001 - the harness cannot build this class's self
                    out["not_imported"].append(f"{rel}: {name}: harness: {type(exc).__name__}: {exc}"[:200])
                    break
                try:
                    got = list(rule.layers_to_capture(ids, L)) if rule.known else f"unknown: {rule.source}"
                except SetupFailed as exc:
                    got = f"raises {str(exc).split(':')[0]}"
                entry = {"file": rel, "class": name, "ids": ids, "real": want, "read": got}
                out["checked"].append(entry)
                if want != got:
                    out["disagree"].append(entry)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
