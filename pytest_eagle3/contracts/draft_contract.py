"""The training contract of a draft directory: its stack's translation of the ids it declares,
checked against its hidden size and its ``fc`` width."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_eagle3.contracts.contract import Contract
from pytest_eagle3.contracts.draft import EAGLE_CONFIG_KEY, TOP_LEVEL_KEY, DraftInfo, load_draft
from pytest_eagle3.contracts.stacks import translate
from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.sglang_source.install import sglang_location_and_version
from pytest_eagle3.sglang_source.model_code import read_rules

# Message templates (tests import these).
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
NO_SGLANG_MSG = (
    "stack specforge-sglang needs the SGLang version used at data generation; "
    "pass sglang_version (no SGLang is installed here to default to)"
)


def installed_sglang_rule() -> Any:
    """The id rule of the importable SGLang's DeepSeek model, read from its model
    file (:mod:`pytest_eagle3.sglang_source.model_code`; no import of sglang), or None
    when there is none."""

    location, _ = sglang_location_and_version()
    return read_rules(location, "DeepseekV3ForCausalLM").rule if location is not None else None


def contract_for_draft(
    draft: DraftInfo | str | Path,
    stack: str,
    *,
    num_layers: int,
    sglang_version: Any = None,
    target_hidden_size: int | None = None,
    **options: Any,
) -> Contract:
    """The training contract of ``draft``, trained with ``stack`` on an ``L``-layer target.

    A config without ids is not an error: the contract is the stack's default,
    with ``declared_ids`` None and a note (:attr:`Contract.declares_ids` False), so
    the verdict can say that a server will use *its* default.

    Args:
        draft: what :func:`load_draft` read of the draft checkpoint directory, or
            that directory (read here).
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
    info = draft if isinstance(draft, DraftInfo) else load_draft(draft)
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
