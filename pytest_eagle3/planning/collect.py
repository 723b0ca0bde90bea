"""Which declared needs a run generates: :func:`collect_reason` says why a
``(TP size, need)`` pair is left out, decided from the run's settings, the
target's ``config.json`` and the installed SGLang's flags and model files only
(nothing starts).  Collection (:mod:`pytest_eagle3.plugin.hooks`) and
``--eagle3-plan`` print each reason as one summary line.

The policy: which id lists run at which TP size (:data:`TP1_ONLY`), which
variants need an engine of their own (``slow`` on CPU), which drafts apply
(the user's, the shipped one, the portable one, the MLA variants).

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_eagle3.conventions import predict
from pytest_eagle3.contracts.draft import read_draft_config
from pytest_eagle3.draft.config import MLA_ARCHITECTURE
from pytest_eagle3.engine.gpus import PLAN_GPU_ARCH, detect_gpu_arch
from pytest_eagle3.engine.variants import CPU_ALLREDUCE_FUSION
from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.planning import cases
from pytest_eagle3.planning.declare import MLA_MAIN, PORTABLE_CASE, USER_DRAFT, EngineNeed, NeedContext
from pytest_eagle3.planning.request import acceptance_draft, acceptance_request, installed_rule, resolve
from pytest_eagle3.sglang_source.id_keys import DRAFT_FILES, has_draft_model
from pytest_eagle3.sglang_source.pp_code import read_pp_code
from pytest_eagle3.worker.upstream_fixes import PP_LIFTS, UpstreamFixError, read_fix
from pytest_eagle3.target.spec import DEFAULT_ARCHITECTURE

if TYPE_CHECKING:
    from pytest_eagle3.conventions import IdRule
    from pytest_eagle3.engine.spec_shapes import SpecShape
    from pytest_eagle3.sglang_source.pp_code import PpCode

# Reasons a (TP, need) pair is left out at collection (one summary line each).
TP1_ONLY = (
    "id-list cases other than {wide!r} run at TP 1 only: which layers a list selects does "
    "not depend on TP"
)
TP_ABOVE = "needs --tp {needed}; this run has --tp {tp}"
SLOW = "needs an SGLang engine of its own (minutes on cpu); run with --eagle3-slow"
#: The fusion on/off pair in a run whose every engine fuses (the contrast needs both).
FUSED_RUN = ("--eagle3-cpu-allreduce-fusion fuses every engine of this run: the all-reduce fusion on/off pair "
             "runs without it")
SLOW_TP8 = "TP 8 on cpu (about 100 s and 15 GB per engine); run with --eagle3-slow"
OWN_ENGINE_TP1_ON_CPU = (
    "path variants with an engine of their own run at TP 1 only on cpu (engine starts dominate the run)"
)
COLLAPSES = (
    "ids {ids} on {L} layers make {sglang} capture layers {layers}, which fails {why} "
    "(pytest-eagle3 inspect reports this before any engine starts)"
)
NO_DEEPSEEK_EAGLE3 = (
    "{sglang} cannot serve EAGLE-3 for {architecture}: {why}"
)
NO_DRAFT_PATH = (
    "{sglang} has neither --enable-return-aux-hidden-states nor --enable-return-hidden-states: "
    "its captures cannot be read"
)
#: ``--eagle3-pp`` on an SGLang that refuses EAGLE-3 or its captures at PP (every engine would exit at startup).
PP_GATE = "--eagle3-pp {pp}: {why}"
NO_EMBEDDING_ID = "{sglang} cannot capture the embedding: {layer0}; id rule {rule}: no id list yields hs[0]"
NO_ACCEPTANCE_DRAFT = (
    "acceptance needs a trained EAGLE-3 draft: target {target} ships none; pass --eagle3-draft PATH"
)
NO_USER_DRAFT = "your own draft: pass --eagle3-draft PATH --eagle3-stack NAME"
RULE_UNKNOWN = (
    "compares with the id rule's prediction, which could not be read from the installed code ({source}); "
    "test_capture_order measures what SGLang captures"
)


PORTABLE_NOT_NEEDED = (
    "the shipped draft's contract is servable on {sglang}: the portable draft runs only where it is not"
)
PORTABLE_USER_DRAFT = "--eagle3-draft is the acceptance draft: the portable draft is not used"
NO_PORTABLE_DRAFT = "target {target} ships no portable draft (fixtures/drafts/<preset>-portable)"


NO_MLA_MODEL = (
    "{sglang} has no MLA EAGLE-3 draft model ({file} with class {cls}): the MLA drafts run on releases that ship it"
)
SHAPE_USER_DRAFT = ("--eagle3-draft is the acceptance draft: the {shape} speculative shape runs the shipped draft, "
                    "whose acceptance the suite knows")
SHAPE_SLOW = ("the {shape} speculative shape needs engines of its own (about 40-60 s per TP size on cpu); "
              "run with --eagle3-slow")
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
MLA_TP1_ON_CPU = (
    "the {variant} draft runs at TP 1 on cpu (the shipped draft covers TP > 1; an engine start each); "
    "run with --eagle3-slow for every TP size"
)
VARIANT_SLOW = (
    "the {variant} draft needs engines of its own (about 40 s per TP size on cpu); run with --eagle3-slow"
)


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
    if s.device == "cpu" and variant == MLA_MAIN and 1 < ctx.tp <= s.tp and not s.slow:
        return MLA_TP1_ON_CPU.format(variant=variant)
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
    if acceptance_request(ctx).xfail_reason is None:
        return PORTABLE_NOT_NEEDED.format(sglang=ctx.install.describe())
    return None


def _shape_reason(shape: "SpecShape", ctx: NeedContext) -> str | None:
    """Why the acceptance engine of speculative ``shape`` is not generated (``None``: it is)."""
    s = ctx.settings
    if s.draft is not None:
        return SHAPE_USER_DRAFT.format(shape=shape.name)
    if ctx.install is not None:
        reason = shape.requirement(ctx.install, s.device)
        if reason is not None:
            return reason
    if s.device == "cpu" and not s.slow:
        return SHAPE_SLOW.format(shape=shape.name)
    return None


def _declares_portable_ids(draft: Path) -> bool:
    """The draft's provenance names the portable contract (``specforge-default-ids``)."""
    try:
        meta = read_draft_config(draft).get("pytest_eagle3")
    except Eagle3ConfigError:
        return False
    return isinstance(meta, dict) and meta.get("contract") == PORTABLE_CASE


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
    if need.spec_shape is not None:
        reason = _shape_reason(need.spec_shape, ctx)
        if reason is not None:
            return reason
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
        if s.device == "cpu" and s.cpu_allreduce_fusion and CPU_ALLREDUCE_FUSION in (v.cpu_args or {}):
            return FUSED_RUN
        if s.device == "cpu" and need.own_engine(s.device):
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
        if s.pp > 1:
            reason = _pp_reason(s.pp, read_pp_code(ctx.install.location, arch))
            if reason is not None:
                return reason
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


def _pp_reason(pp_size: int, pp: "PpCode") -> str | None:
    """Why the engine tests are left out at ``--eagle3-pp`` > 1 (``None``: they run).

    An upstream fix that lifts SGLang's PP checks on EAGLE-3
    (:data:`pytest_eagle3.worker.upstream_fixes.PP_LIFTS`, named by
    :data:`pytest_eagle3.worker.env.FIX_ENV`) keeps every test.
    """
    try:
        fix = read_fix()
    except UpstreamFixError:
        fix = None
    if fix not in PP_LIFTS and (pp.eagle_gate is not None or pp.capture_gate is not None):
        return PP_GATE.format(pp=pp_size, why=pp.describe())
    return None


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
