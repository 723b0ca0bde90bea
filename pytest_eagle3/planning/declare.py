"""One declaration of the engine a packaged test needs.

A packaged test says which engine it needs with the ``eagle3_engines`` marker::

    @pytest.mark.tp(1, 2, 4, 8)
    @pytest.mark.eagle3_engines(*case_needs())
    def test_capture_order(eagle3_need, eagle3_engine_request, eagle3_capture, ...):
        captures = eagle3_capture.run(eagle3_engine_request)

Everything else reads that one declaration:

* collection (:mod:`pytest_eagle3.plugin.hooks`) generates the test only for the
  ``(TP size, need)`` pairs this run can execute
  (:func:`pytest_eagle3.planning.collect.collect_reason`) and summarises what it
  left out, one line per reason;
* the ``eagle3_engine_request`` fixture turns the need into an
  :class:`EngineRequest` (:func:`pytest_eagle3.planning.request.resolve`) that
  ``eagle3_capture`` starts or reuses an engine for;
* ``--eagle3-plan`` (:mod:`pytest_eagle3.plugin.plan`) calls the same
  :func:`~pytest_eagle3.planning.request.resolve` and
  :func:`pytest_eagle3.capture.api.engine_config`, so the plan and the run agree
  engine for engine.

This module holds the declaration (:class:`EngineNeed`, :class:`NeedContext`,
:class:`EngineRequest` and the needs the suite declares).  Policy lives in
the planning package, not in test bodies: which id lists run at which TP size
and which variants need an engine of their own (``slow`` on CPU) in
:mod:`pytest_eagle3.planning.collect`; which ids a draft config makes SGLang
read and which contract mismatch is a known incompatibility of the installed
SGLang (an XFAIL) in :mod:`pytest_eagle3.planning.request`.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from pytest_eagle3.engine.variants import PAIR_MEMBER
from pytest_eagle3.planning import cases
from pytest_eagle3.settings import Settings

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.engine.spec_shapes import SpecShape
    from pytest_eagle3.engine.variants import Variant
    from pytest_eagle3.target.spec import TargetFacts

#: Marker carrying a test's :class:`EngineNeed` declarations.
MARKER = "eagle3_engines"
#: Parameter name of the need a generated test runs with.
NEED_ARGNAME = "eagle3_need"
#: Name of a need in its own engine set (:meth:`EngineNeed.engine_set`).
MAIN = "main"
#: Need name of the user's own draft (``--eagle3-draft``).
USER_DRAFT = "your-draft"
#: The contract of the portable draft (``fixtures/drafts/<preset>-portable``):
#: ids ``[1, 3, 4]`` mean ``hs[2], hs[4], hs[5]`` under every id rule SGLang has had.
PORTABLE_CASE = "specforge-default-ids"
PORTABLE_SUFFIX = "-portable"
#: The MLA EAGLE-3 drafts (``fixtures/drafts/<preset>-<variant>``): SGLang's
#: ``Eagle3DeepseekV2ForCausalLM`` layout (``srt/models/kimi_k25_eagle3.py``), plain,
#: with ``fc_norm`` and with ``norm_output``, trained on the shipped draft's contract.
MLA_VARIANTS = ("mla", "mla-fc-norm", "mla-norm-output")
#: The MLA variant the main job runs on cpu; the others need ``--eagle3-slow`` there.
MLA_MAIN = "mla"


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
            only at TP 1 (:data:`pytest_eagle3.planning.collect.TP1_ONLY`).
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
        spec_shape: with ``acceptance``: the speculative shape the engine runs
            (:mod:`pytest_eagle3.engine.spec_shapes`: a token tree, the other overlap
            schedule); ``None``: the acceptance engines' chain.
        measures_rule: the test judges the captures without the id rule's
            prediction (it measures the rule, or compares with a contract or
            an acceptance gate), so it runs where the rule could not be read;
            the others are left out there (:data:`pytest_eagle3.planning.collect.RULE_UNKNOWN`).
        also: the other engines of the test's engine set, ``(name, need)``
            pairs: the ``eagle3_engine_set`` fixture resolves each
            (:meth:`engine_set`), and ``--eagle3-plan`` and the prefetch see them
            as they see the need itself.
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
    spec_shape: "SpecShape | None" = field(default=None, compare=False)
    measures_rule: bool = False
    also: tuple[tuple[str, "EngineNeed"], ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return self.name

    def engine_set(self) -> "dict[str, EngineNeed]":
        """The test's named engines: this need as :data:`MAIN`, then :attr:`also`."""
        return {MAIN: self, **dict(self.also)}

    @property
    def engine_group(self) -> str:
        return self.group or self.name

    def own_engine(self, device: str) -> bool:
        """A variant with server args or ids of its own needs an engine nobody else
        uses on ``device`` (:meth:`pytest_eagle3.engine.variants.Variant.own_engine`)."""
        return self.variant is not None and self.variant.own_engine(device)


