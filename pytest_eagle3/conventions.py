"""SGLang's rule mapping EAGLE-3 aux layer ids to residual-stream snapshots.

SGLang's models capture the *input* of layer ``i`` (the completed residual
stream) for every ``i`` in the inner model's ``layers_to_capture``, in layer
order, so ``layers_to_capture = [i, ...]`` yields snapshots ``hs[i]``
(``verdicts/snapshots.py``); ``i >= L`` is never reached and ``i = 0`` is the
embedding.  The causal-LM class's ``set_eagle3_layers_to_capture(ids)``
builds that list, and each model file has its own version of it.

An :class:`IdRule` is that mapping plus whether layer 0 can be captured.  The
one that counts comes from the installed code
(:func:`pytest_eagle3.sglang_source.model_code.read_rules` runs the installed method
on a stand-in); :func:`rule_for_version` is only the *prediction* for an SGLang
that is not installed (``pytest-eagle3 inspect --sglang-version``), from the
upstream releases' DeepSeek model (``srt/models/deepseek_v2.py`` of every
wheel 0.5.8-0.5.23):

* sglang <= 0.5.12: always ``[v + 1 for v in ids]``;
* sglang >= 0.5.13 (PR #25454, May 2026): ``+1`` only when ``ids[0] == 1``,
  else ``ids`` unchanged;
* no ids: ``[2, L // 2, L - 3]`` (no offset);
* layer 0 can be captured only since 0.5.14: before, the capture adds
  ``hidden_states + residual`` while ``residual`` is still None before layer 0,
  a TypeError at the first forward (0.5.9 ``deepseek_v2.py:2728``, 0.5.13
  ``:2453``; 0.5.14 hands the capture to the decoder layer).

Forks keep their own numbers (sglang-kt 0.7.2 behaves like upstream 0.5.12), so
a version number never decides a rule for an installed SGLang.
Pure Python: no torch, no SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from packaging.version import InvalidVersion, Version

#: First release with the first-id rule of PR #25454.
FIRST_ID_RULE_SINCE = Version("0.5.13")
#: First release whose DeepSeek model can capture layer 0 (the embedding).
EMBEDDING_CAPTURE_SINCE = Version("0.5.14")

# Kinds of rule (what a rule does, never which release has it).
ALWAYS_PLUS_ONE = "always +1"
PLUS_ONE_IF_FIRST_IS_ONE = "+1 only when the first id is 1"
AS_GIVEN_IF_MAX_IS_L = "ids as given when the largest is L, else +1"
AS_GIVEN = "ids as given"
OWN_RULE = "a rule of its own"
UNKNOWN = "unknown"

#: The id lists a rule is classified by, on :data:`PROBE_LAYERS` layers.
PROBE_LAYERS = 8
PROBES: tuple[tuple[int, ...], ...] = ((0, 3, 5), (1, 3, 4), (2, 4, 5), (2, 4, 8))

Mapping = Callable[[Sequence[int] | None, int], Sequence[int]]


class SetupFailed(Exception):
    """SGLang's ``set_eagle3_layers_to_capture`` raises for these ids (it fails at
    engine setup, e.g. IndexError setting a per-layer flag on a missing layer)."""


class RuleUnknown(Exception):
    """The rule could not be read from the installed code (the reason is the message)."""


@dataclass(frozen=True)
class EmbeddingCapture:
    """Whether layer 0 (the embedding, ``hs[0]``) can be captured.

    Attributes:
        capturable: ``True``, ``False``, or ``None`` (unknown: measured).
        source: ``file:line`` the answer was read from, or the version table.
        why: one line for people.
    """

    capturable: bool | None
    source: str
    why: str


@dataclass(frozen=True, eq=False)
class IdRule:
    """How one SGLang maps a draft's ids to ``layers_to_capture``.

    Attributes:
        kind: a module constant naming what the rule does (:data:`ALWAYS_PLUS_ONE`, ...).
        source: where it was read: ``file:line (Class.method)`` of the installed
            code, or the version table (a prediction) with the reason.
        embedding: whether layer 0 can be captured, and from where.
        mapping: ``(ids or None, L) -> layers_to_capture``; SGLang's own method
            for a rule read from code.  ``None`` when the rule is unknown.
        from_code: read from an installed copy (else: the version table).
        supported: the model has EAGLE-3 capture at all.
        default_layers: ``layers_to_capture`` without ids on :data:`PROBE_LAYERS` layers.
        last_layer: where the model captures the last layer's output for layer
            index ``L`` (``srt/models/gpt_oss.py:732``: ``if self.end_layer in
            self.layers_to_capture``; the Gemma files, ``minimax_m3.py``), ``""``
            where it does not (the others: an ``L`` in ``layers_to_capture`` is
            never reached and the first forward fails).
    """

    kind: str
    source: str
    embedding: EmbeddingCapture
    mapping: Mapping | None = field(default=None, repr=False)
    from_code: bool = False
    supported: bool = True
    default_layers: tuple[int, ...] | None = None
    last_layer: str = ""

    @property
    def known(self) -> bool:
        return self.mapping is not None

    def layers_to_capture(self, ids: Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
        """Raises: RuleUnknown; SetupFailed (SGLang's method raises for these ids)."""
        if self.mapping is None:
            raise RuleUnknown(self.source)
        return tuple(int(v) for v in self.mapping(None if ids is None else list(ids), num_layers))

    def describe(self) -> str:
        """``always +1 (read from srt/models/deepseek_v2.py:3654 ...)``."""
        if not self.known:
            return f"unknown ({self.source}): the suite measures it"
        where = "read from " if self.from_code else ""
        return f"{self.kind} ({where}{self.source})"

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "source": self.source, "from_code": self.from_code,
                "embedding": self.embedding.capturable, "embedding_source": self.embedding.source}


