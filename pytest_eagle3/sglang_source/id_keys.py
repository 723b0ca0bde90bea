"""Which ``config.json`` keys of a draft the installed SGLang reads: its aux layer ids, its flags.

Two sides read a draft's ids, and they need not agree:

* the **target** side picks the layers it captures (sglang 0.5.23:
  ``srt/model_executor/model_runner_components/spec_aux_hidden_state.py``
  ``_resolve_eagle_aux_hidden_state``, lines 185-196, reads only
  ``eagle_config["eagle_aux_hidden_state_layer_ids"]``; anything else -> ``None`` ->
  the model's default ``[2, L//2, L-3]``);
* the **draft** model sizes its ``fc`` from the count (0.5.23
  ``srt/models/kimi_k25_eagle3.py`` ``_get_eagle_aux_layer_count``, lines 48-59:
  ``eagle_config``'s key, else a top-level ``eagle_aux_hidden_state_layer_ids``,
  else 3; ``srt/models/llama_eagle3.py``: ``eagle_config``'s key only).

So an MLA draft whose ids sit only at the top level loads with the right ``fc``
width and is fed the default layers.  The same reading tells which EAGLE-3 flags
a draft model honours (:func:`flags_read`): 0.5.23's ``llama_eagle3.py`` reads
``norm_before_fc``, ``fc_norm``, ``use_aux_norm`` and ``norm_output``;
``kimi_k25_eagle3.py`` reads the last three but not ``norm_before_fc``; neither
reads speculators' ``norm_before_residual``.  A flag a draft sets and its model
never reads is silently ignored.  This module reads each side from the
installed files (Python's ``ast``; no import of sglang): a read of the key is a
subscript, ``.get`` or ``getattr`` whose object's name mentions ``eagle_config``
(nested) or not (top level).  Stdlib only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

KEY = "eagle_aux_hidden_state_layer_ids"
NESTED = "eagle_config." + KEY
#: Where the target side's read lives, newest layout first (older releases read it in model_runner.py).
TARGET_FILES = (
    "srt/model_executor/model_runner_components/spec_aux_hidden_state.py",
    "srt/model_executor/model_runner.py",
)
#: The draft model files, by architecture.
DRAFT_FILES = {
    "LlamaForCausalLMEagle3": "srt/models/llama_eagle3.py",
    "Eagle3DeepseekV2ForCausalLM": "srt/models/kimi_k25_eagle3.py",
}


@dataclass(frozen=True)
class KeyReads:
    """How one file reads the ids.

    Attributes:
        file: path inside the ``sglang`` package (``srt/...``).
        nested_line: first line reading ``eagle_config``'s key (None: never).
        top_line: first line reading the top-level key (None: never).
    """

    file: str
    nested_line: int | None = None
    top_line: int | None = None

    @property
    def found(self) -> bool:
        return self.nested_line is not None or self.top_line is not None

    @property
    def reads_nested(self) -> bool:
        return self.nested_line is not None

    @property
    def reads_top_level(self) -> bool:
        return self.top_line is not None

    def where(self, nested: bool = True) -> str:
        line = self.nested_line if nested else self.top_line
        return f"{self.file}:{line}" if line is not None else self.file

    def describe(self) -> str:
        """``eagle_config.eagle_aux_hidden_state_layer_ids only (FILE:LINE)`` and the like."""
        if self.reads_nested and self.reads_top_level:
            first = "eagle_config's key, else the top-level one"
            return f"{first} ({self.where()}, {self.where(False)})"
        if self.reads_nested:
            return f"only {NESTED} ({self.where()})"
        if self.reads_top_level:
            return f"only the top-level {KEY} ({self.where(False)})"
        return f"neither key ({self.file})"


def _mentions_eagle_config(node: ast.AST) -> bool:
    text = ast.unparse(node) if hasattr(ast, "unparse") else ""
    return "eagle_config" in text


def _is_key(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == KEY


def reads(text: str, file: str) -> KeyReads:
    """The key reads in ``text`` (a Python file's source)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return KeyReads(file)
    nested: list[int] = []
    top: list[int] = []
    for node in ast.walk(tree):
        obj = None
        if isinstance(node, ast.Subscript) and _is_key(node.slice):
            obj = node.value
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "get" and node.args and _is_key(node.args[0]):
                obj = f.value
            elif (isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and len(node.args) >= 2
                  and _is_key(node.args[1])):
                obj = node.args[0]
            elif isinstance(f, ast.Name) and node.args and _is_key(node.args[0]):
                obj = f  # a getter bound to a config, e.g. get_eagle_config(KEY) or _cfg_get(config, KEY)
        if obj is None:
            continue
        (nested if _mentions_eagle_config(obj) else top).append(node.lineno)
    return KeyReads(file, min(nested) if nested else None, min(top) if top else None)


def _read(location: str | Path, relative: str) -> KeyReads | None:
    try:
        text = (Path(location) / relative).read_text(encoding="utf-8")
    except OSError:
        return None
    return reads(text, relative)


def target_reads(location: str | Path) -> KeyReads | None:
    """How the installed SGLang's target side reads the draft's ids (the first of
    :data:`TARGET_FILES` that reads the key; None when none does)."""
    for relative in TARGET_FILES:
        found = _read(location, relative)
        if found is not None and found.found:
            return found
    return None


def draft_reads(location: str | Path, architecture: str) -> KeyReads | None:
    """How the installed SGLang's draft model ``architecture`` sizes ``fc`` from the
    ids (None: this SGLang has no such model file, or it reads no key)."""
    relative = DRAFT_FILES.get(architecture)
    if relative is None:
        return None
    found = _read(location, relative)
    return found if found is not None and found.found else None


def has_draft_model(location: str | Path, architecture: str) -> bool:
    """Whether the installed SGLang defines draft class ``architecture`` in its model file."""
    relative = DRAFT_FILES.get(architecture)
    if relative is None:
        return False
    try:
        text = (Path(location) / relative).read_text(encoding="utf-8")
    except OSError:
        return False
    return f"class {architecture}(" in text


#: Draft config flags that change what an EAGLE-3 draft computes (speculators 0.9.0
#: ``models/eagle3/config.py``; SGLang's draft models).
EAGLE_FLAGS = ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output", "norm_before_residual")


def flags_read(location: str | Path, architecture: str) -> frozenset[str] | None:
    """The :data:`EAGLE_FLAGS` the installed draft model ``architecture`` reads from
    its config (``getattr(config, NAME)``, ``cfg.get(NAME)``, ``cfg[NAME]``); None
    when this SGLang has no such model file."""
    relative = DRAFT_FILES.get(architecture)
    if relative is None:
        return None
    try:
        tree = ast.parse((Path(location) / relative).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    found = set()
    for node in ast.walk(tree):
        names: list[ast.AST] = []
        if isinstance(node, ast.Subscript):
            names = [node.slice]
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "get" and node.args:
                names = [node.args[0]]
            elif isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2:
                names = [node.args[1]]
        for n in names:
            if isinstance(n, ast.Constant) and n.value in EAGLE_FLAGS:
                found.add(n.value)
    return frozenset(found)