@dataclass(frozen=True)
class NeedContext:
    """What deciding a need takes: the run, the installed SGLang, the target.

    ``install`` and ``facts`` are ``None`` when they could not be read (SGLang
    missing, bad target); needs that depend on them are then kept at collection
    and fail at run time with that error.
    """

    settings: Settings
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
    """A need per path variant; variants without an engine of their own share the
    capture engine (the sort groups them with it on cpu, where every shared
    variant shares it; on cuda a variant with server args sorts by its name)."""
    by_name = {v.name: v for v in variants}
    out = []
    for v in variants:
        own = v.own_engine("cpu")
        also: tuple[tuple[str, EngineNeed], ...] = ()
        if v.pair in by_name:
            # The on/off contrast: the pair's engine joins the test's engine set.
            also = ((PAIR_MEMBER, EngineNeed(v.pair, cases.WIDE_CASE, variant=by_name[v.pair], every_tp=True)),)
        out.append(EngineNeed(v.name, cases.WIDE_CASE, variant=v, every_tp=True,
                              group=f"variant-{v.name}" if own else cases.WIDE_CASE, also=also))
    return out


def with_capture_only(need: EngineNeed, name: str = "capture-only") -> EngineNeed:
    """``need`` with the capture-only engine of its case added to its engine set
    (the capture engine, shared with the capture tests)."""
    from dataclasses import replace

    return replace(need, also=(*need.also, (name, EngineNeed(name, need.case, every_tp=True))))


def acceptance_need(*, portable: bool = False, variant: str = "", path: "Variant | None" = None,
                    shape: "SpecShape | None" = None) -> EngineNeed:
    """The need of the acceptance tests: speculative decoding with a trained draft,
    at every TP size of the test's marker; its engine also serves draft-path captures.

    ``portable``: the preset's portable draft, whose contract every release
    serves, so a release that cannot serve the shipped draft (0.5.9, 0.5.12:
    its acceptance collapse is an XFAIL) still has an acceptance gate that must
    hold on its draft path.  ``variant``: one of :data:`MLA_VARIANTS`.  ``path``:
    a path variant whose server args the engine adds (``dp-attention``: verify on
    attention DP's reduce-scatter route); an engine of its own, left out where the
    variant cannot run.  ``shape``: a speculative shape of
    :mod:`pytest_eagle3.engine.spec_shapes` (an engine of its own; a shape with a
    ``pair`` has the chain's acceptance engine in its engine set as
    :data:`~pytest_eagle3.engine.variants.PAIR_MEMBER`, at TP 1 only).
    """
    if shape is not None:
        also = ((PAIR_MEMBER, acceptance_need()),) if shape.pair else ()
        return EngineNeed(f"acceptance-{shape.name}", cases.WIDE_CASE, every_tp=not shape.pair, acceptance=True,
                          group=f"acceptance-{shape.name}", spec_shape=shape, measures_rule=True, also=also)
    if path is not None:
        return EngineNeed(f"acceptance-{path.name}", cases.WIDE_CASE, variant=path, every_tp=True, acceptance=True,
                          group=f"acceptance-{path.name}", measures_rule=True)
    if portable:
        return EngineNeed("acceptance-portable", PORTABLE_CASE, every_tp=True, acceptance=True,
                          group="acceptance-portable", portable_draft=True, measures_rule=True)
    if variant:
        return EngineNeed(f"acceptance-{variant}", cases.WIDE_CASE, every_tp=True, acceptance=True,
                          group=f"acceptance-{variant}", draft_variant=variant, measures_rule=True)
    return EngineNeed("acceptance", cases.WIDE_CASE, every_tp=True, acceptance=True, group="acceptance",
                      measures_rule=True)
