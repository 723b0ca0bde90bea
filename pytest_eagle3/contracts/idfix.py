"""Invert SGLang's aux layer-id rule: which ids make SGLang capture given snapshots.

:func:`pytest_eagle3.conventions.predict` maps a draft config's ids to the
snapshots SGLang captures (``hs`` indices, :mod:`pytest_eagle3.verdicts.snapshots`);
:func:`ids_for` searches the few id lists that can map back to a wanted list
and keeps those that ``predict`` confirms, so a suggestion is right by
construction for the version asked about.  :func:`plan_fix` turns that into a
:class:`Fix` a person can apply, or says why no id list can work:

* SGLang's DeepSeek capture stores layer *inputs* ``hs[0] .. hs[L-1]`` only, so
  ``hs[L]`` (final norm output) and ``final_prenorm`` are never captured;
* it captures in layer order, so a contract whose slots are not in layer order
  needs ``fc``'s input blocks permuted (no id list reorders captures);
* a rule that adds 1 to every id (upstream <= 0.5.12, sglang-kt 0.7.2) never
  reaches the embedding ``hs[0]``, nor does a model that fails capturing layer 0;
* a rule that adds 1 when the first id is 1 (upstream >= 0.5.13) cannot mean
  ``hs[1]`` with ``[1]`` alone (longer lists avoid it by not *listing* the 1 first).

Every function takes the rule to apply: the installed SGLang's
(:meth:`pytest_eagle3.sglang_source.install.SGLangInstall.id_rule`, read from its
code), or a version string for the version table's prediction.

Pure Python: no torch, no SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from pytest_eagle3.contracts.contract import Contract, entry_text
from pytest_eagle3.conventions import (
    ALWAYS_PLUS_ONE,
    EMBEDDING_CAPTURE_SINCE,
    FIRST_ID_RULE_SINCE,
    IdRule,
    as_rule,
    predict,
)
from pytest_eagle3.verdicts.snapshots import describe

#: A version under the old rule and one under the new rule, to test portability.
OLD_RULE_VERSION = "0.5.12"
NEW_RULE_VERSION = str(FIRST_ID_RULE_SINCE)
#: The first version that captures the embedding (layer 0).
EMBEDDING_VERSION = str(EMBEDDING_CAPTURE_SINCE)

# Message templates (tests import these).
WRITE_IDS = "write ids {ids} under {key}"
PORTABLE_NOTE = "a list starting with 1 gets +1 on every SGLang version, so it means the same on all of them"
ONLY_NEW_NOTE = ("right where SGLang adds 1 only when the first id is 1 (upstream DeepSeek >= " + NEW_RULE_VERSION
                 + ") only: a rule adding 1 to every id (upstream DeepSeek <= " + OLD_RULE_VERSION
                 + ", most other model files) reads it otherwise")
ONLY_EMBEDDING_NOTE = ("right where SGLang's model captures layer 0 (upstream >= " + str(EMBEDDING_CAPTURE_SINCE)
                       + ") only: others add 1 to every id or fail capturing layer 0")
ONLY_OLD_NOTE = ("right where SGLang adds 1 to every id (upstream DeepSeek <= " + OLD_RULE_VERSION
                 + ", most other model files) only: upstream DeepSeek >= " + NEW_RULE_VERSION
                 + " adds 1 only when the first id is 1")
NOT_FIRST_NOTE = (
    "1 is not listed first on purpose: a list starting with 1 gets +1 on this SGLang, "
    "and SGLang captures in layer order whatever order the list has"
)
KEEP_TOP_LEVEL_NOTE = "keep the top-level " + "eagle_aux_hidden_state_layer_ids for vLLM"
UNREACHABLE_FIX = (
    "no id list works: the contract wants {wanted}, which this SGLang model's capture never reaches "
    "(it captures layer inputs only, hs[0]..hs[{last}]); retrain the draft on layers it can capture"
)
EMBEDDING_FIX = (
    "this SGLang cannot capture the embedding ({why}): no id list works on it; on an SGLang whose model "
    "captures layer 0 (upstream >= {new}), {write}; or retrain the draft on layers this one captures"
)
EMBEDDING_WHY_RULE = "its id rule adds 1 to every id, and its model fails capturing layer 0"
EMBEDDING_WHY_LAYER0 = "its model fails capturing layer 0: residual is None there"
ONE_ALONE_FIX = (
    "no id list works on this SGLang ({rule}): [1] always gets +1, so out(L0) alone cannot be captured; "
    "a rule adding 1 to every id (upstream <= {old}) captures it with ids [0]"
)
ORDER_FIX = (
    "SGLang captures in layer order, but the contract's slots are {human}, not in layer order: no id list "
    "reorders captures; permute fc.weight's input blocks (and any per-slot norm weights) so that new "
    "block j is old block perm[j], perm = {perm}, then {write}"
)
NO_IDS_FIX = "no id list makes this SGLang ({rule}) capture exactly {human}"


@dataclass(frozen=True)
class Fix:
    """A change to the draft that makes SGLang capture its contract, or why none exists.

    Attributes:
        ids: the ids to write under ``key`` (None: no id list works on this version).
        key: the config key SGLang reads the ids from.
        text: the one-line instruction (``write ids [4, 1, 6] under ...; ...``).
        portable: the ids capture the same snapshots under both SGLang rules.
        permutation: ``fc`` input blocks to reorder first (new block j = old block
            ``permutation[j]``), None when the slot order already is layer order.
    """

    ids: tuple[int, ...] | None
    key: str
    text: str
    portable: bool = False
    permutation: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids) if self.ids is not None else None,
            "key": self.key,
            "text": self.text,
            "portable": self.portable,
            "permutation": list(self.permutation) if self.permutation is not None else None,
        }


def captures(ids: Sequence[int] | None, num_layers: int, rule: IdRule | str) -> tuple[int, ...] | None:
    """Snapshots SGLang captures for ``ids`` under ``rule``; None when it fails at the
    first forward or the rule is unknown."""
    p = predict(list(ids) if ids is not None else None, num_layers, rule)
    return None if p.fails_at_first_forward or not p.known else p.snapshots


def is_portable(ids: Sequence[int], num_layers: int) -> bool:
    """True when both SGLang rules capture the same snapshots for ``ids``."""
    old = captures(ids, num_layers, OLD_RULE_VERSION)
    return old is not None and old == captures(ids, num_layers, NEW_RULE_VERSION)


def _candidates(wanted: tuple[int, ...], num_layers: int) -> list[tuple[int, ...]]:
    """Id lists worth trying for snapshots ``wanted``: their layer indices (the
    last layer's output, snapshot ``L+1``, is layer index ``L`` where a model
    captures it), one less, the first two swapped."""
    layers = tuple(num_layers if s == num_layers + 1 else s for s in wanted)
    out = [layers]
    if all(s >= 1 for s in layers):
        out.append(tuple(s - 1 for s in layers))
    if len(layers) >= 2:
        out.append((layers[1], layers[0], *layers[2:]))
    return out


def ids_for(
    wanted: Sequence[int], num_layers: int, rule: IdRule | str, *, prefer: Sequence[int] | None = None
) -> tuple[int, ...] | None:
    """Ids that make SGLang capture exactly ``wanted`` (``hs`` indices, layer order) under ``rule``.

    Among the lists that work, ``prefer`` (e.g. ids the config already has) wins,
    then a list that is right under both rules, then one in layer order.

    Returns:
        The ids, or None when no list works (see the module docstring for why).
    """
    target = tuple(wanted)
    good = [c for c in _candidates(target, num_layers) if captures(c, num_layers, rule) == target]
    if not good:
        return None
    pref = tuple(prefer) if prefer is not None else None
    return min(good, key=lambda c: (c != pref, not is_portable(c, num_layers), list(c) != sorted(c)))


def _wanted_text(indices: Sequence[int], num_layers: int) -> str:
    parts = []
    for i in indices:
        entry = "final_prenorm" if i == num_layers + 1 else i
        parts.append(f"{entry_text(entry, num_layers)} ({describe(i, num_layers)})")
    return ", ".join(parts)


def _write(ids: tuple[int, ...], key: str, num_layers: int, rule: IdRule | str, keep_top_level: bool) -> str:
    notes = []
    kind = as_rule(rule).kind
    if 1 in ids and ids[0] != 1 and kind != ALWAYS_PLUS_ONE:
        notes.append(NOT_FIRST_NOTE)
    if is_portable(ids, num_layers):
        notes.append(PORTABLE_NOTE)
    elif kind == ALWAYS_PLUS_ONE:
        notes.append(ONLY_OLD_NOTE)
    elif 0 in (predict(list(ids), num_layers, rule).layers_to_capture):
        notes.append(ONLY_EMBEDDING_NOTE)
    else:
        notes.append(ONLY_NEW_NOTE)
    if keep_top_level:
        notes.append(KEEP_TOP_LEVEL_NOTE)
    return WRITE_IDS.format(ids=list(ids), key=key) + " (" + "; ".join(notes) + ")"


def plan_fix(
    contract: Contract,
    num_layers: int,
    rule: IdRule | str,
    *,
    key: str,
    prefer: Sequence[int] | None = None,
    keep_top_level: bool = False,
) -> Fix:
    """How to make SGLang feed ``contract``'s ``fc`` slots on an ``L``-layer target under ``rule``.

    Args:
        rule: the installed SGLang's rule, or a version string (version table).
        key: the config key SGLang reads (``eagle_config.eagle_aux_hidden_state_layer_ids``).
        prefer: ids to suggest when they work (avoids rewriting a list needlessly).
        keep_top_level: the config also has a top-level list (vLLM's); say to keep it.
    """
    L = num_layers
    wanted = tuple(contract.to_snapshot_indices(L))
    # The last layer's output (final_prenorm, L+1) is reachable where the model captures it.
    last_ok = bool(as_rule(rule).last_layer)
    unreachable = [i for i in wanted if i >= L and not (last_ok and i == L + 1)]
    if unreachable:
        return Fix(None, key, UNREACHABLE_FIX.format(wanted=_wanted_text(unreachable, L), last=L - 1))
    order = tuple(sorted(wanted))
    r = as_rule(rule)
    ids = ids_for(order, L, r, prefer=prefer)
    if ids is None:
        if 0 in order and r.embedding.capturable is False:
            new_ids = ids_for(order, L, EMBEDDING_VERSION, prefer=prefer)
            write = (_write(new_ids, key, L, EMBEDDING_VERSION, keep_top_level) if new_ids is not None
                     else NO_IDS_FIX.format(rule=f"upstream {EMBEDDING_VERSION}", human=contract.human(L)))
            why = EMBEDDING_WHY_RULE if r.kind == ALWAYS_PLUS_ONE else EMBEDDING_WHY_LAYER0
            why += f", {r.embedding.source}"
            return Fix(None, key, EMBEDDING_FIX.format(why=why, new=EMBEDDING_VERSION, write=write))
        if order == (1,):
            return Fix(None, key, ONE_ALONE_FIX.format(rule=r.kind, old=OLD_RULE_VERSION))
        return Fix(None, key, NO_IDS_FIX.format(rule=r.kind, human=contract.human(L)))
    write = _write(ids, key, L, r, keep_top_level)
    portable = is_portable(ids, L)
    if order != wanted:
        perm = tuple(wanted.index(s) for s in order)
        text = ORDER_FIX.format(human=contract.human(L), perm=list(perm), write=write)
        return Fix(ids, key, text, portable, perm)
    return Fix(ids, key, write, portable)
