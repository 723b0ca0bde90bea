"""Pipeline parallelism in the installed SGLang, read from its files: the startup
gate, SGLang's own layer split, and which pipeline stage captures aux hidden states.

Read on 0.5.23 (``pip download --no-deps sglang==0.5.23``):

* ``srt/arg_groups/validation_hook.py`` ``check_pipeline_parallel_compat``
  (the assert at line 132) says "Pipeline parallelism currently only supports EAGLE
  (non-multi-layer) speculative decoding": an EAGLE-3 engine exits at startup
  with ``--pp-size`` > 1; the raise at line 725 refuses ``--enable-return-aux-hidden-states``
  unless ``pp_size == 1`` ("the capture hooks only see the layers on the last
  pipeline rank").
* ``srt/distributed/utils.py`` ``get_pp_indices`` (line 110) splits the layers:
  evenly, the last ``L % pp`` stages one more, or ``SGLANG_PP_LAYER_PARTITION``;
  :func:`read_pp_code` runs that function itself.
* ``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` (``srt/models/deepseek_v2.py:3459``)
  returns at once unless ``pp_group.is_last_rank``: behind the gate, a layer of an
  earlier stage is never captured (SGLang issue #39634); :func:`read_pp_code`
  runs SGLang's method as an earlier stage to find out
  (:func:`pytest_eagle3.sglang_source.method_run.call_method`).

The gates are found by their messages (a phrase of each, in a string literal of
the file), so a release that words them differently reads as "no gate found":
the suite then starts the engine and reports what SGLang does.  Stdlib only.
"""

from __future__ import annotations

import ast
import functools
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from pytest_eagle3.sglang_source.method_run import Unreadable, call_method
from pytest_eagle3.sglang_source.model_files import METHOD, ModelFileReader

#: Where the startup checks live, newest layout first.
GATE_FILES = ("srt/arg_groups/validation_hook.py", "srt/server_args.py")
#: A phrase of each gate's message (0.5.23).
EAGLE_GATE_PHRASE = "Pipeline parallelism currently only supports EAGLE"
CAPTURE_GATE_PHRASE = "only supports pp_size == 1"
OVERLAP_GATE_PHRASE = "Pipeline parallelism is not compatible with overlap schedule"
#: SGLang's switch for speculative decoding at PP outside PD prefill (0.5.23 ``srt/environ.py``;
#: its PP checks name it, ``validation_hook.py`` ``check_pipeline_parallel_compat``).
PP_SPEC_SWITCH = "SGLANG_ENABLE_PP_SPEC"
SPLIT_FILE = "srt/distributed/utils.py"
SPLIT_FUNCTION = "get_pp_indices"
#: SGLang's issue on the captures of earlier stages.
EARLIER_STAGE_ISSUE = "SGLang issue #39634"

GATE_MEANING = ("this SGLang refuses EAGLE-3 with pipeline parallelism at startup ({eagle}); "
                "the capture path behind the gate {behind}")


