"""What the SGLang installed in this environment is, and which server flags it has.

Feature detection never assumes a version: the flags come from the installed
``python -m sglang.launch_server --help`` (8 s on 2 cores for 0.5.23, cached per
install), the version and location from package metadata without importing
SGLang in the test process.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from pytest_eagle3.reaper import die_with_parent
from pytest_eagle3.errors import Eagle3SGLangMissing
from pytest_eagle3.libversions import owning_distribution
from pytest_eagle3.sglang_source.model_code import read_rules
from pytest_eagle3.sglang_source.norm_code import DISPATCH_FILE, LAYERNORM_FILE, read_norm_code
from pytest_eagle3.sglang_source.fusion_code import GATE_FILE, OP_FILE, read_fusion_code
from pytest_eagle3.worker.sglang_hooks import IMPORT_HOOK_LOADER, PLUGIN_LOADER

if TYPE_CHECKING:
    from pytest_eagle3.conventions import IdRule
    from pytest_eagle3.sglang_source.model_code import ModelCode
    from pytest_eagle3.sglang_source.norm_code import NormCode
    from pytest_eagle3.sglang_source.fusion_code import FusionCode

NOT_INSTALLED = (
    "SGLang is not installed in this environment ({python}); install it "
    "(e.g. pip install 'pytest-eagle3[cpu]' for the pinned CPU tier) or activate "
    "the environment that has your SGLang fork"
)
IMPORT_FAILED = (
    "SGLang {version} at {location} fails to start: {error} "
    "(run `{python} -m sglang.launch_server --help` to see the full traceback)"
)

_FLAG = re.compile(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)")


@dataclass(frozen=True)
class SGLangInstall:
    """The installed SGLang.

    Attributes:
        version: distribution version, e.g. ``0.5.23``.
        location: directory of the ``sglang`` package.
        flags: long server flags with dashes, without ``--`` (``enable-return-hidden-states``).
        python: interpreter that runs it.
    """

    version: str
    location: str
    flags: frozenset[str]
    python: str

    def has_arg(self, name: str) -> bool:
        """Whether the server accepts argument ``name`` (underscores or dashes)."""
        return name.replace("_", "-") in self.flags

    @property
    def distribution(self) -> str | None:
        """The installed distribution that owns this copy (``sglang``, or a fork's
        own name such as ``sglang-kt``); ``None`` for a source tree."""

        found = owning_distribution("sglang", self.location)
        return found[0] if found else None

    def describe(self) -> str:
        dist = self.distribution
        if dist and dist.lower() != "sglang":
            return f"sglang {self.version} (distribution {dist}, {self.location})"
        return f"sglang {self.version} ({self.location})"

    def source(self, relative: str) -> str | None:
        """The text of ``relative`` inside the installed ``sglang`` package (``None``:
        absent or unreadable): feature detection reads the code, never imports it."""
        try:
            return (Path(self.location) / relative).read_text(encoding="utf-8")
        except OSError:
            return None

    def model_code(self, architecture: str = "DeepseekV3ForCausalLM") -> "ModelCode":
        """The capture rules of ``architecture`` read from this install's model file
        (:func:`pytest_eagle3.sglang_source.model_code.read_rules`; cached, well under a second)."""

        return read_rules(self.location, architecture)

    def norm_code(self) -> "NormCode":
        """Whether this install's ``srt/layers/layernorm.py`` has the AMX in-place norm
        branch the CPU tier can run (:func:`pytest_eagle3.sglang_source.norm_code.read_norm_code`)."""

        return read_norm_code(self.source(LAYERNORM_FILE), dispatch_text=self.source(DISPATCH_FILE))

    def fusion_code(self) -> "FusionCode":
        """Whether the CPU tier can open this install's all-reduce fusion gate
        (:func:`pytest_eagle3.sglang_source.fusion_code.read_fusion_code`)."""

        return read_fusion_code(self.source(GATE_FILE), self.source(OP_FILE))

    def id_rule(self, architecture: str = "DeepseekV3ForCausalLM") -> "IdRule":
        """The aux layer-id rule of ``architecture`` in this install, read from its code."""
        return self.model_code(architecture).rule

    @property
    def general_plugins(self) -> bool:
        """Whether this SGLang loads general plugins in every process
        (``srt/plugins/__init__.py`` defines ``load_plugins``; sglang 0.5.11 on).
        Without it pytest-eagle3's hooks reach the workers through its
        ``sitecustomize`` import hook (:mod:`pytest_eagle3.worker.sglang_hooks`)."""
        text = self.source("srt/plugins/__init__.py")
        return text is not None and "def load_plugins" in text

    def eagle3_capture(self, architecture: str = "DeepseekV3ForCausalLM") -> bool | None:
        """Whether this SGLang's model for ``architecture`` can capture EAGLE-3 aux
        hidden states (its class or a base defines ``set_eagle3_layers_to_capture``;
        absent from DeepSeek in 0.5.4).  ``None`` when that cannot be read."""
        rule = self.id_rule(architecture)
        if not rule.supported:
            return False
        return True if rule.known else None

    @property
    def cpu_tree_mask(self) -> bool:
        """Whether this SGLang's CPU attention backend hands a speculative verify's
        tree mask to ``extend_attention_cpu`` (0.5.23
        ``srt/layers/attention/intel_amx_backend.py`` ``_build_extend_metadata``:
        ``spec_info.custom_mask`` when ``tree_topk != 1``).  Without it a token
        tree (EAGLE top-k > 1) is verified under a causal mask on CPU: siblings
        see each other, so the CPU tier runs chains only there."""
        text = self.source("srt/layers/attention/intel_amx_backend.py") or ""
        return "custom_mask" in text and "tree_mask" in text

    @property
    def spec_v2_cpu_gap(self) -> bool:
        """Whether this SGLang's overlap scheduler for speculative decoding v2 calls
        ``record_stream`` with no CPU branch (sglang 0.5.12
        ``srt/managers/overlap_utils.py`` ``FutureMap.resolve_future``: "unknown
        parameter type" on CPU; 0.5.23 skips it on CPU).  The CPU tier then runs
        EAGLE-3 through SGLang's v1 worker (``SGLANG_ENABLE_SPEC_V2=False``)."""
        text = self.source("srt/managers/overlap_utils.py") or ""
        start = text.find("def resolve_future")
        if start < 0:
            return False
        end = text.find("\n    def ", start + 1)
        body = text[start:end if end > 0 else len(text)]
        return "record_stream" in body and "cpu" not in body.lower()

    @property
    def hook_loader(self) -> str:
        """How pytest-eagle3's hooks reach SGLang's processes (for the report header)."""

        return PLUGIN_LOADER if self.general_plugins else IMPORT_HOOK_LOADER


def locate() -> tuple[str, str]:
    """``(version, package directory)`` of SGLang, without importing it.

    Raises:
        Eagle3SGLangMissing: no ``sglang`` package is importable.
    """
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise Eagle3SGLangMissing(NOT_INSTALLED.format(python=sys.executable))
    location = str(Path(list(spec.submodule_search_locations)[0]).resolve())
    return _version_at(location), location


def version_at(location: str | Path) -> tuple[str, str]:
    """``(version, where it came from)`` of the SGLang package at ``location``,
    without importing it: the one resolver the report header, the JSON report
    and the id rule share.

    Order: the ``sglang`` distribution, only if it owns this copy (a fork or a
    source tree earlier on ``sys.path`` shadows it, and is what runs); the
    package's build-generated ``_version.py``; a literal ``__version__`` in its
    ``version.py`` (placeholders such as ``0.0.0.dev0`` in a fallback branch are
    skipped); any other distribution that owns the copy.  ``where`` is
    ``"dist"``, ``"_version.py"``, ``"version.py"`` or ``"unknown"``.
    """
    location = Path(location)
    owned = _owning_dist_version(["sglang"], location)
    if owned:
        return owned, "dist"
    for name in ("_version.py", "version.py"):
        try:
            text = (location / name).read_text(encoding="utf-8")
        except OSError:
            continue
        found = [v for v in re.findall(r"""__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", text)
                 if not v.startswith("0.0.0")]
        if found:
            return found[0], name
    others = importlib.metadata.packages_distributions().get("sglang", [])
    other = _owning_dist_version(others, location)
    if other:
        return other, "dist"
    return "unknown (no distribution owns it, no version file)", "unknown"


def _owning_dist_version(names: list[str], location: Path) -> str | None:
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
            if Path(str(dist.locate_file("sglang"))).resolve() == location.resolve():
                return dist.version
        except (importlib.metadata.PackageNotFoundError, OSError, TypeError, NotImplementedError):
            continue
    return None


def sglang_location_and_version() -> tuple[Path | None, str | None]:
    """``(package directory, version)`` of the importable ``sglang`` without importing
    it; ``(None, None)`` when there is none.  The one resolver the header and the
    JSON report share."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None, None
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        location = Path(spec.origin).parent
    else:
        location = Path(next(iter(spec.submodule_search_locations or []), "?"))
    version, where = version_at(location)
    return location, version if where in ("dist", "unknown") else f"{version} ({where})"


def _version_at(location: str) -> str:
    return version_at(location)[0]


def parse_flags(help_text: str) -> frozenset[str]:
    """Long flags named in an argparse ``--help`` text."""
    return frozenset(_FLAG.findall(help_text))


def _fingerprint(location: str, version: str) -> str:
    stamp = [version, location]
    for rel in ("server_args.py", "srt/server_args.py", "srt/arg_groups"):
        path = Path(location) / rel
        if path.exists():
            stamp.append(f"{rel}:{path.stat().st_mtime_ns}")
    return hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]


def probe(cache_dir: Path | None = None, *, python: str | None = None, timeout: float = 300) -> SGLangInstall:
    """Describe the installed SGLang, reading its flags from ``--help``.

    Args:
        cache_dir: where the flag list is cached (keyed by version, location and
            the mtime of its argument definitions); ``None`` disables caching.
        python: interpreter to probe (default: this one).

    Raises:
        Eagle3SGLangMissing: SGLang is absent or ``launch_server --help`` fails;
            the message is one line naming the last error line.
    """
    python = python or sys.executable
    version, location = locate()
    cache_file = None
    if cache_dir is not None:
        cache_file = Path(cache_dir) / "sglang-flags" / f"{_fingerprint(location, version)}.json"
        if cache_file.is_file():
            try:
                flags = frozenset(json.loads(cache_file.read_text()))
                return SGLangInstall(version, location, flags, python)
            except (OSError, ValueError):
                pass
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    try:
        proc = subprocess.run(
            [python, "-m", "sglang.launch_server", "--help"],
            capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=die_with_parent,
        )
    except subprocess.TimeoutExpired:
        raise Eagle3SGLangMissing(
            IMPORT_FAILED.format(version=version, location=location,
                                 error=f"--help did not answer in {timeout:.0f} s", python=python)
        ) from None
    if proc.returncode != 0 or "--model-path" not in proc.stdout:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        error = lines[-1].strip() if lines else f"exit code {proc.returncode}"
        raise Eagle3SGLangMissing(
            IMPORT_FAILED.format(version=version, location=location, error=error, python=python)
        )
    flags = parse_flags(proc.stdout)
    if cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(sorted(flags)))
            os.replace(tmp, cache_file)
        except OSError:
            pass
    return SGLangInstall(version, location, flags, python)