def unknown_rule(why: str, *, supported: bool = True) -> IdRule:
    """A rule that could not be read (``why`` names the file and what failed)."""
    return IdRule(UNKNOWN, why, EmbeddingCapture(None, why, "unknown"), None, False, supported)


def _plus_one(ids: Sequence[int]) -> list[int]:
    return [v + 1 for v in ids]


def classify(mapping: Mapping, num_layers: int = PROBE_LAYERS, *, source: str,
             embedding: EmbeddingCapture) -> IdRule:
    """Name what ``mapping`` (SGLang's own method) does by running it on :data:`PROBES`.

    Raises whatever ``mapping`` raises other than :class:`SetupFailed`.
    """
    got: dict[tuple[int, ...], tuple[int, ...] | None] = {}
    for probe in PROBES:
        try:
            got[probe] = tuple(mapping(list(probe), num_layers))
        except SetupFailed:
            got[probe] = None
    try:
        default = tuple(mapping(None, num_layers))
    except SetupFailed:
        default = None
    if all(v is None for v in got.values()):
        return unknown_rule(f"{source}: it raised at setup for every id list tried")

    def all_match(fn: Callable[[tuple[int, ...]], Sequence[int]]) -> bool:
        return all(v is None or v == tuple(fn(p)) for p, v in got.items())

    if all_match(_plus_one):
        kind = ALWAYS_PLUS_ONE
    elif all_match(lambda p: _plus_one(p) if p[0] == 1 else p):
        kind = PLUS_ONE_IF_FIRST_IS_ONE
    elif all_match(lambda p: p if max(p) == num_layers else _plus_one(p)):
        kind = AS_GIVEN_IF_MAX_IS_L
    elif all_match(lambda p: p):
        kind = AS_GIVEN
    else:
        kind = OWN_RULE + ": " + ", ".join(f"{list(p)} -> {list(v) if v is not None else 'error'}"
                                           for p, v in got.items())
    return IdRule(kind, source, embedding, mapping, True, True, default)


# ----------------------------------------------------------- the version table


