"""Target specs: which reduced-layer model a test run is about.

A *target* is either

* a :class:`TargetSpec`: a preset from ``fixtures/targets/<name>.json`` (or any
  spec file with the same fields) from which :mod:`pytest_eagle3.target.checkpoint`
  builds a checkpoint with known, deterministic weights; or
* a :class:`LocalTarget`: a user's checkpoint directory used as-is.

:func:`resolve_target` turns the ``--eagle3-target`` value into one of them.

Spec file format (JSON object)::

    {"name": "tiny-dsv3", "description": "...", "seed": 0,
     "init": {... InitParams fields ...},
     "config": {... Hugging Face config.json ...}}

Nothing here imports torch; the spec is plain data.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Union

from pytest_eagle3.errors import Eagle3ConfigError
import pytest_eagle3
from pytest_eagle3.target.checkpoint.families import language_config
from pytest_eagle3.target.prompts import load_prompts as read

#: ``{value}``: what the user passed; ``{known}``: comma-separated preset names.
UNKNOWN_TARGET_MSG = (
    "unknown target preset {value!r}; known: {known}; "
    "or pass a directory containing config.json"
)
#: ``{path}``: the directory.
MISSING_CONFIG_MSG = (
    "target directory {path} has no config.json; pass a Hugging Face checkpoint "
    "directory or a preset name"
)
#: ``{path}``, ``{error}``.
BAD_SPEC_MSG = "target spec {path} is invalid: {error}; fix the file or use a preset"
#: ``{path}``, ``{error}``.

#: Where a checkpoint's weights can be drawn (``init.build_device``).
BUILD_DEVICES = ("cpu", "cuda")
#: Keys of a spec file.
_SPEC_KEYS = frozenset({"name", "description", "seed", "init", "config"})
#: Config fields every target must have (read by :class:`TargetFacts`).
_REQUIRED_CONFIG = ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads")


def fixtures_dir() -> Path:
    """The packaged ``fixtures`` directory.

    In a wheel it is ``pytest_eagle3/data`` (hatch ``force-include`` of the
    repository's ``fixtures/``); in a source checkout or editable install it is
    ``<repo>/fixtures``.
    """

    pkg = Path(pytest_eagle3.__file__).resolve().parent
    inside = pkg / "data"
    if inside.is_dir():
        return inside
    return pkg.parent / "fixtures"


def targets_dir() -> Path:
    """``fixtures/targets``: one ``<preset>.json`` per target preset."""
    return fixtures_dir() / "targets"


def list_presets() -> list[str]:
    """Sorted names of the packaged target presets, e.g. ``["tiny-dsv3"]``."""
    d = targets_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json"))


def preset_configs() -> dict[str, dict[str, Any]]:
    """``{preset: config.json dict}`` of the packaged presets, sorted by name; a
    preset file that cannot be read is left out (its use reports it)."""
    out: dict[str, dict[str, Any]] = {}
    for name in list_presets():
        try:
            config = json.loads((targets_dir() / f"{name}.json").read_text(encoding="utf-8"))["config"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(config, dict):
            out[name] = config
    return out


@dataclass(frozen=True)
class InitParams:
    """Parameters of the distinguishable-layers init (docs/design.md, "Reduced-layer targets").

    Attributes:
        embedding_std: std of ``embed_tokens`` entries, N(0, std^2).
        matrix_gain: every linear weight is N(0, gain / fan_in).
        norm_lognormal_sigma: RMSNorm weights are ``exp(N(0, sigma^2))``.
        branch_variance_ratio: each attention and MLP output is scaled so its
            RMS is ``sqrt(ratio)`` times the RMS of the residual stream it reads.
        router_bias: value added to ``e_score_correction_bias`` of the pinned experts.
        pinned_experts: experts pinned per MoE layer (rotating across layers);
            must be >= ``num_experts_per_tok`` so top-k never depends on scores.
        calibration_sequences: sequences in the calibration batch.
        calibration_tokens: tokens per calibration sequence.
        scale_mantissa_bits: branch scales are rounded to this many mantissa
            bits so float noise in the calibration forward cannot change bytes.
        build_device: ``"cpu"`` or ``"cuda"``: where the weights are drawn and
            calibrated.  GPU-tier presets (billions of parameters) are built on
            a GPU in seconds; the device is part of the cache key because the
            two generators draw different numbers.
    """

    embedding_std: float = 1.0
    matrix_gain: float = 1.0
    norm_lognormal_sigma: float = 0.6
    branch_variance_ratio: float = 0.6
    router_bias: float = 4.0
    pinned_experts: int = 2
    calibration_sequences: int = 4
    calibration_tokens: int = 32
    scale_mantissa_bits: int = 8
    build_device: str = "cpu"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InitParams:
        """Build from the spec's ``init`` object.

        Raises:
            ValueError: unknown key or a value of the wrong type.
        """
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown init keys {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {}
        for key, value in data.items():
            default = getattr(cls, key)
            if isinstance(default, str):
                if value not in BUILD_DEVICES:
                    raise ValueError(f"init.{key} must be one of {BUILD_DEVICES}, got {value!r}")
            elif isinstance(default, int) and not isinstance(default, bool):
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"init.{key} must be an integer, got {value!r}")
            elif not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"init.{key} must be a number, got {value!r}")
            values[key] = type(default)(value)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return asdict(self)


#: The architecture of the presets (DeepSeek-V3, Kimi-K2's language model).
DEFAULT_ARCHITECTURE = "DeepseekV3ForCausalLM"


@dataclass(frozen=True)
class TargetFacts:
    """The facts of a target the rest of the package reads: one shape for a
    preset and for a user's checkpoint, built once from its ``config.json``.

    Attributes:
        num_layers: ``num_hidden_layers`` (``L``).
        hidden_size: ``hidden_size`` (``H``).
        vocab_size: ``vocab_size``.
        num_attention_heads: TP sizes must divide it.
        first_k_dense_replace: layers before it are dense (DeepSeek-V3; 0 if absent).
        torch_dtype: the config's ``torch_dtype`` (``"float32"`` if absent).
        kv_lora_rank, qk_rope_head_dim: MLA latent and rope widths (``None``
            without MLA); CUDA attention kernels check them.
        architecture: the config's first ``architectures`` entry: the SGLang
            model class whose capture rules apply (``sglang_source/model_code.py``).
    """

    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    first_k_dense_replace: int = 0
    torch_dtype: str = "float32"
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    architecture: str = DEFAULT_ARCHITECTURE

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TargetFacts:
        """Read a Hugging Face ``config.json`` dict (the required integer keys
        are checked by :class:`TargetSpec` / :class:`LocalTarget` first; a
        multimodal wrapper's are its ``text_config``'s)."""
        config = language_config(config)
        return cls(
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            vocab_size=int(config["vocab_size"]),
            num_attention_heads=int(config["num_attention_heads"]),
            first_k_dense_replace=int(config.get("first_k_dense_replace") or 0),
            torch_dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
            kv_lora_rank=_opt_int(config.get("kv_lora_rank")),
            qk_rope_head_dim=_opt_int(config.get("qk_rope_head_dim")),
            architecture=_architecture(config),
        )


def _architecture(config: dict[str, Any]) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return DEFAULT_ARCHITECTURE


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TargetSpec:
    """A target whose checkpoint pytest-eagle3 builds itself.

    Attributes:
        name: preset name, used in cache directory names (``tiny-dsv3``).
        description: free text for people; not part of the cache key.
        config: the Hugging Face ``config.json`` content (do not mutate).
        init: weight init parameters.
        seed: seed of the ``torch.Generator`` that draws every weight.
        source: the spec file it was read from, if any (not part of the key).
    """

    name: str
    description: str
    config: dict[str, Any]
    init: InitParams = field(default_factory=InitParams)
    seed: int = 0
    source: Path | None = field(default=None, compare=False)

    def __hash__(self) -> int:
        return hash(self.canonical_json)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: Path | None = None) -> TargetSpec:
        """Build from a parsed spec file.

        Raises:
            Eagle3ConfigError: missing/unknown keys or wrong types.
        """
        where = source if source is not None else "<dict>"
        try:
            if not isinstance(data, dict):
                raise ValueError("top level must be a JSON object")
            unknown = sorted(set(data) - _SPEC_KEYS)
            if unknown:
                raise ValueError(f"unknown keys {unknown}")
            for key in ("name", "config"):
                if key not in data:
                    raise ValueError(f"missing key {key!r}")
            config = data["config"]
            if not isinstance(config, dict):
                raise ValueError("'config' must be an object")
            missing = [k for k in _REQUIRED_CONFIG if not isinstance(language_config(config).get(k), int)]
            if missing:
                raise ValueError(f"config lacks integer fields {missing}")
            seed = data.get("seed", 0)
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise ValueError(f"'seed' must be an integer, got {seed!r}")
            init = InitParams.from_dict(data.get("init", {}))
            if init.pinned_experts < int(language_config(config).get("num_experts_per_tok") or 0):
                raise ValueError("init.pinned_experts must be >= config.num_experts_per_tok")
        except ValueError as exc:
            raise Eagle3ConfigError(BAD_SPEC_MSG.format(path=where, error=exc)) from None
        return cls(
            name=str(data["name"]),
            description=str(data.get("description", "")),
            config=copy.deepcopy(config),
            init=init,
            seed=seed,
            source=source,
        )

    @classmethod
    def from_file(cls, path: Path) -> TargetSpec:
        """Read a spec JSON file.

        Raises:
            Eagle3ConfigError: unreadable file, bad JSON or bad content.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise Eagle3ConfigError(BAD_SPEC_MSG.format(path=path, error=exc)) from None
        return cls.from_dict(data, source=Path(path))

    @classmethod
    def preset(cls, name: str) -> TargetSpec:
        """The packaged preset ``name``.

        Raises:
            Eagle3ConfigError: no such preset (message lists the known ones).
        """
        path = targets_dir() / f"{name}.json"
        if not path.is_file():
            raise Eagle3ConfigError(
                UNKNOWN_TARGET_MSG.format(value=name, known=", ".join(list_presets()) or "none")
            )
        return cls.from_file(path)

    def key_material(self) -> dict[str, Any]:
        """Everything in the spec that determines the checkpoint bytes; the cache
        adds its builder version (:func:`pytest_eagle3.target.checkpoint.cache.cache_key`)."""
        return {
            "name": self.name,
            "seed": self.seed,
            "init": self.init.to_dict(),
            "config": self.config,
        }

    @cached_property
    def canonical_json(self) -> str:
        """Canonical JSON of :meth:`key_material` (computed once)."""
        return json.dumps(self.key_material(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @cached_property
    def facts(self) -> TargetFacts:
        """The :class:`TargetFacts` of :attr:`config` (computed once)."""
        return TargetFacts.from_config(self.config)


@dataclass(frozen=True)
class LocalTarget:
    """A user's checkpoint directory, used as-is (never rebuilt or modified).

    Attributes:
        path: the directory (resolved); contains ``config.json``.
        config: its parsed ``config.json``.
    """

    path: Path
    config: dict[str, Any] = field(compare=False, hash=False)

    @classmethod
    def from_dir(cls, path: Path) -> LocalTarget:
        """Read ``path/config.json``.

        Raises:
            Eagle3ConfigError: the directory or ``config.json`` is missing or unreadable.
        """
        path = Path(path).expanduser().resolve()
        cfg = path / "config.json"
        if not cfg.is_file():
            raise Eagle3ConfigError(MISSING_CONFIG_MSG.format(path=path))
        try:
            config = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise Eagle3ConfigError(BAD_SPEC_MSG.format(path=cfg, error=exc)) from None
        missing = [k for k in _REQUIRED_CONFIG if not isinstance(language_config(config).get(k), int)]
        if missing:
            raise Eagle3ConfigError(
                BAD_SPEC_MSG.format(path=cfg, error=f"config lacks integer fields {missing}")
            )
        return cls(path=path, config=config)

    @property
    def name(self) -> str:
        """The directory name."""
        return self.path.name

    @property
    def checkpoint_dir(self) -> Path:
        """Where the checkpoint is: :attr:`path` itself."""
        return self.path

    @cached_property
    def facts(self) -> TargetFacts:
        """The :class:`TargetFacts` of its ``config.json`` (computed once)."""
        return TargetFacts.from_config(self.config)


Target = Union[TargetSpec, LocalTarget]


def resolve_target(value: str) -> TargetSpec | LocalTarget:
    """Turn an ``--eagle3-target`` value into a target.

    Order: a packaged preset name (``tiny-dsv3``); a ``*.json`` spec file; a
    checkpoint directory containing ``config.json``.

    Raises:
        Eagle3ConfigError: neither a preset nor an existing spec file/directory
            (the message lists the presets), or the directory lacks ``config.json``.
    """
    if value in list_presets():
        return TargetSpec.preset(value)
    path = Path(value).expanduser()
    if path.is_file() and path.suffix == ".json":
        return TargetSpec.from_file(path)
    if path.is_dir():
        return LocalTarget.from_dir(path)
    raise Eagle3ConfigError(
        UNKNOWN_TARGET_MSG.format(value=value, known=", ".join(list_presets()) or "none")
    )


def prompts_path() -> Path:
    """``fixtures/prompts.json``."""
    return fixtures_dir() / "prompts.json"


def load_packaged_prompts(path: Path | None = None, *, vocab_size: int | None = None) -> list[list[int]]:
    """Token-id prompts of the packaged suite (``fixtures/prompts.json`` by default;
    the formats of :mod:`pytest_eagle3.target.prompts`, token ids only).

    Args:
        path: another prompts file.
        vocab_size: if given, every id must be in ``[0, vocab_size)``.

    Returns:
        One list of token ids per prompt, in file order.

    Raises:
        Eagle3ConfigError: unreadable file, bad format, text, or an id out of range.
    """

    return read(prompts_path() if path is None else Path(path), vocab_size=vocab_size or 2**62)
