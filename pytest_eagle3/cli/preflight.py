"""Pre-flight check of an EAGLE-3 draft against an SGLang version, without starting anything.

:func:`inspect_draft` reads a draft checkpoint directory (``config.json`` and the
``fc`` shape from the safetensors header, :mod:`pytest_eagle3.contracts.draft`),
builds its training contract with a training stack's translator, predicts what
SGLang captures from the ids *it* reads (only
``eagle_config.eagle_aux_hidden_state_layer_ids``, ``conventions.predict``), and
compares the two slot by slot.  The result is an :class:`Inspection` with one of
four verdicts:

* ``match``: SGLang feeds ``fc`` the contract (``by_default`` when SGLang reads
  no ids and its default list happens to be the contract);
* ``mismatch``: same number of slots, different snapshots: silent, the draft
  just accepts less;
* ``fails``: SGLang rejects it: ids it never reaches or names twice (fails at
  the first forward, not at startup), or a slot count other than ``fc`` takes;
* ``invalid``: the draft contradicts itself or its stack (ids out of range,
  duplicated, an ``fc`` width that disagrees with the ids).

Default stack: a speculators-format config (``speculators_model_type`` /
``speculators_config``) is only written by speculators, so it means
``speculators``.  A Hugging Face-format config (``eagle_config``) is shared by
SpecForge's HF and SGLang backends, the original EAGLE code and hand-written
configs, which read the same ids as different layers, so a guess would be a
silent wrong answer: the stack must be named.

This is a prediction from the version's known rule; the packaged suite
measures the running engine.  Pure Python: no torch, no SGLang import.
"""

from __future__ import annotations
import shlex
from pathlib import Path
from typing import Any, Mapping

from packaging.version import InvalidVersion, Version

from pytest_eagle3.cli.inspection import (
    FAILS,
    INVALID,
    MATCH,
    MISMATCH,
    UNKNOWN_VERDICT,
    Inspection,
    Slot,
)
from pytest_eagle3.contracts.contract import Contract
from pytest_eagle3.contracts.draft import EAGLE_CONFIG_KEY, PROVENANCE_IDS_KEY, TOP_LEVEL_KEY, DraftInfo, load_draft
from pytest_eagle3.contracts.draft_contract import FC_WIDTH_MSG, NO_AUX_MSG, contract_for_draft
from pytest_eagle3.contracts.idfix import Fix, plan_fix
from pytest_eagle3.contracts.servers import vllm_reads
from pytest_eagle3.contracts.stacks import STACKS, stack_options
from pytest_eagle3.contracts.unread_ids import SPECFORGE_UNDECLARED, top_level_trap
from pytest_eagle3.conventions import IdRule, Prediction, predict, rule_for_version
from pytest_eagle3.errors import Eagle3ConfigError, Eagle3ContractError
from pytest_eagle3.sglang_source.id_keys import draft_reads, target_reads

UNKNOWN_REASON = (
    "the installed SGLang's id rule could not be read ({source}): nothing is predicted; the packaged suite "
    "measures it (pytest --pyargs pytest_eagle3.suite --eagle3-draft PATH --eagle3-stack NAME)"
)
#: ``stack`` of an :class:`Inspection` whose contract came from ``--contract``.
EXPLICIT = "explicit"

# Message templates (tests import these).
AMBIGUOUS_STACK_MSG = (
    "draft {path} is in Hugging Face format ({ids}), which SpecForge (specforge-hf, specforge-sglang), "
    "the original EAGLE code (eagle) and vLLM users (vllm) all write and read as different layers: "
    "pass --stack NAME ({known}) or --contract '[...]'"
)
NO_HIDDEN_MSG = "draft config {path} names no target_hidden_size or hidden_size: pass --target so it is known"
BAD_OPTION_MSG = "--option {name}: stack {stack!r} takes {known}"
BAD_CONTRACT_MSG = "--contract: {error}"
OPTIONS_WITH_CONTRACT_MSG = "--option configures a stack's translator; --contract needs none"
FAILS_AT_FIRST_FORWARD = (
    "SGLang fails at the first forward, not at startup: layers_to_capture {layers} {problem} "
    "(captured {n} of {k})"
)
NEVER_REACHED = "has {layers}, which a target of {L} layers never reaches (0..{last})"
NAMED_TWICE = "names {layers} twice"
LAYER0_TYPEERROR = (
    "has layer 0, which this SGLang cannot capture (TypeError: residual is None before layer 0; "
    "fixed in 0.5.14)"
)
SLOT_COUNT = (
    "SGLang captures {got} slot{s} but the draft's fc takes {want}: it fails loading the draft or "
    "at the first forward"
)
MISMATCH_REASON = "{n} of {k} slots differ: the draft runs, silently fed other layers"
MATCH_REASON = "SGLang feeds fc the contract, slot by slot"
DEFAULT_REASON = (
    "SGLang reads no ids from this draft ({why}), so it uses its default [2, L//2, L-3] = layers {layers}"
)
NO_KEY_WHY = "no " + EAGLE_CONFIG_KEY
TOP_LEVEL_WHY = "the ids are only at top level, and SGLang reads " + EAGLE_CONFIG_KEY

