"""Which forwards a confined fault runs in (worker side).

A confined kind of :data:`pytest_eagle3.worker.faults.CONFINED` is a layer
fault with options that pick its forwards:

* ``when``: ``cache-hit`` (an extend forward of a request whose first prefill
  reused a cached prefix), ``later-chunk`` (a request's second or later extend
  forward), ``decode-verify`` (decode and target-verify forwards);
* ``after``: only once this process has run that many
  ``DeepseekV2Model.forward`` calls (state that goes wrong over an engine's life).

Decided from the forward batch and the process's own count alone, so every TP
rank decides alike (a fault's collectives then run on all ranks or on none).
"""

from __future__ import annotations

from typing import Any

_EXTENDS: dict[str, int] = {}  # rid -> extend forwards seen
_FORWARDS = [0]  # DeepseekV2Model.forward calls of this process


def forward_matches(fault: dict[str, Any], forward_batch: Any) -> bool:
    """Whether this forward is one the fault is confined to (no ``when`` and no
    ``after``: every forward).  Call once per model forward."""
    _FORWARDS[0] += 1
    after = fault.get("after")
    if after is not None and _FORWARDS[0] <= int(after):
        return False
    when = fault.get("when")
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None:
        return when is None
    if when is None:
        return True
    if when == "decode-verify":
        return bool(mode.is_decode() or mode.is_target_verify())
    if not mode.is_extend() or mode.is_target_verify():
        return False
    rids = [str(r) for r in (getattr(forward_batch, "rids", None) or [])]
    prefixes = list(getattr(forward_batch, "extend_prefix_lens_cpu", None) or [0] * len(rids))
    hit = False
    for rid, prefix in zip(rids, prefixes):
        seen = _EXTENDS.get(rid, 0)
        _EXTENDS[rid] = seen + 1
        if when == "cache-hit" and seen == 0 and int(prefix) > 0:
            hit = True
        if when == "later-chunk" and seen >= 1:
            hit = True
    if len(_EXTENDS) > 10000:
        _EXTENDS.clear()
    return hit
