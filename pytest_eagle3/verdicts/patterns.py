"""Diagnoses across slots: clean snapshots in the wrong arrangement.

When every captured slot holds some clean snapshot ``hs[i]`` but not the
expected one, the arrangement names the bug: every slot one layer late / early
(``[offset-twice]`` / ``[offset-missing]``), SGLang's default layer list
whatever was configured (``[ids-ignored]``), the expected snapshots in reverse
or another order (``[reversed-order]`` / ``[permuted-order]``), several slots
holding one snapshot at or past the deepest expected one
(``[aliased-capture]``: storage a later in-place norm rewrote).
:func:`pytest_eagle3.verdicts.diagnose.diagnose_slots` prints these lines before
the per-slot ones.  Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_eagle3.verdicts.snapshots import label

OFFSET_LATE = (
    "every slot holds the snapshot one layer after the expected one ({pairs}): SGLang added 1 to "
    "the ids where the expectation did not (set_eagle3_layers_to_capture, in the target's model file; "
    "PR #25454 changed when upstream DeepSeek adds it)"
)
OFFSET_EARLY = (
    "every slot holds the snapshot one layer before the expected one ({pairs}): SGLang did not add 1 "
    "to the ids where the expectation did (set_eagle3_layers_to_capture, in the target's model file; "
    "PR #25454 changed when upstream DeepSeek adds it)"
)
IDS_IGNORED = (
    "the slots hold SGLang's default layers [2, L//2, L-3] = {default}, not the configured ones "
    "({expected}): the configured ids were ignored (SGLang PR #22836, vLLM PR #50170)"
)
ALIASED = (
    "slots {slots} all hold {got}, a snapshot at or past the deepest expected one ({expected}): the captures "
    "kept the storage of the residual tensor instead of a copy, and the later layers' in-place norms "
    "(fused_add_rmsnorm overwrites the residual) rewrote it (SGLang PR #39286, issue #27540)"
)
REVERSED = "the slots hold the expected snapshots in reverse order ({got}): the captures were concatenated in reverse"
PERMUTED = "the slots hold the expected snapshots in another order ({got}): the captures were concatenated out of order"


def _pairs(got: Sequence[int], want: Sequence[int], L: int) -> str:
    return ", ".join(f"{label(g, L)} for {label(w, L)}" for g, w in zip(got, want))


def default_layers(num_layers: int) -> list[int]:
    """SGLang's default ``layers_to_capture`` without ids (``DeepseekV2ForCausalLM.
    set_eagle3_layers_to_capture``, 0.5.23): inputs of layers ``[2, L//2, L-3]`` = those ``hs``."""
    return [2, num_layers // 2, num_layers - 3]


def pattern_lines(best: Sequence[int | None], expected: Sequence[int], num_layers: int) -> list[tuple[str, str]]:
    """``(kind, line)`` for a wrong arrangement of otherwise clean snapshots.

    ``best[s]``: the snapshot slot ``s`` holds cleanly (``None``: none).
    """
    L = num_layers
    if any(b is None for b in best) or len(best) != len(expected) or list(best) == list(expected):
        return []
    got = [int(b) for b in best]  # type: ignore[arg-type]
    want = [int(e) for e in expected]
    shown = "[" + ", ".join(label(g, L) for g in got) + "]"
    if sorted(got) == sorted(want):
        if got == want[::-1]:
            return [("reversed-order", REVERSED.format(got=shown))]
        return [("permuted-order", PERMUTED.format(got=shown))]
    default = default_layers(L)
    if got == default and want != default:
        return [("ids-ignored", IDS_IGNORED.format(
            default="[" + ", ".join(label(d, L) for d in default) + "]",
            expected="[" + ", ".join(label(w, L) for w in want) + "]"))]
    repeated = [g for g in dict.fromkeys(got) if got.count(g) > 1 and g >= max(want)]
    if repeated:
        g = repeated[0]
        return [("aliased-capture", ALIASED.format(
            slots=", ".join(str(s) for s, b in enumerate(got) if b == g), got=label(g, L),
            expected=label(max(want), L)))]
    if all(g - w == 1 for g, w in zip(got, want)):
        return [("offset-twice", OFFSET_LATE.format(pairs=_pairs(got, want, L)))]
    if all(g - w == -1 for g, w in zip(got, want)):
        return [("offset-missing", OFFSET_EARLY.format(pairs=_pairs(got, want, L)))]
    return []