@dataclass(frozen=True)
class Where:
    """A statement of the installed SGLang: ``file:line`` and its message or code."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class PpCode:
    """What the installed SGLang does with ``--pp-size`` > 1.

    Attributes:
        eagle_gate: the startup check that refuses EAGLE-3 at PP (None: none found).
        capture_gate: the check that refuses the capture-only mode at PP (None: none found).
        earlier_stages_capture: whether ``set_eagle3_layers_to_capture`` sets layers on a
            stage other than the last (False on 0.5.23; None: unknown).
        stage_check: the line of that method that decides it (its ``is_last_rank`` test).
        split: SGLang's own ``get_pp_indices(num_layers, pp_rank, pp_size) -> (start, end)``,
            or None when it was not found.
        split_where: where the split was read.
        why_unknown: why ``earlier_stages_capture`` is unknown.
        overlap_gate: the check that refuses PP with the overlap schedule (0.5.23
            ``validation_hook.py:121``; None: none found), so a PP engine needs
            ``--disable-overlap-schedule``.
        spec_switch: a check naming :data:`PP_SPEC_SWITCH` (None: none found): a
            speculative engine at PP needs that variable set to ``1`` outside PD prefill.
    """

    eagle_gate: Where | None
    capture_gate: Where | None
    earlier_stages_capture: bool | None
    stage_check: Where | None
    split: Callable[[int, int, int], tuple[int, int]] | None
    split_where: str
    why_unknown: str = ""
    overlap_gate: Where | None = None
    spec_switch: Where | None = None

    def stages(self, num_layers: int, pp_size: int) -> list[tuple[int, int]] | None:
        """``[(start, end), ...]`` per stage (end exclusive), by SGLang's own split."""
        if self.split is None:
            return None
        return [tuple(self.split(num_layers, rank, pp_size)) for rank in range(pp_size)]  # type: ignore[misc]

    def behind_gate(self) -> str:
        """What SGLang's capture does at PP, gate or no gate."""
        if self.earlier_stages_capture is False:
            return (f"captures on the last stage only: {METHOD} returns on every other stage ({self.stage_check}; "
                    f"{EARLIER_STAGE_ISSUE}), so with the gate lifted a layer of an earlier stage is never captured")
        if self.earlier_stages_capture:
            return "sets the layers to capture on every stage"
        return f"is unknown ({self.why_unknown})"

    def describe(self) -> str:
        """One paragraph: the gate as what it means."""
        if self.eagle_gate is None:
            gate = "no startup check refusing EAGLE-3 with pipeline parallelism was found"
            return f"{gate} ({', '.join(GATE_FILES)}); the capture path {self.behind_gate()}"
        text = GATE_MEANING.format(eagle=f"{self.eagle_gate}: {self.eagle_gate.text!r}", behind=self.behind_gate())
        if self.capture_gate is not None:
            text += f"; the capture-only mode is refused at PP too ({self.capture_gate})"
        return text

    def split_lines(self, pp_size: int, num_layers: int, layers_to_capture: Sequence[int] | None = None) -> list[str]:
        """Stage by stage: which layers each holds, and which of ``layers_to_capture`` it would capture."""
        stages = self.stages(num_layers, pp_size)
        if stages is None:
            return [f"PP {pp_size}: SGLang's layer split was not found ({self.split_where})"]
        lines = [f"PP {pp_size} on {num_layers} layers (SGLang's {SPLIT_FUNCTION}, {self.split_where}):"]
        for rank, (start, end) in enumerate(stages):
            last = rank == pp_size - 1
            held = [v for v in (layers_to_capture or ()) if start <= v < end]
            line = f"  stage {rank}: layers {start}-{end - 1}"
            if layers_to_capture is not None:
                names = f"layer {held[0]}" if len(held) == 1 else "layers " + ", ".join(map(str, held))
                if not held:
                    line += ": none of the layers to capture"
                elif last or self.earlier_stages_capture:
                    line += f": captures {names}"
                elif self.earlier_stages_capture is False:
                    line += f": {names} never captured (not the last stage)"
                else:
                    line += f": {names} (whether captured is unknown)"
            lines.append(line)
        return lines


def _find_phrase(location: Path, phrase: str) -> Where | None:
    for rel in GATE_FILES:
        path = location / rel
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for stmt in ast.walk(tree):
            if not isinstance(stmt, (ast.Assert, ast.Raise)):
                continue
            message = stmt.msg if isinstance(stmt, ast.Assert) else stmt.exc
            strings = [n.value for n in ast.walk(message) if isinstance(n, ast.Constant) and isinstance(n.value, str)] \
                if message is not None else []
            if any(phrase in text for text in strings):
                return Where(rel, stmt.lineno, " ".join(" ".join(strings).split()))
    return None


