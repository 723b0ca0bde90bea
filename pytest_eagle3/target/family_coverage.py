"""Which of the installed SGLang's EAGLE-3 model files the suite runs, and why not the others.

Joins three readings, none of which imports SGLang or transformers:

* the model files that capture for EAGLE-3, with their rules, capture sites
  and needs (:func:`pytest_eagle3.sglang_source.family_files.read_family_files`);
* the packaged target presets (``fixtures/targets``), by the architecture
  their ``config.json`` names;
* the installed transformers' model files: the class of each architecture
  (``class <Architecture>(`` in ``transformers/models/*/modeling_*.py``),
  without which there is no reference to compare with.

A file is *run* when a packaged preset serves one of its architectures
(``--eagle3-target <preset>``; what each run measured is in
docs/families.md).  Any other file is listed with why it is not run: the needs
read from the file, a missing transformers class, or no preset built yet.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from pytest_eagle3.sglang_source.family_files import FamilyFile, read_family_files
from pytest_eagle3.target.spec import preset_configs

#: Status words of :attr:`Coverage.status`.
RUN = "run"
NOT_RUN = "not run"

#: ``{file}``, ``{archs}``, ``{status}``.
LINE = "{file} [{archs}]: {status}"


@dataclass(frozen=True)
class Coverage:
    """One model file and whether the suite runs it.

    Attributes:
        family: what the file says (:class:`~pytest_eagle3.sglang_source.family_files.FamilyFile`).
        presets: the packaged presets whose architecture the file registers.
        transformers_class: ``models/qwen2/modeling_qwen2.py`` where the installed
            transformers defines the file's architecture; ``""`` where it defines none.
    """

    family: FamilyFile
    presets: tuple[str, ...]
    transformers_class: str

    @property
    def status(self) -> str:
        return RUN if self.presets else NOT_RUN

    def reason(self) -> str:
        """Why the file is not run (``""`` when it is): each need with its line, else
        the missing transformers class, else "no preset built yet"."""
        if self.presets:
            return ""
        parts = [f"needs {meaning} ({where})" for _name, where, meaning in self.family.needs]
        if not self.transformers_class:
            parts.append(f"the installed transformers defines none of {', '.join(self.family.architectures)}: "
                         "no reference")
        if not self.family.rule.known:
            parts.append(f"its id rule cannot be read ({self.family.rule.source})")
        if not parts:
            parts.append("no preset built yet (the file needs nothing the CPU tier lacks, as read)")
        return "; ".join(parts)

    def lines(self) -> list[str]:
        """The block ``pytest-eagle3 info --families`` prints for this file."""
        f = self.family
        if self.presets:
            status = f"{RUN}: --eagle3-target {', '.join(self.presets)}"
        else:
            status = f"{NOT_RUN}: {self.reason()}"
        out = [LINE.format(file=f.file, archs=", ".join(f.architectures), status=status)]
        if f.rule.known:
            out.append(f"    id rule: {f.rule.describe()}")
            out.append(f"    no ids: {f.default_ids_text()}")
            if f.rule.last_layer:
                out.append(f"    id = L: the last layer's output ({f.rule.last_layer})")
        out.append(f"    capture site: {f.site_text()}")
        return out


def preset_architectures() -> dict[str, list[str]]:
    """``{architecture: [preset, ...]}`` of the packaged target presets."""
    out: dict[str, list[str]] = {}
    for name, config in preset_configs().items():
        for arch in config.get("architectures") or []:
            out.setdefault(str(arch), []).append(name)
    return out


def transformers_classes() -> dict[str, str]:
    """``{class name: models/<dir>/modeling_<dir>.py}`` of the installed transformers'
    causal-LM and conditional-generation classes, read from its files."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return {}
    root = Path(list(spec.submodule_search_locations)[0])
    rx = re.compile(r"^class (\w+For(?:CausalLM|ConditionalGeneration))\(", re.M)
    out: dict[str, str] = {}
    for path in sorted(root.glob("models/*/modeling_*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for name in rx.findall(text):
            out.setdefault(name, str(path.relative_to(root)))
    return out


def coverage(location: str | Path) -> list[Coverage]:
    """:class:`Coverage` of every EAGLE-3 model file of the SGLang package at ``location``."""
    presets = preset_architectures()
    classes = transformers_classes()
    out = []
    for fam in read_family_files(location):
        found = tuple(sorted({p for arch in fam.architectures for p in presets.get(arch, [])}))
        cls = next((classes[a] for a in (fam.architecture, *fam.architectures) if a in classes), "")
        out.append(Coverage(fam, found, cls))
    return out


def summary(items: list[Coverage]) -> str:
    """``the suite runs 12 of 29 EAGLE-3 model files of this SGLang``."""
    ran = sum(1 for c in items if c.presets)
    return f"the suite runs {ran} of {len(items)} EAGLE-3 model files of this SGLang (set_eagle3_layers_to_capture)"