def _table_mapping(kind: str) -> Mapping:
    def mapping(ids: Sequence[int] | None, num_layers: int) -> list[int]:
        if ids is None:
            return [2, num_layers // 2, num_layers - 3]
        if kind == ALWAYS_PLUS_ONE or (ids and ids[0] == 1):
            return _plus_one(ids)
        return list(ids)
    return mapping


def _release(version: str) -> tuple[int, ...] | None:
    try:
        return Version(version).release
    except InvalidVersion:
        return None


def rule_for(version: str) -> str:
    """The kind of rule upstream SGLang ``version``'s DeepSeek model has (version
    table; unknown or dev versions get the newest rule)."""
    release = _release(version)
    return ALWAYS_PLUS_ONE if release is not None and release < FIRST_ID_RULE_SINCE.release \
        else PLUS_ONE_IF_FIRST_IS_ONE


def captures_embedding(version: str) -> bool:
    """Whether upstream SGLang ``version``'s DeepSeek model can capture layer 0
    (version table; unknown or dev versions: yes, as the newest releases)."""
    release = _release(version)
    return release is None or release >= EMBEDDING_CAPTURE_SINCE.release


def rule_for_version(version: str) -> IdRule:
    """The version table's prediction for upstream SGLang ``version`` (DeepSeek model),
    for an SGLang that is not installed: never used for the installed one."""
    kind = rule_for(version)
    since = "sglang <= 0.5.12" if kind == ALWAYS_PLUS_ONE else "sglang >= 0.5.13, PR #25454"
    embedding = captures_embedding(version)
    return IdRule(
        kind, f"version table for upstream sglang {version} ({since}); a prediction, not read from code",
        EmbeddingCapture(embedding, f"version table (layer 0 since {EMBEDDING_CAPTURE_SINCE})",
                         "captures layer 0" if embedding else
                         f"cannot capture layer 0 before {EMBEDDING_CAPTURE_SINCE} (residual is None)"),
        _table_mapping(kind), False, True, (2, PROBE_LAYERS // 2, PROBE_LAYERS - 3))


def as_rule(rule: "IdRule | str") -> IdRule:
    """An :class:`IdRule` as given, or the version table's for a version string."""
    return rule if isinstance(rule, IdRule) else rule_for_version(rule)


# ------------------------------------------------------------------ prediction


@dataclass(frozen=True)
class Prediction:
    """What SGLang will capture for a list of ids.

    Attributes:
        rule: the kind of rule applied (a module constant).
        layers_to_capture: SGLang's ``layers_to_capture`` list.
        snapshots: the snapshot index each capture slot will hold, in slot
            order (SGLang captures in layer order, whatever order ids have).
        missing: layers in ``layers_to_capture`` that are never reached
            (``>= L``, or ``> L`` where the model captures the last layer's
            output, :attr:`IdRule.last_layer`): SGLang fails at the first forward
            with "captured k of K aux hidden states".
        embedding_fails: layer 0 is in ``layers_to_capture`` on an SGLang
            that cannot capture it (TypeError at the first forward).
        setup_error: SGLang's method raises for these ids (engine setup fails).
        known: the rule was known; ``False``: nothing is predicted (the suite measures).
        source: where the rule came from (:attr:`IdRule.source`).
    """

    rule: str
    layers_to_capture: tuple[int, ...]
    snapshots: tuple[int, ...]
    missing: tuple[int, ...]
    embedding_fails: bool = False
    setup_error: str | None = None
    known: bool = True
    source: str = ""

    @property
    def fails_at_first_forward(self) -> bool:
        return (self.setup_error is not None or bool(self.missing) or self.embedding_fails
                or len(set(self.layers_to_capture)) != len(self.layers_to_capture))


def predict(ids: Sequence[int] | None, num_layers: int, rule: "IdRule | str") -> Prediction:
    """Predict the snapshots SGLang captures for draft ids ``ids`` on ``num_layers`` layers.

    ``rule``: the installed SGLang's rule (``SGLangInstall.id_rule``), or a
    version string for the version table's prediction.
    """
    r = as_rule(rule)
    if not r.known:
        return Prediction(UNKNOWN, (), (), (), known=False, source=r.source)
    try:
        layers = list(r.layers_to_capture(ids, num_layers))
    except SetupFailed as exc:
        return Prediction(r.kind, (), (), (), setup_error=str(exc), source=r.source)
    top = num_layers if r.last_layer else num_layers - 1
    # Layer index L, where the model captures it, is the last layer's output
    # before the final norm: final_prenorm, snapshot L+1 (verdicts/snapshots.py).
    reached = sorted({i if i < num_layers else num_layers + 1 for i in layers if 0 <= i <= top})
    missing = tuple(i for i in layers if not 0 <= i <= top)
    embedding_fails = 0 in layers and r.embedding.capturable is False
    return Prediction(r.kind, tuple(layers), tuple(reached), missing, embedding_fails, source=r.source)
