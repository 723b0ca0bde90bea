"""Read an EAGLE-3 draft checkpoint directory: its layer ids, hidden size and ``fc`` shape.

No weights are loaded: the ``fc`` shape comes from the safetensors header.
:func:`read_draft_config` is the one reader of a draft's ``config.json``; :func:`load_draft`
takes what it read to the rest.

Config formats understood:

* Hugging Face style (SpecForge, EAGLE, SGLang): ``eagle_config.eagle_aux_hidden_state_layer_ids``,
  ``target_hidden_size`` (else ``hidden_size``); SpecForge's
  ``configs/deepseek-v3-671b-eagle3.json`` is an example.  SGLang 0.5.23 reads only
  this key (``sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py``).
* speculators (``speculators_model_type`` / ``speculators_config``): top-level
  ``eagle_aux_hidden_state_layer_ids`` and ``target_hidden_size``, the draft width in
  ``transformer_layer_config.hidden_size``
  (``src/speculators/models/eagle3/config.py::Eagle3SpeculatorConfig``).  vLLM reads the
  top-level key (``eagle3_utils.get_eagle3_aux_layers_from_config``).

The ``fc`` weight and its shape: :mod:`pytest_eagle3.contracts.fc_weight`; a SpecForge
0.2 run's provenance record: :mod:`pytest_eagle3.contracts.specforge_run`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pytest_eagle3.contracts.fc_weight import find_fc
from pytest_eagle3.contracts.specforge_run import specforge_capture_layers, specforge_state_file
from pytest_eagle3.errors import Eagle3ConfigError, Eagle3ContractError

#: Where the ids can be; the first is what SGLang reads.
EAGLE_CONFIG_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
TOP_LEVEL_KEY = "eagle_aux_hidden_state_layer_ids"

# Message templates (tests import these).
NO_DIR_MSG = "draft path {path} is not a directory; pass the draft checkpoint directory"
NO_CONFIG_MSG = "draft directory {path} has no config.json"
BAD_CONFIG_MSG = "draft config {path} is invalid: {error}"
BAD_IDS_MSG = "draft config {path}: {key} must be a list of non-negative ints, got {ids!r}"
EMPTY_IDS_MSG = (
    "draft config {path}: {key} is an empty list; name the layers the draft was trained on, "
    "or remove the key to get the server default"
)
CONFLICT_MSG = (
    "draft config {path} declares two different id lists: {a_key} = {a} and {b_key} = {b}; "
    "SGLang reads the first, vLLM the second: keep one"
)
PROVENANCE_IDS_KEY = "SpecForge provenance capture_layers"
PROVENANCE_DIFFERS_MSG = (
    "draft {path}: config.json declares {key} = {config_ids}, but the SpecForge provenance record {record} says "
    "it was trained on capture_layers {provenance_ids}: the config was written for another run; declare the "
    "record's ids under " + EAGLE_CONFIG_KEY
)


@dataclass(frozen=True)
class DraftInfo:
    """What a draft directory declares.

    Attributes:
        path: the directory.
        config_format: ``"hf"``, ``"speculators"``, or ``"specforge"`` (a SpecForge 0.2
            run's ``training_state.pt`` beside the config:
            :func:`~pytest_eagle3.contracts.specforge_run.specforge_state_file`).
        ids: the declared ids (the ``eagle_config`` list when present, else the
            top-level one, else a SpecForge provenance record's ``capture_layers``),
            None when none is present.
        ids_key: where they came from (:data:`EAGLE_CONFIG_KEY`, :data:`TOP_LEVEL_KEY`
            or :data:`PROVENANCE_IDS_KEY`).
        target_hidden_size: ``target_hidden_size``, else ``hidden_size``, else
            ``transformer_layer_config.hidden_size``; None when none is present.
        hidden_size_key: the key it came from.
        use_aux_hidden_state: ``eagle_config.use_aux_hidden_state`` (default True).
        dtype: ``torch_dtype`` / ``dtype`` of the config, if any.
        fc_name: the fc tensor's name, None when not read.
        fc_shape: ``(out_features, in_features)`` of fc, None when not read.
        fc_dtype: safetensors dtype code of fc (``"BF16"``), None when not read.
        fc_file: the file holding fc, relative to ``path``.
        weights_note: why fc was not read (no weight files, only ``.bin``), else None.
        config: the parsed config.json.
    """

    path: Path
    config_format: str
    ids: tuple[int, ...] | None
    ids_key: str | None
    target_hidden_size: int | None
    hidden_size_key: str | None
    use_aux_hidden_state: bool = True
    dtype: str | None = None
    fc_name: str | None = None
    fc_shape: tuple[int, ...] | None = None
    fc_dtype: str | None = None
    fc_file: str | None = None
    weights_note: str | None = None
    config: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def fc_input_width(self) -> int | None:
        """``in_features`` of fc (``fc_shape[1]``), None when fc was not read."""
        return self.fc_shape[1] if self.fc_shape is not None and len(self.fc_shape) == 2 else None

    @property
    def sglang_reads_ids(self) -> bool:
        """Whether SGLang (0.5.23) will see the ids: only under ``eagle_config``."""
        return self.ids_key == EAGLE_CONFIG_KEY


def _as_ids(value: Any, path: Path, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        raise Eagle3ContractError(BAD_IDS_MSG.format(path=path, key=key, ids=value))
    if not value:
        raise Eagle3ContractError(EMPTY_IDS_MSG.format(path=path, key=key))
    return tuple(value)


def read_draft_config(path: str | Path, error: type[Eagle3ConfigError] = Eagle3ContractError) -> dict[str, Any]:
    """The parsed ``config.json`` of a draft checkpoint directory: the one reader of
    a draft config (:func:`load_draft`, ``pytest-eagle3 inspect``, the draft checks,
    the planner's ids of a served draft, the offline power check).

    Args:
        path: the draft directory.
        error: the error class to raise (a usage error where the user named the
            path, a contract or draft error where the draft itself is wrong).

    Raises:
        Eagle3ConfigError: (``error``, one line) not a directory, no ``config.json``,
            unreadable or invalid JSON, not a JSON object.
    """
    p = Path(path).expanduser()
    if not p.is_dir():
        raise error(NO_DIR_MSG.format(path=p))
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise error(NO_CONFIG_MSG.format(path=p))
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise error(BAD_CONFIG_MSG.format(path=cfg_file, error=" ".join(str(exc).split()))) from None
    if not isinstance(config, dict):
        raise error(BAD_CONFIG_MSG.format(path=cfg_file, error="not a JSON object"))
    return config


def eagle_config_ids(config: Mapping[str, Any]) -> list[int] | None:
    """``eagle_config.eagle_aux_hidden_state_layer_ids`` of a parsed draft config
    (:func:`read_draft_config`): the ids SGLang reads (``None``: not set, SGLang uses
    its default list)."""
    ids = (config.get("eagle_config") or {}).get(TOP_LEVEL_KEY)
    return None if ids is None else [int(i) for i in ids]


def speculators_reading(path: Path) -> dict[str, Any] | None:
    """A speculators-format config read by speculators' own code (the ``speculators``
    extra: ``Eagle3SpeculatorConfig.from_pretrained``, speculators 0.9.0
    ``models/eagle3/config.py``): its ids, ``target_hidden_size`` and the EAGLE-3
    flags it resolved (defaults included).  ``None`` when speculators is not
    installed or cannot read the directory (the hand reading in :func:`load_draft`
    is used then).  Importing speculators takes seconds (datasets, openai)."""
    try:
        from speculators.models.eagle3.config import Eagle3SpeculatorConfig
    except Exception:  # not installed, or broken beside this environment's packages
        return None
    try:
        cfg = Eagle3SpeculatorConfig.from_pretrained(str(path))
    except Exception:
        return None
    out: dict[str, Any] = {}
    ids = getattr(cfg, TOP_LEVEL_KEY, None)
    if ids is not None:
        out[TOP_LEVEL_KEY] = [int(v) for v in ids]
    if getattr(cfg, "target_hidden_size", None):
        out["target_hidden_size"] = int(cfg.target_hidden_size)
    for flag in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual"):
        if hasattr(cfg, flag):
            out[flag] = bool(getattr(cfg, flag))
    return out


def load_draft(path: str | Path, error: type[Eagle3ConfigError] = Eagle3ContractError) -> DraftInfo:
    """Read ``config.json`` (once: :func:`read_draft_config`; :attr:`DraftInfo.config`
    carries it on) and the ``fc`` shape of a draft checkpoint directory.

    Args:
        path: the draft directory.
        error: the error class for a path that holds no readable config
            (:func:`read_draft_config`'s ``error``).

    Raises:
        Eagle3ContractError: not a directory, no or bad config.json (``error``), malformed or
            conflicting id lists, an unreadable safetensors file, safetensors
            files without an fc weight.
    """
    p = Path(path)
    config = read_draft_config(p, error)
    cfg_file = p / "config.json"

    fmt = "speculators" if ("speculators_model_type" in config or "speculators_config" in config) else "hf"
    eagle_config = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    nested = top = None
    if eagle_config.get(TOP_LEVEL_KEY) is not None:
        nested = _as_ids(eagle_config[TOP_LEVEL_KEY], cfg_file, EAGLE_CONFIG_KEY)
    if config.get(TOP_LEVEL_KEY) is not None:
        top = _as_ids(config[TOP_LEVEL_KEY], cfg_file, TOP_LEVEL_KEY)
    if nested is not None and top is not None and nested != top:
        raise Eagle3ContractError(
            CONFLICT_MSG.format(
                path=cfg_file, a_key=EAGLE_CONFIG_KEY, a=list(nested), b_key=TOP_LEVEL_KEY, b=list(top)
            )
        )
    if nested is not None:
        ids, ids_key = nested, EAGLE_CONFIG_KEY
    else:
        ids, ids_key = top, (TOP_LEVEL_KEY if top is not None else None)
    record = specforge_state_file(p)
    if record is not None:
        fmt = "specforge"
        recorded = specforge_capture_layers(record)
        if recorded is not None and ids is not None and tuple(ids) != recorded:
            raise Eagle3ContractError(PROVENANCE_DIFFERS_MSG.format(
                path=p, key=ids_key, config_ids=list(ids), record=record, provenance_ids=list(recorded)))
        if recorded is not None and ids is None:
            ids, ids_key = recorded, PROVENANCE_IDS_KEY

    if fmt == "speculators":
        theirs = speculators_reading(p)
        if theirs is not None:  # speculators' own reading wins over ours (they agree: tests/unit)
            config = {**config, **theirs}
            if theirs.get(TOP_LEVEL_KEY) is not None and nested is None:
                ids, ids_key = tuple(theirs[TOP_LEVEL_KEY]), TOP_LEVEL_KEY

    hidden, hidden_key = None, None
    tlc = config.get("transformer_layer_config")
    for key, value in (
        ("target_hidden_size", config.get("target_hidden_size")),
        ("hidden_size", config.get("hidden_size")),
        ("transformer_layer_config.hidden_size", tlc.get("hidden_size") if isinstance(tlc, dict) else None),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            hidden, hidden_key = value, key
            break

    found = find_fc(p)
    fc: dict[str, Any] = {}
    if isinstance(found, str):
        fc["weights_note"] = found
    else:
        fc.update(fc_name=found[0], fc_shape=found[1], fc_dtype=found[2], fc_file=found[3])
    dtype = config.get("torch_dtype") or config.get("dtype")
    return DraftInfo(
        path=p, config_format=fmt, ids=ids, ids_key=ids_key, target_hidden_size=hidden,
        hidden_size_key=hidden_key, use_aux_hidden_state=bool(eagle_config.get("use_aux_hidden_state", True)),
        dtype=dtype if isinstance(dtype, str) else None, config=config, **fc,
    )

