"""Which forwards a confined fault runs in (worker side).

A confined kind of :data:`pytest_eagle3.worker.faults.CONFINED` is a layer
fault with options that pick its forwards:

* ``when``: one forward mode or a list of them, as the run-level diagnosis
  names modes (:data:`WHEN`): ``prefill`` (an extend forward holding a request's
  first extend with no cached prefix: its whole prompt, or its first chunk under
  chunked prefill), ``later-chunk`` (a request's second or later extend forward),
  ``cache-hit`` (the first extend of a request whose prefix the radix cache held),
  ``decode``, ``verify`` (target-verify forwards), ``decode-verify`` (both);
* ``after``: only once this process has run that many
  ``DeepseekV2Model.forward`` calls (state that goes wrong over an engine's life).

Decided from the forward batch and the process's own count alone, so every TP
rank decides alike (a fault's collectives then run on all ranks or on none).
A forward whose requests are in several modes (a mixed extend batch) matches when
any of them is wanted.
"""

from __future__ import annotations

from typing import Any

#: The values ``when`` takes.
WHEN = ("prefill", "later-chunk", "cache-hit", "decode", "verify", "decode-verify")

_EXTENDS: dict[str, int] = {}  # rid -> extend forwards seen
_FORWARDS = [0]  # DeepseekV2Model.forward calls of this process


def wanted_modes(fault: dict[str, Any]) -> frozenset[str] | None:
    """The modes ``fault["when"]`` names (``None``: every forward).

    Raises:
        ValueError: a value outside :data:`WHEN`.
    """
    when = fault.get("when")
    if when is None:
        return None
    values = [when] if isinstance(when, str) else list(when)
    bad = [v for v in values if v not in WHEN]
    if bad:
        raise ValueError(f"when={bad[0]!r}: expected one of {', '.join(WHEN)} (or a list of them)")
    return frozenset(m for v in values for m in (("decode", "verify") if v == "decode-verify" else (v,)))


def forward_modes(forward_batch: Any) -> frozenset[str]:
    """The modes of this forward's requests (:data:`WHEN`, without ``decode-verify``);
    counts each request's extend forwards, so call once per model forward."""
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None:
        return frozenset()
    if mode.is_target_verify():
        return frozenset({"verify"})
    if mode.is_decode():
        return frozenset({"decode"})
    if not mode.is_extend():
        return frozenset()
    rids = [str(r) for r in (getattr(forward_batch, "rids", None) or [])]
    prefixes = list(getattr(forward_batch, "extend_prefix_lens_cpu", None) or [0] * len(rids))
    modes = set()
    for rid, prefix in zip(rids, prefixes):
        seen = _EXTENDS.get(rid, 0)
        _EXTENDS[rid] = seen + 1
        modes.add("later-chunk" if seen else "cache-hit" if int(prefix) > 0 else "prefill")
    if len(_EXTENDS) > 10000:
        _EXTENDS.clear()
    return frozenset(modes)


def forward_matches(fault: dict[str, Any], forward_batch: Any) -> bool:
    """Whether this forward is one the fault is confined to (no ``when`` and no
    ``after``: every forward).  Call once per model forward."""
    _FORWARDS[0] += 1
    modes = forward_modes(forward_batch)
    after = fault.get("after")
    if after is not None and _FORWARDS[0] <= int(after):
        return False
    wanted = wanted_modes(fault)
    if wanted is None:
        return True
    return bool(modes & wanted)
