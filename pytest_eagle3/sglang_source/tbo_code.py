"""Two-batch overlap (TBO) in the installed SGLang, read from its files.

Read on 0.5.23 (``pip download --no-deps sglang==0.5.23``) and measured on CPU:

* ``srt/arg_groups/validation_hook.py`` ``check_two_batch_overlap`` (line 756)
  refuses ``--enable-two-batch-overlap`` with ``moe_a2a_backend`` ``none`` only
  without DP attention; with it the server starts (its message names the
  "DeepSeek-V4 non-EP DP TBO path").
* ``DeepseekV2MoE`` (``srt/models/deepseek_v2.py``) sets ``self.ep_size`` only
  under an EP all-to-all backend (DeepEP, Mooncake, NIXL, MORI, ...: line 984),
  and its TBO operations dispatch only when ``self.ep_size > 1``
  (``op_dispatch_a``, line 1960): DeepSeek-V3's TBO operations are written
  for an EP all-to-all backend.
* The micro-batches (``TboForwardBatchPreparer.filter_batch``,
  ``srt/batch_overlap/two_batch_overlap.py:841``) carry no per-rank token counts
  (``global_num_tokens_gpu=None``), which the DP gather of DP attention without
  an all-to-all backend reads (``srt/layers/dp_attention.py`` ``get_dp_local_info``).
  Measured: both DP ranks die in their first micro-batch's DP gather,
  ``TypeError: object of type 'NoneType' has no len()`` (``dp_attention.py:92``).
* ``DeepseekV2Model.forward`` runs the layers from ``first_k_dense_replace`` on
  through ``model_forward_stages`` (line 3203) without the capture argument the
  per-layer loop passes, and the micro-batches get ``aux_hidden_states_buffer=None``
  (``two_batch_overlap.py:859``): under TBO those layers are not captured
  (upstream PR #32680, closed unmerged). Read, not run: the engine dies before.

Every fact is found by the code's shape (a keyword, an assignment, a call), so a
release that moves it reads as "not found" (``None``).  Stdlib only.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from pytest_eagle3.sglang_source.pp_code import Where

TBO_FILE = "srt/batch_overlap/two_batch_overlap.py"
MODEL_FILE = "srt/models/deepseek_v2.py"
CHECK_FILES = ("srt/arg_groups/validation_hook.py", "srt/server_args.py")
#: SGLang's pull request that proposed capturing under TBO (closed unmerged).
CAPTURE_PR = "upstream PR #32680, closed unmerged"


@dataclass(frozen=True)
class TboCode:
    """What the installed SGLang does under ``--enable-two-batch-overlap`` (DeepSeek file).

    Attributes:
        check: ``check_two_batch_overlap``, the startup check (None: not found).
        children_counts: the micro-batch field ``global_num_tokens_gpu=None`` (None: not found).
        children_packer: the micro-batch field ``aux_hidden_states_buffer=None`` (None: not found).
        ep_size_a2a: ``self.ep_size = ...`` of the MoE, when every such assignment sits
            under a test of the all-to-all backend (None: not so, or not found).
        dispatch_gate: ``op_dispatch_a``'s ``if self.ep_size > 1`` (None: not found).
        stages_call: the ``model_forward_stages(...)`` call of the model's forward.
        stages_capture: whether that call passes a capture argument (None: no call found).
    """

    check: Where | None = None
    children_counts: Where | None = None
    children_packer: Where | None = None
    ep_size_a2a: Where | None = None
    dispatch_gate: Where | None = None
    stages_call: Where | None = None
    stages_capture: bool | None = None

    @property
    def needs_a2a(self) -> bool:
        """DeepSeek's TBO operations dispatch only through an EP all-to-all backend."""
        return self.ep_size_a2a is not None and self.dispatch_gate is not None


def _parse(location: Path, rel: str) -> ast.Module | None:
    path = location / rel
    if not path.is_file():
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return None


def _none_keyword(tree: ast.Module, rel: str, name: str) -> Where | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == name \
                and isinstance(node.value, ast.Constant) and node.value.value is None:
            return Where(rel, node.value.lineno, f"{name}=None")
    return None


def _is_self_ep_size(target: ast.expr) -> bool:
    return isinstance(target, ast.Attribute) and target.attr == "ep_size" \
        and isinstance(target.value, ast.Name) and target.value.id == "self"


def _ep_size_under_a2a(tree: ast.Module) -> Where | None:
    """The first ``self.ep_size = ...``, if every one sits under an ``if`` naming the a2a backend."""
    found: list[tuple[int, bool]] = []

    def visit(node: ast.AST, under_a2a: bool) -> None:
        if isinstance(node, ast.Assign) and any(_is_self_ep_size(t) for t in node.targets):
            found.append((node.lineno, under_a2a))
        elif isinstance(node, ast.If):
            for stmt in node.body:
                visit(stmt, under_a2a or "a2a" in ast.unparse(node.test))
            for stmt in node.orelse:
                visit(stmt, under_a2a)
        else:
            for child in ast.iter_child_nodes(node):
                visit(child, under_a2a)

    visit(tree, False)
    if found and all(a2a for _, a2a in found):
        return Where(MODEL_FILE, found[0][0], "self.ep_size set under an EP all-to-all backend only")
    return None


def _dispatch_gate(tree: ast.Module) -> Where | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "op_dispatch_a" and node.body:
            first = node.body[0]
            if isinstance(first, ast.If) and "ep_size" in ast.unparse(first.test):
                return Where(MODEL_FILE, first.lineno, ast.unparse(first.test))
    return None


def _stages_call(tree: ast.Module) -> tuple[Where | None, bool | None]:
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "DeepseekV2Model"):
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("model_forward_stages"):
                names = [k.arg or "" for k in node.keywords]
                captures = any("captur" in n or "aux" in n for n in names)
                return Where(MODEL_FILE, node.lineno, "model_forward_stages(" + ", ".join(names) + ")"), captures
    return None, None


def _check(location: Path) -> Where | None:
    for rel in CHECK_FILES:
        tree = _parse(location, rel)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "check_two_batch_overlap":
                return Where(rel, node.lineno, "check_two_batch_overlap")
    return None


def read_tbo_code(location: str | Path) -> TboCode:
    """Read :class:`TboCode` from the SGLang package at ``location`` (the ``sglang`` directory)."""
    location = Path(location)
    tbo = _parse(location, TBO_FILE)
    model = _parse(location, MODEL_FILE)
    stages_call, stages_capture = _stages_call(model) if model is not None else (None, None)
    return TboCode(
        check=_check(location),
        children_counts=_none_keyword(tbo, TBO_FILE, "global_num_tokens_gpu") if tbo is not None else None,
        children_packer=_none_keyword(tbo, TBO_FILE, "aux_hidden_states_buffer") if tbo is not None else None,
        ep_size_a2a=_ep_size_under_a2a(model) if model is not None else None,
        dispatch_gate=_dispatch_gate(model) if model is not None else None,
        stages_call=stages_call,
        stages_capture=stages_capture,
    )