PIN_NOTE = "the match depends on SGLang's default list; to pin it: {fix}"
DATAGEN_NOTE = (
    "specforge-sglang: assumed the training data was generated with SGLang {version}; "
    "pass --option sglang_version=V if it was another"
)
VERSION_DISAGREES_NOTE = (
    "the version number {version} suggests '{table}' (upstream releases); the installed code says '{code}' "
    "({source}): the installed code decides"
)
UNKNOWN_VERSION_NOTE = "SGLang version {version!r} is not a release number: assumed the newest rule"
CONTRACT_SOURCE = "--contract {text}"
#: After a fix the config's ids no longer say what the stack trained on, so the
#: re-check names the contract explicitly.
RECHECK = "pytest-eagle3 inspect --draft {path} --contract {contract} --layers {L}{version}"


def is_release(version: str) -> bool:
    """Whether ``version`` parses as a release number (``0.5.23``, ``0.5.13.post1``)."""
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def read_draft(path: str | Path) -> DraftInfo:
    """:func:`load_draft`, with the problems of *finding* a draft as usage errors.

    Raises:
        Eagle3ConfigError: not a directory, no ``config.json``, not a JSON object,
            ``use_aux_hidden_state`` false (nothing to check).
        Eagle3ContractError: what :func:`load_draft` rejects in a readable config
            (bad or conflicting ids, unreadable weights): the draft is invalid.
    """
    info = load_draft(Path(path).expanduser(), Eagle3ConfigError)
    if not info.use_aux_hidden_state:
        raise Eagle3ConfigError(NO_AUX_MSG.format(path=info.path))
    return info


def resolve_stack(info: DraftInfo, stack: str | None) -> tuple[str, str]:
    """``(stack, where it came from)``: ``--stack``, else the config format when it names one stack.

    Raises:
        Eagle3ConfigError: a Hugging Face-format draft and no ``--stack``.
    """
    if stack is not None:
        return stack, "--stack"
    if info.config_format == "speculators":
        return "speculators", "speculators config format"
    if info.config_format == "specforge":
        return "specforge", "SpecForge 0.2 run (training_state.pt)"
    ids = f"{EAGLE_CONFIG_KEY} {list(info.ids)}" if info.ids is not None else "no ids"
    raise Eagle3ConfigError(AMBIGUOUS_STACK_MSG.format(path=info.path, ids=ids, known=", ".join(STACKS)))


def _explicit_contract(info: DraftInfo, text: str, num_layers: int, hidden: int) -> Contract:
    try:
        contract = Contract.parse(text, num_layers=num_layers, hidden_size=hidden, dtype=info.dtype,
                                  stack="raw", source=CONTRACT_SOURCE.format(text=text))
    except Eagle3ContractError as exc:
        raise Eagle3ConfigError(BAD_CONTRACT_MSG.format(error=exc)) from None
    width = info.fc_input_width
    if width is not None and width != contract.fc_input_width:
        raise Eagle3ContractError(FC_WIDTH_MSG.format(
            path=info.path, fc=f"{info.fc_name} {list(info.fc_shape or ())}", width=width,
            contract=contract.human(), k=contract.k, hidden=hidden, expected=contract.fc_input_width))
    return contract


def _layers(values: Any) -> str:
    """``layer 8`` or ``layers 8, 9``."""
    values = list(values)
    return ("layer " if len(values) == 1 else "layers ") + ", ".join(str(v) for v in values)


