"""A declared need resolved into the engine request a test runs.

:func:`resolve` turns an :class:`~pytest_eagle3.planning.declare.EngineNeed`
into an :class:`~pytest_eagle3.planning.declare.EngineRequest` for the running
target and the installed SGLang: the ids the engine captures, the snapshots
each slot should hold (the training contract), what the installed SGLang's id
rule predicts, the draft the engine loads, and, where the contract and the
prediction differ, the known incompatibility of the installed SGLang (an
XFAIL, :func:`known_incompatibility`).  The ``eagle3_engine_request`` fixture
and ``--eagle3-plan`` call the same :func:`resolve`.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_eagle3.conventions import predict
from pytest_eagle3.contracts.draft import eagle_config_ids, load_draft, read_draft_config
from pytest_eagle3.contracts.draft_contract import contract_for_draft
from pytest_eagle3.contracts.idfix import plan_fix
from pytest_eagle3.contracts.unread_ids import installed_top_level_trap
from pytest_eagle3.draft import shipped_draft_dir
from pytest_eagle3.draft.random_draft import capture_draft_dir
from pytest_eagle3.engine.variants import shared_engine_args
from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.planning import cases
from pytest_eagle3.planning.declare import PORTABLE_SUFFIX, USER_DRAFT, EngineNeed, EngineRequest, NeedContext
from pytest_eagle3.settings import Settings
from pytest_eagle3.target.spec import DEFAULT_ARCHITECTURE

if TYPE_CHECKING:
    from pytest_eagle3.conventions import IdRule
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.target.spec import TargetFacts

NO_CONTRACT = "{case}: no contract on a {L}-layer target: {error}"


def acceptance_draft(settings: Settings, *, portable: bool = False, variant: str = "") -> Path | None:
    """The trained draft the acceptance tests load: ``--eagle3-draft``, else the
    target preset's shipped draft (``fixtures/drafts/<preset>``; ``portable``:
    ``fixtures/drafts/<preset>-portable``; ``variant``: ``fixtures/drafts/<preset>-<variant>``),
    else ``None``."""
    if settings.draft is not None and not portable and not variant:
        return Path(settings.draft)

    suffix = PORTABLE_SUFFIX if portable else (f"-{variant}" if variant else "")
    shipped = shipped_draft_dir(f"{settings.target}{suffix}")
    return shipped if (shipped / "config.json").is_file() else None


def uses_draft_path(ctx: NeedContext) -> bool:
    """Whether the capture tests read captures through the draft path in this run
    (``--eagle3-capture-method``; ``auto``: only where capture-only is missing)."""
    method = ctx.settings.capture_method
    if method == "auto":
        return ctx.install is not None and not ctx.install.has_arg("enable_return_aux_hidden_states")
    return method == "eagle3-draft"


def case_uses_draft_path(ctx: NeedContext, ids: Sequence[int] | None) -> bool:
    """:func:`uses_draft_path`, or (``auto``) an id list reaching id ``L``: SGLang's
    capture-only API refuses ids ``>= L`` before the model sees them (0.5.23
    ``model_runner_components/spec_aux_hidden_state.py``, ``_check_capture_layer_ids_in_range``),
    while a draft's ids reach the model's own rule, which may capture the last
    layer's output (``gpt_oss.py``), as a served draft's do."""
    if uses_draft_path(ctx):
        return True
    return (ctx.settings.capture_method == "auto" and ids is not None and ctx.facts is not None
            and max(ids, default=-1) >= ctx.facts.num_layers)


def target_config(facts: "TargetFacts") -> dict[str, Any]:
    """The target config keys a random capture draft is sized from (same in the plan and the run)."""
    return {"hidden_size": facts.hidden_size, "vocab_size": facts.vocab_size}


def capture_draft(ctx: NeedContext, ids: Sequence[int] | None) -> str:
    """The cached random draft declaring ``ids`` (path only; the fixture builds it)."""

    assert ctx.facts is not None
    return str(capture_draft_dir(ctx.settings.cache_dir, target_config(ctx.facts), ids))


def resolve(need: EngineNeed, ctx: NeedContext) -> EngineRequest:
    """The :class:`EngineRequest` of ``need`` for this target and SGLang.

    Raises:
        Eagle3ConfigError: the case has no contract on this target, or the
            user's draft cannot be read (one line).
        ValueError: ``ctx.install`` or ``ctx.facts`` is missing (caller bug).
    """
    if ctx.install is None or ctx.facts is None:
        raise ValueError("resolve() needs the installed SGLang and the target facts")

    L, H, rule = ctx.facts.num_layers, ctx.facts.hidden_size, installed_rule(ctx)
    v = need.variant
    if need.case == USER_DRAFT:
        return _user_draft_request(ctx)
    if need.acceptance:
        req = acceptance_request(ctx, portable=need.portable_draft, variant=need.draft_variant)
        if v is not None:
            # Speculative decoding on a path variant's engine (its server args over the acceptance engine's).
            req = replace(req, extra_args=v.args_for(ctx.install, ctx.tp, ctx.settings.device))
        if need.spec_shape is not None:
            # Another speculative shape: its draft/verify sizes and schedule over the acceptance engine's.
            req = replace(req, extra_args={**req.extra_args, **need.spec_shape.server_args(ctx.settings.device)})
        return req
    case = cases.resolve(need.case, L, H, rule)
    shared = capture_engine_args(need, ctx)
    if v is not None:
        ids = tuple(v.ids(L, ctx.facts.first_k_dense_replace)) if v.ids is not None else _ids(case.ids)
        predicted = tuple(predict(list(ids) if ids is not None else None, L, rule).snapshots)
        req = dict(v.request)
        device = ctx.settings.device
        if device == "cpu" and v.cpu_args is not None:
            args = {**shared, **v.args_for(ctx.install, ctx.tp, device)}  # a stand-in over the capture engine
        else:
            args = v.args_for(ctx.install, ctx.tp, device) if v.own_engine(device) else shared
        return EngineRequest(ids, args, decode_steps=int(req.get("decode_steps", 0)),
                             batch=bool(req.get("batch")), repeat=int(req.get("repeat", 1)),
                             expected=predicted, predicted=predicted,
                             draft=capture_draft(ctx, ids) if case_uses_draft_path(ctx, ids) else None)
    ids = _ids(case.ids)
    predicted = tuple(predict(list(ids) if ids is not None else None, L, rule).snapshots)
    draft = capture_draft(ctx, ids) if case_uses_draft_path(ctx, ids) else None
    if case.contract is None:
        # The capture-order test checks SGLang's own rule, which needs no contract.
        return EngineRequest(ids, shared, expected=predicted, predicted=predicted, draft=draft,
                             note=NO_CONTRACT.format(case=need.case, L=L, error=case.error))
    expected = tuple(case.contract.to_snapshot_indices(L))
    xfail = None
    if expected != predicted and predicted:
        xfail = known_incompatibility(need.case, case.contract, ids, predicted, L, ctx.install,
                                      ctx.facts.architecture)
    return EngineRequest(ids, shared, expected=expected, predicted=predicted, xfail_reason=xfail,
                         contract=str(case.contract), draft=draft)


def capture_engine_args(need: EngineNeed, ctx: NeedContext) -> dict[str, Any]:
    """The server args of ``need``'s capture engine beyond the capture ones: the
    shared paths (:func:`pytest_eagle3.engine.variants.shared_engine_args`:
    radix-cache hits, chunked prefill on cpu), so every id list's tests take
    them, on one engine per TP size where the engine switches ids
    (:func:`pytest_eagle3.capture.api.switches_ids`).  Acceptance engines: none."""
    if need.acceptance or ctx.install is None:
        return {}
    return shared_engine_args(ctx.install, ctx.settings.device, ctx.tp)


NOT_SERVABLE = (
    "{what}: known incompatibility of {sglang}: trained on {contract} = {wanted}, declared ids {ids}; "
    "its id rule ({rule}) captures {got}: {verdict}; fix: {fix}"
)


def known_incompatibility(what: str, contract: Any, ids: Sequence[int] | None, predicted: Sequence[int],
                          num_layers: int, install: "SGLangInstall",
                          architecture: str = "DeepseekV3ForCausalLM") -> str:
    """The XFAIL reason of a contract the installed SGLang's rule cannot serve with
    these ids, with the fix ``pytest-eagle3 inspect`` proposes
    (:func:`pytest_eagle3.contracts.idfix.plan_fix`): other ids, or why none exist."""

    L = num_layers
    rule = install.id_rule(architecture)
    fix = plan_fix(contract, L, rule, key="eagle_config.eagle_aux_hidden_state_layer_ids",
                   prefer=list(ids) if ids is not None else None)
    verdict = ("not servable on this SGLang (no id list captures it)" if fix.ids is None
               else "servable with other ids")
    return NOT_SERVABLE.format(what=what, sglang=install.describe(), contract=contract,
                               wanted=", ".join(f"hs[{i}]" for i in contract.to_snapshot_indices(L)),
                               ids=list(ids) if ids is not None else "(none: SGLang's default)",
                               rule=rule.describe(),
                               got=", ".join(f"hs[{i}]" for i in predicted), verdict=verdict, fix=fix.text)


def acceptance_request(ctx: NeedContext, *, portable: bool = False, variant: str = "") -> EngineRequest:
    """Speculative decoding with the trained draft; SGLang reads the draft's ids
    from its ``config.json``, and its captures are the draft path's.

    A draft built by pytest-eagle3 records the contract it was trained on
    (``config.json`` ``pytest_eagle3.contract``); when the installed SGLang's
    rule feeds it other layers, the request carries that known incompatibility
    (``xfail_reason``) and the acceptance test expects the collapse.
    """

    assert ctx.facts is not None and ctx.install is not None
    draft = acceptance_draft(ctx.settings, portable=portable, variant=variant)
    assert draft is not None
    config = read_draft_config(draft)
    declared = eagle_config_ids(config)
    ids = tuple(declared) if declared is not None else None
    L = ctx.facts.num_layers
    rule = installed_rule(ctx)
    predicted = tuple(predict(list(ids) if ids is not None else None, L, rule).snapshots)
    contract = _trained_contract(config, L, ctx.facts.hidden_size, rule)
    xfail = None
    expected = predicted
    if contract is not None:
        expected = tuple(contract.to_snapshot_indices(L))
        if expected != predicted and predicted:
            xfail = known_incompatibility(f"draft {draft.name}", contract, ids, predicted, L, ctx.install,
                                          ctx.facts.architecture)
    return EngineRequest(ids, expected=expected, predicted=predicted, draft=str(draft), xfail_reason=xfail,
                         contract=str(contract) if contract is not None else None)


def _trained_contract(config: Mapping[str, Any], num_layers: int, hidden_size: int, rule: Any) -> Any:
    """The contract a pytest-eagle3-built draft records in its parsed ``config.json``
    (``pytest_eagle3.contract``, the name of a contract fixture), or ``None``."""

    meta = config.get("pytest_eagle3")
    name = meta.get("contract") if isinstance(meta, dict) else None
    if not name or name not in cases.case_names():
        return None
    try:
        return cases.resolve(name, num_layers, hidden_size, rule).contract
    except (KeyError, Eagle3ConfigError):
        return None


def installed_rule(ctx: NeedContext) -> "IdRule":
    """The installed SGLang's id rule for the target's architecture, read from its
    model file (:mod:`pytest_eagle3.sglang_source.model_code`), never from its version."""
    assert ctx.install is not None
    arch = ctx.facts.architecture if ctx.facts is not None else DEFAULT_ARCHITECTURE
    return ctx.install.id_rule(arch)


def _ids(ids: Sequence[int] | None) -> tuple[int, ...] | None:
    return tuple(ids) if ids is not None else None


def _user_draft_request(ctx: NeedContext) -> EngineRequest:
    """``--eagle3-draft``: the ids SGLang reads from the draft config, the
    contract its training stack declares; a mismatch fails (no XFAIL)."""

    s = ctx.settings
    assert ctx.facts is not None and ctx.install is not None
    if s.draft is None or s.stack is None:
        raise Eagle3ConfigError("--eagle3-draft PATH needs --eagle3-stack NAME")
    L, H = ctx.facts.num_layers, ctx.facts.hidden_size
    draft = load_draft(s.draft)
    rule = installed_rule(ctx)
    contract = contract_for_draft(draft, s.stack, num_layers=L, target_hidden_size=H,
                                  sglang_version=rule if s.stack == "specforge-sglang" else None)
    ids = tuple(draft.ids) if draft.ids is not None and draft.sglang_reads_ids else None
    note = installed_top_level_trap(draft, ctx.install.location)
    predicted = tuple(predict(list(ids) if ids is not None else None, L, rule).snapshots)
    return EngineRequest(ids, expected=tuple(contract.to_snapshot_indices(L)), predicted=predicted, note=note,
                         contract=str(contract), user_draft=True)
