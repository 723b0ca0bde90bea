"""Every model file of the installed SGLang that captures for EAGLE-3, read without importing it.

SGLang 0.5.23 ships 29 files in ``srt/models/`` that define
``set_eagle3_layers_to_capture``; a fork may have more or fewer.  For each,
:func:`read_family_files` reports what the file itself says:

* the architectures it registers (``EntryClass``);
* the id rule, default ids and layer-0 capture of its first architecture whose
  rule can be read (:func:`pytest_eagle3.sglang_source.model_code.read_rules`,
  which runs SGLang's own method on a stand-in);
* the capture site of the inner model's ``forward``
  (:func:`pytest_eagle3.sglang_source.capture_loop.capture_site`): handed to the
  layer boundary, appended by the model loop (and what), or a per-layer flag;
* what the file needs beyond the code paths the CPU tier runs, each found by a
  statement of the file (:data:`NEEDS`, an import or a call, with its line):
  a kernel package with no CPU path in SGLang's CPU mode, another framework, a
  vision tower.  A need is a fact read from the file; whether SGLang's CPU mode
  can run the file anyway is measured only by running it (docs/families.md).

Stdlib only; nothing imports SGLang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pytest_eagle3.conventions import IdRule, unknown_rule
from pytest_eagle3.sglang_source.capture_loop import SITE_UNKNOWN, capture_site
from pytest_eagle3.sglang_source.model_code import inner_forward, method_files, read_rules
from pytest_eagle3.sglang_source.model_files import ModelFileReader


@dataclass(frozen=True)
class Need:
    """A statement pattern of a model file and what it means for the CPU tier."""

    name: str
    pattern: str  # a regular expression matched against each line of the file
    meaning: str


#: What a model file can need that the CPU tier's recipe does not provide
#: (docs/cpu-tier.md), found by a line of the file itself.  Read on 0.5.23.
#: Gated delta-net layers (Qwen3-Next, Qwen3.5) are not among them: the CPU
#: tier serves SGLang's CPU ops for them (``worker/cpu/shim/sgl_kernel/mamba.py``).
NEEDS: tuple[Need, ...] = (
    Need("mindspore", r"^\s*(import mindspore|from mindspore)|MindSpore",
         "MindSpore, which runs its layers instead of SGLang's torch model code"),
    Need("dsa-indexer", r"is_deepseek_dsa|nsa_indexer|NativeSparseAttn|Indexer\(",
         "DeepSeek sparse attention (a top-k indexer over the KV cache)"),
    Need("multimodal", r"from sglang\.srt\.managers\.mm_utils import",
         "a multimodal checkpoint: the wrapper loads a vision tower beside the language model and "
         "SGLang loads the model path's processor at start, so a preset is the wrapper's config with "
         "vision weights and a processor (as tiny-qwen2-5-vl; text-only prompts reach the language model)"),
    Need("mhc", r"from sglang\.kernels\.ops\.layernorm\.mhc import",
         "hyper-connections (mhc) kernels"),
    Need("zero-experts", r"zero_experts_compute_triton",
         "zero-compute experts through a triton kernel"),
)


@dataclass(frozen=True)
class FamilyFile:
    """One model file that defines ``set_eagle3_layers_to_capture``.

    Attributes:
        file: ``srt/models/qwen2.py``.
        architectures: its ``EntryClass`` names, in the file's order.
        architecture: the one whose rule was read (the first readable one).
        rule: the id rule of ``architecture`` (``rule.source`` names file:line).
        site: ``(kind, file:line, code)`` of the capture in the inner model's forward.
        needs: ``(need name, file:line, meaning)`` for each :data:`NEEDS` entry the file matches.
    """

    file: str
    architectures: tuple[str, ...]
    architecture: str
    rule: IdRule
    site: tuple[str, str, str]
    needs: tuple[tuple[str, str, str], ...] = field(default=())

    def default_ids_text(self, num_layers: int = 8) -> str:
        """``layers_to_capture [2, 4, 5] on 8 layers`` without ids, ``unknown``, or ``raises <Error>``."""
        if not self.rule.known:
            return "unknown"
        try:
            layers = self.rule.layers_to_capture(None, num_layers)
        except Exception as exc:  # SGLang's own method on a stand-in: anything it raises is the answer
            return f"raises {type(exc).__name__}"
        return f"layers_to_capture {list(layers)} on {num_layers} layers"

    def site_text(self) -> str:
        kind, where, code = self.site
        if kind == SITE_UNKNOWN:
            return f"{kind} ({where})"
        return f"{kind}: {code} ({where})"


def _needs(location: Path, rel: str) -> tuple[tuple[str, str, str], ...]:
    try:
        lines = (location / rel).read_text(encoding="utf-8").splitlines()
    except OSError:
        return ()
    found = []
    for need in NEEDS:
        rx = re.compile(need.pattern)
        for number, line in enumerate(lines, 1):
            if rx.search(line):
                found.append((need.name, f"{rel}:{number}", need.meaning))
                break
    return tuple(found)


def read_family_files(location: str | Path, *, probe_layers: int = 8) -> list[FamilyFile]:
    """Every model file of the SGLang at ``location`` defining ``set_eagle3_layers_to_capture``.

    Args:
        location: the ``sglang`` package directory.
        probe_layers: the layer count the default ids are read on.

    Never raises for unreadable code: a file whose rule cannot be read has a
    rule of kind ``unknown`` naming why.
    """
    location = Path(location)
    reader = ModelFileReader(location)
    out = []
    for rel, names in method_files(location):
        codes = [read_rules(location, name, probe_layers=probe_layers) for name in names]
        code = next((c for c in codes if c.rule.known), codes[0] if codes else None)
        chosen = code.architecture if code is not None else ""
        rule = code.rule if code is not None else unknown_rule(f"{rel}: its EntryClass names no class")
        site: tuple[str, str, str] = (SITE_UNKNOWN, rel, "")
        mod = reader.module(rel)
        found = reader.resolve_class(mod, chosen) if (mod is not None and chosen) else None
        inner = inner_forward(reader, found) if found is not None else None
        if inner is not None:
            site = capture_site(inner)
        out.append(FamilyFile(rel, tuple(names), chosen, rule, site, _needs(location, rel)))
    return out
