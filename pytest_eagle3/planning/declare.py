"""One declaration of the engine a packaged test needs.

A packaged test says which engine it needs with the ``eagle3_engines`` marker::

    @pytest.mark.tp(1, 2, 4, 8)
    @pytest.mark.eagle3_engines(*case_needs())
    def test_capture_order(eagle3_need, eagle3_engine_request, eagle3_capture, ...):
        captures = eagle3_capture.run(eagle3_engine_request)

Everything else reads that one declaration:

* collection (:mod:`pytest_eagle3.plugin.hooks`) generates the test only for the
  ``(TP size, need)`` pairs this run can execute (:func:`collect_reason`) and
  summarises what it left out, one line per reason;
* the ``eagle3_engine_request`` fixture turns the need into an
  :class:`EngineRequest` (:func:`resolve`) that ``eagle3_capture`` starts or
  reuses an engine for;
* ``--eagle3-plan`` (:mod:`pytest_eagle3.plugin.plan`) calls the same
  :func:`resolve` and :func:`pytest_eagle3.capture.api.engine_config`, so the
  plan and the run agree engine for engine.

Policy lives here, not in test bodies: which id lists run at which TP size
(:data:`TP1_ONLY`), which ids a draft config makes SGLang read, which contract
mismatch is a known incompatibility of the installed SGLang (an XFAIL), which
variants need an engine of their own (``slow`` on CPU).

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from pytest_eagle3.planning import cases
from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.target.spec import DEFAULT_ARCHITECTURE
from pytest_eagle3.draft import shipped_draft_dir
from pytest_eagle3.draft.config import MLA_ARCHITECTURE
from pytest_eagle3.sglang_source.id_keys import DRAFT_FILES, has_draft_model
from pytest_eagle3.draft.random_draft import capture_draft_dir
from pytest_eagle3.conventions import predict
from pytest_eagle3.contracts.idfix import plan_fix
from pytest_eagle3.capture.draft_path import draft_layer_ids
from pytest_eagle3.contracts.draft import contract_for_draft, installed_top_level_trap, load_draft
from pytest_eagle3.engine.gpus import PLAN_GPU_ARCH, detect_gpu_arch

if TYPE_CHECKING:
    from pytest_eagle3.conventions import IdRule
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.engine.variants import Variant
    from pytest_eagle3.target.spec import TargetFacts

#: Marker carrying a test's :class:`EngineNeed` declarations.
MARKER = "eagle3_engines"
#: Parameter name of the need a generated test runs with.
NEED_ARGNAME = "eagle3_need"
#: Need name of the user's own draft (``--eagle3-draft``).
USER_DRAFT = "your-draft"

# Reasons a (TP, need) pair is left out at collection (one summary line each).
TP1_ONLY = (
    "id-list cases other than {wide!r} run at TP 1 only: which layers a list selects does "
    "not depend on TP"
)
TP_ABOVE = "needs --tp {needed}; this run has --tp {tp}"
SLOW = "needs an SGLang engine of its own (minutes on cpu); run with --eagle3-slow"
SLOW_TP8 = "TP 8 on cpu (about 100 s and 15 GB per engine); run with --eagle3-slow"
OWN_ENGINE_TP1_ON_CPU = (
    "path variants with an engine of their own run at TP 1 only on cpu (engine starts dominate the run)"
)
COLLAPSES = (
    "ids {ids} on {L} layers make {sglang} capture layers {layers}, which fails {why} "
    "(pytest-eagle3 inspect reports this before any engine starts)"
)
NO_CONTRACT = "{case}: no contract on a {L}-layer target: {error}"
NO_DEEPSEEK_EAGLE3 = (
    "{sglang} cannot serve EAGLE-3 for {architecture}: {why}"
)
NO_DRAFT_PATH = (
    "{sglang} has neither --enable-return-aux-hidden-states nor --enable-return-hidden-states: "
    "its captures cannot be read"
)
NO_EMBEDDING_ID = "{sglang} cannot capture the embedding: {layer0}; id rule {rule}: no id list yields hs[0]"
NO_ACCEPTANCE_DRAFT = (
    "acceptance needs a trained EAGLE-3 draft: target {target} ships none; pass --eagle3-draft PATH"
)
NO_USER_DRAFT = "your own draft: pass --eagle3-draft PATH --eagle3-stack NAME"
RULE_UNKNOWN = (
    "compares with the id rule's prediction, which could not be read from the installed code ({source}); "
    "test_capture_order measures what SGLang captures"
)


@dataclass(frozen=True)
class EngineNeed:
    """What engine a test needs, before the target and SGLang are known.

    Attributes:
        name: id part of the generated test (``kimi-embedding-first``, ``decode``).
        case: the contract fixture (``fixtures/contracts/<case>.json``) whose ids
            the engine captures; :data:`USER_DRAFT` for ``--eagle3-draft``.
        variant: a path variant (:mod:`pytest_eagle3.engine.variants`); its
            server args, request shape and ids override the case's.
        every_tp: run at every TP size of the test's ``tp`` marker; otherwise
            only at TP 1 (:data:`TP1_ONLY`).
        needs_embedding: the test reads the embedding slot; left out when the
            installed SGLang's rule cannot capture it.
        needs_contract: the test compares with the case's training contract;
            left out when the contract is invalid on this target.
        group: the engine group tests are sorted by, so tests sharing an
            engine run back to back (default: ``name``).
        acceptance: the engine runs EAGLE-3 speculative decoding with a trained
            draft (the user's ``--eagle3-draft`` or the preset's shipped one).
        portable_draft: with ``acceptance``: the preset's portable draft
            (:data:`PORTABLE_CASE`), generated only where the installed SGLang
            cannot serve the shipped draft's contract.
        draft_variant: with ``acceptance``: a shipped draft variant
            (:data:`MLA_VARIANTS`, ``fixtures/drafts/<preset>-<variant>``),
            generated only where the installed SGLang has its model class.
        measures_rule: the test judges the captures without the id rule's
            prediction (it measures the rule, or compares with a contract or
            an acceptance gate), so it runs where the rule could not be read;
            the others are left out there (:data:`RULE_UNKNOWN`).
    """

    name: str
    case: str
    variant: "Variant | None" = field(default=None, compare=False)
    group: str = ""
    every_tp: bool = False
    needs_embedding: bool = False
    needs_contract: bool = False
    acceptance: bool = False
    portable_draft: bool = False
    draft_variant: str = ""
    measures_rule: bool = False

    def __str__(self) -> str:
        return self.name

    @property
    def engine_group(self) -> str:
        return self.group or self.name

    @property
    def own_engine(self) -> bool:
        """A variant with server args or ids of its own needs an engine nobody else uses."""
        v = self.variant
        return v is not None and (bool(v.server_args) or v.ids is not None)


class PlanOptions(Protocol):
    """The run facts that decide which needs apply (the plugin's ``Settings`` has them).

    Attributes:
        device: ``"cpu"`` or ``"cuda"``; tp: the run's tensor-parallel size.
        slow: tests marked slow run; plan: only planning (``--eagle3-plan``).
        target: the target preset or checkpoint path; cache_dir: the cache.
        draft, stack: the user's own draft and its training stack (``None``: none).
        capture_method: ``auto``, ``capture-only`` or ``eagle3-draft``.
    """

    @property
    def device(self) -> str: ...

    @property
    def tp(self) -> int: ...

    @property
    def slow(self) -> bool: ...

    @property
    def plan(self) -> bool: ...

    @property
    def target(self) -> str: ...

    @property
    def cache_dir(self) -> Path: ...

    @property
    def draft(self) -> Path | None: ...

    @property
    def stack(self) -> str | None: ...

    @property
    def capture_method(self) -> str: ...


@dataclass(frozen=True)
class NeedContext:
    """What deciding a need takes: the run, the installed SGLang, the target.

    ``install`` and ``facts`` are ``None`` when they could not be read (SGLang
    missing, bad target); needs that depend on them are then kept at collection
    and fail at run time with that error.
    """

    settings: "PlanOptions"
    tp: int
    install: "SGLangInstall | None" = None
    facts: "TargetFacts | None" = None


@dataclass(frozen=True)
class EngineRequest:
    """The engine and requests a test runs: ``eagle3_capture.run(request)``.

    Attributes:
        ids: aux layer ids as a draft config declares them (``None``: SGLang's default).
        extra_args: server arguments beyond the capture ones (a variant's).
        decode_steps: decode rows wanted per prompt.
        batch: send all prompts in one request.
        repeat: send each prompt this many times (radix-cache hits).
        expected: snapshot indices (``hs`` of the reference) each slot should hold.
        predicted: what the installed SGLang's id rule says it captures.
        xfail_reason: a known incompatibility of the installed SGLang: the
            contract differs from the prediction (``None``: none).
        note: a fact for the report (``record_property``), e.g. ignored ids.
        contract: the training contract ``expected`` comes from, as text
            (``None``: the case has none on this target; ``expected`` is then
            the prediction).
        draft: the EAGLE-3 draft directory the engine loads (the draft path:
            SGLang reads ``ids`` from its ``config.json``); ``None``: capture-only.
        user_draft: the request of ``--eagle3-draft`` (a mismatch always fails).
    """

    ids: "tuple[int, ...] | None"
    extra_args: "dict[str, Any]" = field(default_factory=dict)
    decode_steps: int = 0
    batch: bool = False
    repeat: int = 1
    expected: tuple[int, ...] = ()
    predicted: tuple[int, ...] = ()
    xfail_reason: str | None = None
    note: str | None = None
    contract: str | None = None
    draft: str | None = None
    user_draft: bool = False


def case_needs(names: Sequence[str] | None = None, *, every_tp: Sequence[str] = (cases.WIDE_CASE,),
               needs_embedding: bool = False, needs_contract: bool = False,
               measures_rule: bool = False) -> list[EngineNeed]:
    """A need per contract fixture (all of them by default), read at collection."""
    return [EngineNeed(name, name, every_tp=name in every_tp, needs_embedding=needs_embedding,
                       needs_contract=needs_contract, measures_rule=measures_rule or needs_contract)
            for name in (cases.case_names() if names is None else names)]


def user_draft_need() -> EngineNeed:
    """The need of ``--eagle3-draft``: every TP size, no XFAIL."""
    return EngineNeed(USER_DRAFT, USER_DRAFT, every_tp=True, measures_rule=True)


def variant_needs(variants: "Sequence[Variant]") -> list[EngineNeed]:
    """A need per path variant; plain-engine variants share the wide case's engine."""
    out = []
    for v in variants:
        own = bool(v.server_args) or v.ids is not None
        out.append(EngineNeed(v.name, cases.WIDE_CASE, variant=v, every_tp=True,
                              group=f"variant-{v.name}" if own else cases.WIDE_CASE))
    return out


#: The contract of the portable draft (``fixtures/drafts/<preset>-portable``):
#: ids ``[1, 3, 4]`` mean ``hs[2], hs[4], hs[5]`` under every id rule SGLang has had.
PORTABLE_CASE = "specforge-default-ids"
PORTABLE_SUFFIX = "-portable"
PORTABLE_NOT_NEEDED = (
    "the shipped draft's contract is servable on {sglang}: the portable draft runs only where it is not"
)
PORTABLE_USER_DRAFT = "--eagle3-draft is the acceptance draft: the portable draft is not used"
NO_PORTABLE_DRAFT = "target {target} ships no portable draft (fixtures/drafts/<preset>-portable)"


#: The MLA EAGLE-3 drafts (``fixtures/drafts/<preset>-<variant>``): SGLang's
#: ``Eagle3DeepseekV2ForCausalLM`` layout (``srt/models/kimi_k25_eagle3.py``), plain,
#: with ``fc_norm`` and with ``norm_output``, trained on the shipped draft's contract.
MLA_VARIANTS = ("mla", "mla-fc-norm", "mla-norm-output")
#: The MLA variant the main job runs on cpu; the others need ``--eagle3-slow`` there.
MLA_MAIN = "mla"
NO_MLA_MODEL = (
    "{sglang} has no MLA EAGLE-3 draft model ({file} with class {cls}): the MLA drafts run on releases that ship it"
)
VARIANT_USER_DRAFT = "--eagle3-draft is the acceptance draft: the shipped {variant} draft is not used"
NO_VARIANT_DRAFT = "target {target} ships no {variant} draft (fixtures/drafts/<preset>-{variant})"
#: The MLA drafts serve the DeepSeek-V3 layout only (Kimi-K2.x); ``{target}``, ``{architecture}``.
MLA_NOT_THIS_FAMILY = (
    "the MLA drafts (Eagle3DeepseekV2ForCausalLM, srt/models/kimi_k25_eagle3.py) serve DeepSeek-V3-layout "
    "targets (Kimi-K2.x); target {target} is {architecture}"
)
#: A family preset's shipped draft already declares the portable ids.
PORTABLE_IS_SHIPPED = (
    "target {target}'s shipped draft already declares the portable ids [1, L//2-1, L-4] (specforge-default-ids)"
)
VARIANT_SLOW = (
    "the {variant} draft needs engines of its own (about 40 s per TP size on cpu); run with --eagle3-slow"
)


def acceptance_need(*, portable: bool = False, variant: str = "") -> EngineNeed:
    """The need of the acceptance tests: speculative decoding with a trained draft,
    at every TP size of the test's marker; its engine also serves draft-path captures.

    ``portable``: the preset's portable draft, whose contract every release
    serves, so a release that cannot serve the shipped draft (0.5.9, 0.5.12:
    its acceptance collapse is an XFAIL) still has an acceptance gate that must
    hold on its draft path.  ``variant``: one of :data:`MLA_VARIANTS`.
    """
    if portable:
        return EngineNeed("acceptance-portable", PORTABLE_CASE, every_tp=True, acceptance=True,
                          group="acceptance-portable", portable_draft=True, measures_rule=True)
    if variant:
        return EngineNeed(f"acceptance-{variant}", cases.WIDE_CASE, every_tp=True, acceptance=True,
                          group=f"acceptance-{variant}", draft_variant=variant, measures_rule=True)
    return EngineNeed("acceptance", cases.WIDE_CASE, every_tp=True, acceptance=True, group="acceptance",
                      measures_rule=True)


def acceptance_draft(settings: "PlanOptions", *, portable: bool = False, variant: str = "") -> Path | None:
    """The trained draft the acceptance tests load: ``--eagle3-draft``, else the
    target preset's shipped draft (``fixtures/drafts/<preset>``; ``portable``:
    ``fixtures/drafts/<preset>-portable``; ``variant``: ``fixtures/drafts/<preset>-<variant>``),
    else ``None``."""
    if settings.draft is not None and not portable and not variant:
        return Path(settings.draft)

    suffix = PORTABLE_SUFFIX if portable else (f"-{variant}" if variant else "")
    shipped = shipped_draft_dir(f"{settings.target}{suffix}")
    return shipped if (shipped / "config.json").is_file() else None


def _variant_reason(variant: str, ctx: NeedContext) -> str | None:
    """Why a shipped draft variant is not generated in this run (``None``: it is)."""
    s = ctx.settings
    if s.draft is not None:
        return VARIANT_USER_DRAFT.format(variant=variant)
    if ctx.facts is not None and ctx.facts.kv_lora_rank is None and acceptance_draft(s, variant=variant) is None:
        return MLA_NOT_THIS_FAMILY.format(target=s.target, architecture=ctx.facts.architecture)
    if acceptance_draft(s, variant=variant) is None:
        return NO_VARIANT_DRAFT.format(target=s.target, variant=variant)
    if ctx.install is not None and not has_draft_model(ctx.install.location, MLA_ARCHITECTURE):
        return NO_MLA_MODEL.format(sglang=ctx.install.describe(), file=DRAFT_FILES[MLA_ARCHITECTURE],
                                   cls=MLA_ARCHITECTURE)
    if s.device == "cpu" and variant != MLA_MAIN and not s.slow:
        return VARIANT_SLOW.format(variant=variant)
    return None


def _portable_reason(ctx: NeedContext) -> str | None:
    """Why the portable acceptance draft is not generated in this run (``None``: it is)."""
    s = ctx.settings
    if s.draft is not None:
        return PORTABLE_USER_DRAFT
    if acceptance_draft(s, portable=True) is None:
        shipped = acceptance_draft(s)
        if shipped is not None and _declares_portable_ids(shipped):
            return PORTABLE_IS_SHIPPED.format(target=s.target)
        return NO_PORTABLE_DRAFT.format(target=s.target)
    if ctx.install is None or ctx.facts is None or acceptance_draft(s) is None:
        return None
    if _acceptance_request(ctx).xfail_reason is None:
        return PORTABLE_NOT_NEEDED.format(sglang=ctx.install.describe())
    return None


def _declares_portable_ids(draft: Path) -> bool:
    """The draft's provenance names the portable contract (``specforge-default-ids``)."""
    try:
        meta = json.loads((Path(draft) / "config.json").read_text(encoding="utf-8")).get("pytest_eagle3") or {}
    except (OSError, ValueError):
        return False
    return meta.get("contract") == PORTABLE_CASE


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


def collect_reason(need: EngineNeed, ctx: NeedContext) -> str | None:
    """Why ``need`` is not generated at ``ctx.tp`` in this run (``None``: it is).

    Decided from the run's settings, the target's ``config.json`` and the
    installed SGLang's flags and model files only: nothing starts.
    """
    s = ctx.settings
    if need.case == USER_DRAFT and s.draft is None:
        return NO_USER_DRAFT
    if need.acceptance and need.portable_draft:
        reason = _portable_reason(ctx)
        if reason is not None:
            return reason
    elif need.acceptance and need.draft_variant:
        reason = _variant_reason(need.draft_variant, ctx)
        if reason is not None:
            return reason
    elif need.acceptance and acceptance_draft(s) is None:
        return NO_ACCEPTANCE_DRAFT.format(target=s.target)
    if ctx.tp > s.tp:
        return TP_ABOVE.format(needed=ctx.tp, tp=s.tp)
    if ctx.tp > 1 and not need.every_tp:
        return TP1_ONLY.format(wide=cases.WIDE_CASE)
    if s.device == "cpu" and ctx.tp == 8 and not s.slow:
        return SLOW_TP8
    v = need.variant
    if v is not None:
        if ctx.install is not None:
            arch = detect_gpu_arch() if s.device == "cuda" else None
            if arch is None and s.device == "cuda" and s.plan:
                arch = PLAN_GPU_ARCH  # --eagle3-plan on a machine without GPUs
            reason = v.requirements(ctx.install, s.device, ctx.tp, arch)
            if reason:
                return reason
        if s.device == "cpu" and need.own_engine:
            if ctx.tp > 1 and v.needs.min_tp <= 1:
                return OWN_ENGINE_TP1_ON_CPU
            if not s.slow:
                return SLOW
    if ctx.install is not None:
        arch = ctx.facts.architecture if ctx.facts is not None else DEFAULT_ARCHITECTURE
        if ctx.install.eagle3_capture(arch) is False:
            return NO_DEEPSEEK_EAGLE3.format(sglang=ctx.install.describe(), architecture=arch,
                                             why=ctx.install.id_rule(arch).source)
        if ctx.install.flags and not (ctx.install.has_arg("enable_return_aux_hidden_states")
                                      or ctx.install.has_arg("enable_return_hidden_states")):
            return NO_DRAFT_PATH.format(sglang=ctx.install.describe())
    if need.case == USER_DRAFT or ctx.install is None or ctx.facts is None:
        return None
    try:
        request = resolve(need, ctx)
    except Eagle3ConfigError:
        return None  # reported by the test itself at run time

    L = ctx.facts.num_layers
    rule = installed_rule(ctx)
    prediction = predict(list(request.ids) if request.ids is not None else None, L, rule)
    if prediction.fails_at_first_forward:
        return COLLAPSES.format(ids=list(request.ids) if request.ids is not None else "(none: SGLang's default)", L=L,
                                sglang=f"sglang {ctx.install.version}", layers=list(prediction.layers_to_capture),
                                why=_fails_why(prediction, rule))
    if not prediction.known and not need.measures_rule:
        return RULE_UNKNOWN.format(source=prediction.source)
    if need.needs_contract and request.contract is None:
        return request.note
    if need.needs_embedding and prediction.known and 0 not in prediction.snapshots:
        return NO_EMBEDDING_ID.format(sglang=ctx.install.describe(), rule=rule.describe(),
                                      layer0=_layer0_text(rule))
    return None


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
        return _acceptance_request(ctx, portable=need.portable_draft, variant=need.draft_variant)
    case = cases.resolve(need.case, L, H, rule)
    if v is not None:
        ids = tuple(v.ids(L, ctx.facts.first_k_dense_replace)) if v.ids is not None else _ids(case.ids)
        predicted = tuple(predict(list(ids) if ids is not None else None, L, rule).snapshots)
        req = dict(v.request)
        return EngineRequest(ids, v.args_for(ctx.install, ctx.tp), decode_steps=int(req.get("decode_steps", 0)),
                             batch=bool(req.get("batch")), repeat=int(req.get("repeat", 1)),
                             expected=predicted, predicted=predicted,
                             draft=capture_draft(ctx, ids) if case_uses_draft_path(ctx, ids) else None)
    ids = _ids(case.ids)
    predicted = tuple(predict(list(ids) if ids is not None else None, L, rule).snapshots)
    draft = capture_draft(ctx, ids) if case_uses_draft_path(ctx, ids) else None
    if case.contract is None:
        # The capture-order test checks SGLang's own rule, which needs no contract.
        return EngineRequest(ids, expected=predicted, predicted=predicted, draft=draft,
                             note=NO_CONTRACT.format(case=need.case, L=L, error=case.error))
    expected = tuple(case.contract.to_snapshot_indices(L))
    xfail = None
    if expected != predicted and predicted:
        xfail = known_incompatibility(need.case, case.contract, ids, predicted, L, ctx.install,
                                      ctx.facts.architecture)
    return EngineRequest(ids, expected=expected, predicted=predicted, xfail_reason=xfail, contract=str(case.contract),
                         draft=draft)


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


def _acceptance_request(ctx: NeedContext, *, portable: bool = False, variant: str = "") -> EngineRequest:
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
    declared = draft_layer_ids(draft)
    ids = tuple(declared) if declared is not None else None
    L = ctx.facts.num_layers
    rule = installed_rule(ctx)
    predicted = tuple(predict(list(ids) if ids is not None else None, L, rule).snapshots)
    contract = _trained_contract(draft, L, ctx.facts.hidden_size, rule)
    xfail = None
    expected = predicted
    if contract is not None:
        expected = tuple(contract.to_snapshot_indices(L))
        if expected != predicted and predicted:
            xfail = known_incompatibility(f"draft {draft.name}", contract, ids, predicted, L, ctx.install,
                                          ctx.facts.architecture)
    return EngineRequest(ids, expected=expected, predicted=predicted, draft=str(draft), xfail_reason=xfail,
                         contract=str(contract) if contract is not None else None)


def _trained_contract(draft: Path, num_layers: int, hidden_size: int, rule: Any) -> Any:
    """The contract a pytest-eagle3-built draft records in its ``config.json``
    (``pytest_eagle3.contract``, the name of a contract fixture), or ``None``."""
    import json

    try:
        meta = json.loads((draft / "config.json").read_text(encoding="utf-8")).get("pytest_eagle3") or {}
        name = meta.get("contract")
        if not name or name not in cases.case_names():
            return None
        return cases.resolve(name, num_layers, hidden_size, rule).contract
    except (OSError, ValueError, KeyError, Eagle3ConfigError):
        return None


def installed_rule(ctx: NeedContext) -> "IdRule":
    """The installed SGLang's id rule for the target's architecture, read from its
    model file (:mod:`pytest_eagle3.sglang_source.model_code`), never from its version."""
    assert ctx.install is not None
    arch = ctx.facts.architecture if ctx.facts is not None else DEFAULT_ARCHITECTURE
    return ctx.install.id_rule(arch)


def _layer0_text(rule: "IdRule") -> str:
    emb = rule.embedding
    if emb.capturable is False:
        return f"{emb.why} [{emb.source}]"
    return "its id rule never maps an id to layer 0"


def _fails_why(p: Any, rule: "IdRule") -> str:
    if p.setup_error is not None:
        return f"at engine setup ({p.setup_error} in {rule.source})"
    if p.embedding_fails:
        return f"at the first forward (layer 0: {rule.embedding.why})"
    return "at the first forward"


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
    contract = contract_for_draft(s.draft, s.stack, num_layers=L, target_hidden_size=H,
                                  sglang_version=rule if s.stack == "specforge-sglang" else None)
    ids = tuple(draft.ids) if draft.ids is not None and draft.sglang_reads_ids else None
    note = installed_top_level_trap(draft, ctx.install.location)
    predicted = tuple(predict(list(ids) if ids is not None else None, L, rule).snapshots)
    return EngineRequest(ids, expected=tuple(contract.to_snapshot_indices(L)), predicted=predicted, note=note,
                         contract=str(contract), user_draft=True)
