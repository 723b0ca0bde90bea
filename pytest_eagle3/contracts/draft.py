"""Read an EAGLE-3 draft checkpoint directory: its layer ids, hidden size and ``fc`` shape.

No weights are loaded: the ``fc`` shape comes from the safetensors header (an
8-byte little-endian length, then that many bytes of JSON naming every tensor's
dtype, shape and offsets), parsed here without torch or the safetensors package.

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

The ``fc`` tensor is ``fc.weight`` in SpecForge (``LlamaForCausalLMEagle3.fc``),
speculators (``Eagle3DraftModel.fc``) and EAGLE (``cnets.Model.fc``); ``model.fc.weight``
and a single ``*.fc.weight`` are accepted too.  Its shape is ``[hidden, K * target_hidden]``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_eagle3.contracts.contract import Contract
from pytest_eagle3.contracts.stacks import translate
from pytest_eagle3.errors import Eagle3ConfigError, Eagle3ContractError
from pytest_eagle3.sglang_source.install import sglang_location_and_version
from pytest_eagle3.sglang_source.model_code import read_rules
from pytest_eagle3.sglang_source.id_keys import KeyReads, draft_reads, target_reads

#: Where the ids can be; the first is what SGLang reads.
EAGLE_CONFIG_KEY = "eagle_config.eagle_aux_hidden_state_layer_ids"
TOP_LEVEL_KEY = "eagle_aux_hidden_state_layer_ids"
#: Tensor names tried first for the fc projection.
FC_NAMES = ("fc.weight", "model.fc.weight")
#: A header larger than this is not a safetensors file we should read.
MAX_HEADER_BYTES = 100 * 1024 * 1024

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
NO_HIDDEN_MSG = (
    "draft config {path} names no target_hidden_size or hidden_size; pass target_hidden_size"
)
HIDDEN_DIFFERS_MSG = (
    "draft config {path} says target hidden size {draft}, but the target has hidden size {target}"
)
NO_AUX_MSG = (
    "draft {path} sets eagle_config.use_aux_hidden_state = false: its fc takes no aux hidden "
    "states, so there is no aux-layer contract to check"
)
BAD_SAFETENSORS_MSG = "{file} is not a readable safetensors file: {error}"
NO_FC_MSG = (
    "no fc weight in {files}: looked for {names} or one '*.fc.weight'; "
    "is this an EAGLE-3 draft?"
)
MANY_FC_MSG = "several fc weights in {files}: {names}; cannot tell which is the aux projection"
FC_WIDTH_MSG = (
    "draft {path}: {fc} has input width {width}, but the contract {contract} has {k} slots "
    "x target hidden {hidden} = {expected}"
)
FC_WIDTH_HINT = " (the fc takes {n} slots of {hidden})"
NO_WEIGHTS_NOTE = "fc width not checked: {why}"
TOP_LEVEL_ONLY_NOTE = (
    "ids are only in the top-level '" + TOP_LEVEL_KEY + "' (speculators format): SGLang reads '"
    + EAGLE_CONFIG_KEY + "' and will use its default layers instead"
)
#: Where a SpecForge 0.2 run keeps its provenance record (``training/checkpoint.py``).
SPECFORGE_STATE = "training_state.pt"
PROVENANCE_KEY = "specforge_model_provenance"
PROVENANCE_IDS_KEY = "SpecForge provenance capture_layers"
PROVENANCE_DIFFERS_MSG = (
    "draft {path}: config.json declares {key} = {config_ids}, but the SpecForge provenance record {record} says "
    "it was trained on capture_layers {provenance_ids}: the config was written for another run; declare the "
    "record's ids under " + EAGLE_CONFIG_KEY
)
BAD_PROVENANCE_MSG = "SpecForge provenance record {record} is unreadable: {error}"
SPECFORGE_UNDECLARED = (
    "the draft was trained on capture_layers {ids} (its SpecForge provenance record), but config.json declares "
    "no ids, so SGLang and vLLM capture their default layers; fix: write them under " + EAGLE_CONFIG_KEY
)
#: Ids only at the top level, diagnosed from the installed files that read them
#: (:mod:`pytest_eagle3.sglang_source.id_keys`).
TOP_LEVEL_TRAP = (
    "the ids {ids} are only at the top level ({top_key}): {draft_side}, but the target side reads {target_side} "
    "and captures its default layers instead; fix: move the ids under " + EAGLE_CONFIG_KEY
)
DRAFT_SIZED = "the draft's fc is sized for them ({cls} reads the top-level key when eagle_config has none, {where})"
DRAFT_NOT_SIZED = "the draft's fc ignores them too ({cls} reads {how})"
NO_SGLANG_MSG = (
    "stack specforge-sglang needs the SGLang version used at data generation; "
    "pass sglang_version (no SGLang is installed here to default to)"
)


@dataclass(frozen=True)
class DraftInfo:
    """What a draft directory declares.

    Attributes:
        path: the directory.
        config_format: ``"hf"``, ``"speculators"``, or ``"specforge"`` (a SpecForge 0.2
            run's ``training_state.pt`` beside the config: :func:`specforge_state_file`).
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


def read_safetensors_header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: ``{name: {"dtype", "shape", "data_offsets"}, ...}``.

    Raises:
        Eagle3ContractError: truncated file, absurd length, header not a JSON object.
    """
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError("shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise ValueError(f"header length {n} bytes is not plausible")
            raw = f.read(n)
            if len(raw) != n:
                raise ValueError(f"header says {n} bytes, file has {len(raw)}")
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise Eagle3ContractError(BAD_SAFETENSORS_MSG.format(file=file, error=exc)) from None
    return header


def _find_fc(path: Path) -> tuple[str, tuple[int, ...], str, str] | str:
    """(name, shape, dtype, file) of the fc weight, or a note saying why there is none."""
    index = path / "model.safetensors.index.json"
    files = sorted(path.glob("*.safetensors"))
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise Eagle3ContractError(BAD_SAFETENSORS_MSG.format(file=index, error=exc)) from None
        listed = sorted({path / f for f in weight_map.values()})
        files = listed or files
    if not files:
        bins = sorted(p.name for p in path.glob("*.bin"))
        if bins:
            return f"the draft has only {', '.join(bins)} (pickle; not read without torch)"
        return "the draft directory has no weight files"
    found: dict[str, tuple[tuple[int, ...], str, str]] = {}
    for file in files:
        header = read_safetensors_header(file)
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            if name in FC_NAMES or name.endswith(".fc.weight"):
                found[name] = (tuple(info.get("shape", ())), str(info.get("dtype")), file.name)
    names = [n for n in FC_NAMES if n in found] or sorted(found)
    shown = ", ".join(f.name for f in files)
    if not names:
        raise Eagle3ContractError(NO_FC_MSG.format(files=shown, names=" or ".join(FC_NAMES)))
    if len(names) > 1 and not any(n in FC_NAMES for n in names):
        raise Eagle3ContractError(MANY_FC_MSG.format(files=shown, names=", ".join(names)))
    name = names[0]
    shape, dtype, file_name = found[name]
    return name, shape, dtype, file_name


def _as_ids(value: Any, path: Path, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        raise Eagle3ContractError(BAD_IDS_MSG.format(path=path, key=key, ids=value))
    if not value:
        raise Eagle3ContractError(EMPTY_IDS_MSG.format(path=path, key=key))
    return tuple(value)


def read_draft_config(path: str | Path, error: type[Eagle3ConfigError] = Eagle3ContractError) -> dict[str, Any]:
    """The parsed ``config.json`` of a draft checkpoint directory: the one reader of
    a draft config (:func:`load_draft`, ``pytest-eagle3 inspect``, the draft checks).

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


def specforge_state_file(path: Path) -> Path | None:
    """The SpecForge 0.2 ``training_state.pt`` of a draft directory: its own, else the
    ``<run_id>-latest`` checkpoint's, else the highest ``<run_id>-step<N>``'s (None: none)."""
    own = path / SPECFORGE_STATE
    if own.is_file():
        return own
    latest = sorted(path.glob(f"*-latest/{SPECFORGE_STATE}"))
    if latest:
        return latest[0]

    def step(p: Path) -> int:
        tail = p.parent.name.rsplit("-step", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    steps = sorted(path.glob(f"*-step*/{SPECFORGE_STATE}"), key=step)
    return steps[-1] if steps else None


def specforge_capture_layers(record: Path) -> tuple[int, ...] | None:
    """``capture_layers`` of a SpecForge 0.2 provenance record: ``torch.load`` of
    ``training_state.pt`` (weights only), key ``specforge_model_provenance``, a tuple
    of ``(key, value)`` pairs (SpecForge 0.2.0 ``algorithms/common/providers.py:37``,
    ``training/provenance.py:285-289``, sorted pairs at lines 341-344).  None when the
    run had no explicit ids (SpecForge's default was used).

    Raises:
        Eagle3ContractError: unreadable file, or no provenance record in it.
    """
    import torch  # only for a SpecForge run directory: its records are torch pickles

    try:
        state = torch.load(str(record), map_location="cpu", weights_only=True)
        pairs = dict(state[PROVENANCE_KEY])
    except Exception as exc:  # a pickle can fail in many ways; one line names it
        raise Eagle3ContractError(BAD_PROVENANCE_MSG.format(record=record, error=f"{type(exc).__name__}: "
                                                            f"{' '.join(str(exc).split())[:200]}")) from None
    layers = pairs.get("capture_layers")
    return None if layers is None else tuple(int(v) for v in layers)


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


def load_draft(path: str | Path) -> DraftInfo:
    """Read ``config.json`` and the ``fc`` shape of a draft checkpoint directory.

    Raises:
        Eagle3ContractError: not a directory, no or bad config.json, malformed or
            conflicting id lists, an unreadable safetensors file, safetensors
            files without an fc weight.
    """
    p = Path(path)
    config = read_draft_config(p)
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

    found = _find_fc(p)
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


def top_level_trap(info: DraftInfo, target: KeyReads | None, draft: KeyReads | None) -> str:
    """What happens to ids only at the top level of ``info``'s config: which side
    reads them (``target``: :func:`~pytest_eagle3.sglang_source.id_keys.target_reads`;
    ``draft``: :func:`~pytest_eagle3.sglang_source.id_keys.draft_reads` of its architecture),
    with the files and lines, and the fix."""
    arch = (info.config.get("architectures") or ["the draft model"])[0]
    if draft is not None and draft.reads_top_level:
        draft_side = DRAFT_SIZED.format(cls=arch, where=draft.where(nested=False))
    elif draft is not None:
        draft_side = DRAFT_NOT_SIZED.format(cls=arch, how=draft.describe())
    else:
        draft_side = f"{arch} reads no id key in this SGLang"
    target_side = target.describe() if target is not None else EAGLE_CONFIG_KEY
    return TOP_LEVEL_TRAP.format(ids=list(info.ids or ()), top_key=TOP_LEVEL_KEY, draft_side=draft_side,
                                 target_side=target_side)


def installed_top_level_trap(info: DraftInfo, location: str | Path | None) -> str | None:
    """Why SGLang will not read the draft's ids: :func:`top_level_trap` read from the
    SGLang at ``location``, or ids only in a SpecForge provenance record; ``None``
    when the ids are where SGLang reads them (or there are none)."""
    if info.ids is None or info.sglang_reads_ids:
        return None
    if info.ids_key == PROVENANCE_IDS_KEY:
        return SPECFORGE_UNDECLARED.format(ids=list(info.ids))
    if location is None:
        return top_level_trap(info, None, None)
    arch = (info.config.get("architectures") or [""])[0]
    return top_level_trap(info, target_reads(location), draft_reads(location, arch))


def installed_sglang_rule() -> Any:
    """The id rule of the importable SGLang's DeepSeek model, read from its model
    file (:mod:`pytest_eagle3.sglang_source.model_code`; no import of sglang), or None
    when there is none."""

    location, _ = sglang_location_and_version()
    return read_rules(location, "DeepseekV3ForCausalLM").rule if location is not None else None


def contract_for_draft(
    path: str | Path,
    stack: str,
    *,
    num_layers: int,
    sglang_version: Any = None,
    target_hidden_size: int | None = None,
    **options: Any,
) -> Contract:
    """The training contract of the draft at ``path``, trained with ``stack`` on an ``L``-layer target.

    A config without ids is not an error: the contract is the stack's default,
    with ``declared_ids`` None and a note (:attr:`Contract.declares_ids` False), so
    the verdict can say that a server will use *its* default.

    Args:
        path: the draft checkpoint directory.
        stack: a :data:`~pytest_eagle3.contracts.stacks.STACKS` name.
        num_layers: the target's number of layers.
        sglang_version: for ``specforge-sglang``: the SGLang used at data generation,
            a version string (the upstream version table) or an
            :class:`~pytest_eagle3.conventions.IdRule` (default: the installed
            SGLang's rule, read from its code).
        target_hidden_size: the target's hidden size, checked against the draft config
            and used when the config names none.
        options: stack options (``datagen=`` for speculators, ``capture=`` for specforge-hf, ...).

    Raises:
        Eagle3ContractError: unknown stack, ids out of range or duplicated, no hidden
            size, the fc input width != ``len(entries) * target_hidden_size``, and
            everything :func:`load_draft` raises.
    """
    info = load_draft(path)
    if not info.use_aux_hidden_state:
        raise Eagle3ContractError(NO_AUX_MSG.format(path=info.path))
    hidden = info.target_hidden_size
    if hidden is not None and target_hidden_size is not None and hidden != target_hidden_size:
        raise Eagle3ContractError(
            HIDDEN_DIFFERS_MSG.format(path=info.path, draft=hidden, target=target_hidden_size)
        )
    hidden = hidden if hidden is not None else target_hidden_size
    if hidden is None:
        raise Eagle3ContractError(NO_HIDDEN_MSG.format(path=info.path / "config.json"))
    if stack == "specforge-sglang":
        version = sglang_version or installed_sglang_rule()
        if version is None:
            raise Eagle3ContractError(NO_SGLANG_MSG)
        options["sglang_version"] = version
    ids_text = f"{info.ids_key} {list(info.ids)}" if info.ids is not None else "no ids"
    contract = translate(
        stack, info.ids, num_layers=num_layers, hidden_size=hidden,
        dtype=info.dtype, source=f"{info.path} ({ids_text})", **options,
    )
    width = info.fc_input_width
    if width is not None and width != contract.fc_input_width:
        hint = FC_WIDTH_HINT.format(n=width // hidden, hidden=hidden) if width % hidden == 0 else ""
        raise Eagle3ContractError(
            FC_WIDTH_MSG.format(
                path=info.path, fc=f"{info.fc_name} {list(info.fc_shape or ())}", width=width,
                contract=contract.human(), k=contract.k, hidden=hidden, expected=contract.fc_input_width,
            ) + hint
        )
    notes = list(contract.notes)
    if info.weights_note:
        notes.append(NO_WEIGHTS_NOTE.format(why=info.weights_note))
    if info.ids is not None and not info.sglang_reads_ids:
        notes.append(TOP_LEVEL_ONLY_NOTE)
    return replace(contract, notes=tuple(notes))