def _read_split(location: Path) -> tuple[Callable[[int, int, int], tuple[int, int]] | None, str]:
    path = location / SPLIT_FILE
    if not path.is_file():
        return None, f"{SPLIT_FILE} not found"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == SPLIT_FUNCTION), None)
    if node is None:
        return None, f"{SPLIT_FILE} has no {SPLIT_FUNCTION}"
    node.returns = None
    for arg in node.args.args:
        arg.annotation = None
    namespace: dict[str, object] = {"os": os, **{name: getattr(typing, name) for name in typing.__all__}}
    exec(compile(ast.Module([node], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102 - SGLang's own function
    return namespace[SPLIT_FUNCTION], f"{SPLIT_FILE}:{node.lineno}"  # type: ignore[return-value]


def _stage_check(reader: ModelFileReader, architecture: str) -> tuple[bool | None, Where | None, str]:
    files = reader.entry_files(architecture)
    mod = reader.module(files[0]) if files else None
    found = reader.resolve_class(mod, architecture) if mod is not None else None
    method = reader.find_method(found[0], found[1], METHOD) if found is not None else None
    if found is None or method is None:
        return None, None, f"no {METHOD} found for {architecture}"
    check = next((n for n in ast.walk(method.node) if isinstance(n, ast.Attribute) and n.attr == "is_last_rank"), None)
    where = Where(method.module.rel, check.lineno, "pp_group.is_last_rank") if check is not None else None
    try:
        call_method(reader, found, [1, 2, 3], 8, last_stage=False)
    except Unreadable as exc:
        if "set no layers_to_capture" in str(exc):
            return False, where, ""
        return None, where, str(exc)
    except Exception as exc:  # noqa: BLE001 - SetupFailed and the like: SGLang's method rejected the stand-in
        return None, where, f"{type(exc).__name__}: {exc}"
    return True, where, ""


MODELS_DIR = "srt/models"


@dataclass(frozen=True)
class FamilyStageChecks:
    """Each model file's ``set_eagle3_layers_to_capture``, sorted by what it does at PP.

    Attributes:
        last_stage_only: ``file:line`` of the methods whose first statement returns
            unless ``pp_group.is_last_rank`` (0.5.23: ``deepseek_v2.py``, ``llama.py``,
            ``qwen3_moe.py`` and 16 more): their earlier stages never capture.
        every_stage: methods without a stage test (they set layers on every stage).
        delegating: methods that hand the ids to another model's method (multimodal wrappers).
    """

    last_stage_only: tuple[str, ...]
    every_stage: tuple[str, ...]
    delegating: tuple[str, ...]

    def describe(self) -> str:
        def names(where: tuple[str, ...]) -> str:
            return ", ".join(w.split(":")[0].removesuffix(".py") for w in where) or "none"

        def count(where: tuple[str, ...]) -> str:
            return f"{len(where)} model file" + ("" if len(where) == 1 else "s")

        return (f"{count(self.last_stage_only)}: captures on the last stage only ({METHOD} returns "
                f"on the others: {names(self.last_stage_only)}); {count(self.every_stage)} have no stage test "
                f"({names(self.every_stage)}); {count(self.delegating)} hand the ids to another model")


def _first_statement(method: ast.FunctionDef) -> ast.stmt | None:
    body = [n for n in method.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return body[0] if body else None


@functools.lru_cache(maxsize=8)
def read_family_stage_checks(location: str | Path) -> FamilyStageChecks:
    """Sort every ``set_eagle3_layers_to_capture`` under ``srt/models`` of the SGLang at ``location``."""
    early, every, delegating = [], [], []
    for path in sorted((Path(location) / MODELS_DIR).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.FunctionDef) and node.name == METHOD):
                continue
            where = f"{path.name}:{node.lineno}"
            first = _first_statement(node)
            if (isinstance(first, ast.If) and "is_last_rank" in ast.unparse(first.test)
                    and first.body and isinstance(first.body[0], ast.Return)):
                early.append(where)
            elif any(isinstance(n, ast.Attribute) and n.attr == METHOD for n in ast.walk(node)):
                delegating.append(where)
            else:
                every.append(where)
    return FamilyStageChecks(tuple(early), tuple(every), tuple(delegating))


@functools.lru_cache(maxsize=8)
def read_pp_code(location: str | Path, architecture: str = "DeepseekV3ForCausalLM") -> PpCode:
    """Read the gates, the split and the stage check from the installed SGLang at ``location``
    (once per location and architecture in a process)."""
    root = Path(location)
    split, split_where = _read_split(root)
    captures, where, why = _stage_check(ModelFileReader(root), architecture)
    return PpCode(_find_phrase(root, EAGLE_GATE_PHRASE), _find_phrase(root, CAPTURE_GATE_PHRASE),
                  captures, where, split, split_where, why, _find_phrase(root, OVERLAP_GATE_PHRASE),
                  _find_phrase(root, PP_SPEC_SWITCH))