def _fails_reason(p: Prediction, num_layers: int, last: int) -> str:
    """``last``: the highest layer index the model captures (L - 1, or L where
    it captures the last layer's output, :attr:`IdRule.last_layer`)."""
    problems = []
    if p.missing:
        problems.append(NEVER_REACHED.format(layers=_layers(p.missing), L=num_layers, last=last))
    dups = sorted({i for i in p.layers_to_capture if p.layers_to_capture.count(i) > 1})
    if dups:
        problems.append(NAMED_TWICE.format(layers=_layers(dups)))
    if p.embedding_fails:
        problems.append(LAYER0_TYPEERROR)
        # It stops at layer 0: nothing is captured.
        return FAILS_AT_FIRST_FORWARD.format(layers=list(p.layers_to_capture), problem=" and ".join(problems),
                                             n=0, k=len(p.layers_to_capture))
    return FAILS_AT_FIRST_FORWARD.format(layers=list(p.layers_to_capture), problem=" and ".join(problems),
                                         n=len(p.snapshots), k=len(p.layers_to_capture))


def inspect_draft(
    path: str | Path,
    *,
    num_layers: int,
    sglang_version: str,
    sglang_source: str = "--sglang-version",
    target: str = "",
    target_hidden_size: int | None = None,
    stack: str | None = None,
    contract_text: str | None = None,
    options: Mapping[str, Any] | None = None,
    rule: IdRule | None = None,
    sglang_location: str | Path | None = None,
) -> Inspection:
    """Compare a draft's training contract with what SGLang ``sglang_version`` captures for it.

    Args:
        path: the draft checkpoint directory.
        num_layers: the target's layer count ``L``.
        sglang_version: the SGLang version (for notes, and the version table's rule
            when ``rule`` is not given).
        rule: the installed SGLang's id rule, read from its code
            (:meth:`~pytest_eagle3.sglang_source.install.SGLangInstall.id_rule`); ``None``:
            the version table's prediction for ``sglang_version``.
        target_hidden_size: the target's hidden size, checked against the draft config.
        stack: a :data:`~pytest_eagle3.contracts.stacks.STACKS` name (see :func:`resolve_stack`).
        contract_text: the contract in human form instead of a stack (``[embedding, out(L2)]``).
        options: translator options (``datagen``, ``capture``, ``final_layer``, ``sglang_version``).
        sglang_location: the installed ``sglang`` package: ids only at the top level
            are then diagnosed with the files and lines that read them, target side and
            the draft's model (:func:`pytest_eagle3.sglang_source.id_keys.target_reads`,
            :func:`~pytest_eagle3.sglang_source.id_keys.draft_reads`).

    Raises:
        Eagle3ConfigError: usage problems (no draft there, no stack, a bad option or
            ``--contract``, no hidden size); a draft that contradicts itself is an
            ``invalid`` verdict instead.
    """
    L = num_layers
    options = dict(options or {})
    info = read_draft(path)
    notes: list[str] = []
    if contract_text is not None:
        if options:
            raise Eagle3ConfigError(OPTIONS_WITH_CONTRACT_MSG)
        used_stack, stack_source = EXPLICIT, "--contract"
    else:
        used_stack, stack_source = resolve_stack(info, stack)
        known = stack_options(used_stack)
        for name in options:
            if name not in known:
                raise Eagle3ConfigError(BAD_OPTION_MSG.format(name=name, stack=used_stack,
                                                              known=", ".join(known) or "no options"))
    hidden = info.target_hidden_size or target_hidden_size
    if hidden is None:
        raise Eagle3ConfigError(NO_HIDDEN_MSG.format(path=info.path / "config.json"))
    if used_stack == "specforge-sglang" and "sglang_version" not in options:
        options["sglang_version"] = rule if rule is not None else sglang_version
        notes.append(DATAGEN_NOTE.format(version=sglang_version))
    contract, error = None, None
    try:
        if contract_text is not None:
            contract = _explicit_contract(info, contract_text, L, hidden)
        else:
            contract = contract_for_draft(info, used_stack, num_layers=L,
                                          target_hidden_size=target_hidden_size, **options)
    except Eagle3ContractError as exc:
        error = str(exc)
    if contract is not None:
        notes = list(contract.notes) + notes
    if rule is None and not is_release(sglang_version):
        notes.append(UNKNOWN_VERSION_NOTE.format(version=sglang_version))
    r = rule if rule is not None else rule_for_version(sglang_version)
    if (rule is not None and rule.known and rule.from_code and is_release(sglang_version)
            and "deepseek_v2.py" in rule.source):  # the version table describes upstream's DeepSeek model
        table = rule_for_version(sglang_version)
        if table.kind != rule.kind or table.embedding.capturable != rule.embedding.capturable:
            notes.append(VERSION_DISAGREES_NOTE.format(version=sglang_version, table=table.kind,
                                                       code=rule.kind, source=rule.source))

    ids_read = info.ids if info.sglang_reads_ids else None
    p = predict(list(ids_read) if ids_read is not None else None, L, r)
    by_default = ids_read is None
    common = dict(draft=info, stack=used_stack, stack_source=stack_source, num_layers=L, target=target,
                  contract=contract, contract_error=error, sglang_version=sglang_version,
                  sglang_source=sglang_source, ids_read=ids_read, prediction=p, rule=r,
                  vllm=tuple(vllm_reads(info.config, L)))
    if contract is None:
        return Inspection(**common, verdict=INVALID, reason=error or "", notes=tuple(notes))

    wanted = contract.to_snapshot_indices(L)
    got = list(p.snapshots)
    slots = tuple(Slot(j, got[j] if j < len(got) else None, wanted[j] if j < len(wanted) else None)
                  for j in range(max(len(got), len(wanted))))
    top_level = TOP_LEVEL_KEY if info.ids_key == TOP_LEVEL_KEY else None
    prefer = info.ids if top_level else None

    def fix() -> Fix:
        return plan_fix(contract, L, r, key=EAGLE_CONFIG_KEY, prefer=prefer,
                        keep_top_level=top_level is not None)

    recheck_cmd = None
    if not p.known:
        return Inspection(**common, verdict=UNKNOWN_VERDICT, reason=UNKNOWN_REASON.format(source=p.source),
                          slots=slots, notes=tuple(notes))
    if p.fails_at_first_forward:
        verdict, reason = FAILS, _fails_reason(p, L, L if r.last_layer else L - 1)
    elif len(got) != contract.k:
        verdict, reason = FAILS, SLOT_COUNT.format(got=len(got), s="s" if len(got) != 1 else "", want=contract.k)
    elif got == wanted:
        verdict, reason = MATCH, MATCH_REASON
        if by_default:
            why = TOP_LEVEL_WHY if info.ids is not None else NO_KEY_WHY
            if info.ids_key == PROVENANCE_IDS_KEY:
                why = "its ids are only in the SpecForge provenance record"
            reason = DEFAULT_REASON.format(why=why, layers=list(p.layers_to_capture))
            pin = fix()
            if pin.ids is not None:
                notes.insert(0, PIN_NOTE.format(fix=pin.text))
        return Inspection(**common, verdict=verdict, reason=reason, by_default=by_default, slots=slots,
                          notes=tuple(notes))
    else:
        verdict = MISMATCH
        reason = MISMATCH_REASON.format(n=sum(not slot.ok for slot in slots), k=len(slots))
    if by_default and info.ids_key == PROVENANCE_IDS_KEY:
        reason += "; " + SPECFORGE_UNDECLARED.format(ids=list(info.ids or ()))
    elif by_default and info.ids is not None and sglang_location is not None:
        arch = (info.config.get("architectures") or [""])[0]
        reason += "; " + top_level_trap(info, target_reads(sglang_location), draft_reads(sglang_location, arch))
    elif by_default:
        why = TOP_LEVEL_WHY if info.ids is not None else NO_KEY_WHY
        reason += "; " + DEFAULT_REASON.format(why=why, layers=list(p.layers_to_capture))
    plan = fix()
    if plan.ids is not None:
        recheck_cmd = recheck(info.path, contract, L, sglang_version, sglang_source)
    return Inspection(**common, verdict=verdict, reason=reason, by_default=by_default, slots=slots,
                      fix=plan, recheck=recheck_cmd, notes=tuple(notes))


def recheck(path: Path, contract: Contract, num_layers: int, version: str, source: str) -> str:
    """The command that checks the draft once the fix is applied (:data:`RECHECK`)."""
    flag = f" --sglang-version {version}" if source == "--sglang-version" else ""
    return RECHECK.format(path=shlex.quote(str(path)), contract=shlex.quote(contract.human(num_layers)),
                          L=num_layers, version=flag)
