"""Why a server will not read a draft's ids: ids only at the top level of its config, or only in a
SpecForge provenance record, diagnosed from the installed files that read the keys."""

from __future__ import annotations

from pathlib import Path

from pytest_eagle3.contracts.draft import EAGLE_CONFIG_KEY, PROVENANCE_IDS_KEY, TOP_LEVEL_KEY, DraftInfo
from pytest_eagle3.sglang_source.id_keys import KeyReads, draft_reads, target_reads

# Message templates (tests import these).
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

