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
any of them is wanted, and the fault writes only the rows of the wanted requests
(:func:`forward_selection`), so a later chunk batched with another request's
prefill stays right under a ``prefill`` fault.
"""

from __future__ import annotations

from typing import Any, NamedTuple

#: The values ``when`` takes.
WHEN = ("prefill", "later-chunk", "cache-hit", "decode", "verify", "decode-verify")


class Rows(NamedTuple):
    """The rows a fault writes in a mixed extend batch: ``ranges`` of ``(start,
    stop)`` rows of the wanted requests, out of the forward's ``total`` tokens."""

    ranges: tuple[tuple[int, int], ...]
    total: int


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


def _request_modes(forward_batch: Any) -> list[tuple[str, int | None]]:
    """``(mode, rows)`` of each request of this forward, in row order (``rows``:
    its extend tokens, ``None`` outside extend forwards, whose requests share one
    mode); counts each request's extend forwards."""
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None:
        return []
    if mode.is_target_verify():
        return [("verify", None)]
    if mode.is_decode():
        return [("decode", None)]
    if not mode.is_extend():
        return []
    rids = [str(r) for r in (getattr(forward_batch, "rids", None) or [])]
    prefixes = list(getattr(forward_batch, "extend_prefix_lens_cpu", None) or [0] * len(rids))
    lens = list(getattr(forward_batch, "extend_seq_lens_cpu", None) or ())
    if len(lens) != len(rids):  # no per-request lengths to trust: the fault writes every row
        lens = [None] * len(rids)
    out: list[tuple[str, int | None]] = []
    for rid, prefix, rows in zip(rids, prefixes, lens):
        seen = _EXTENDS.get(rid, 0)
        _EXTENDS[rid] = seen + 1
        out.append(("later-chunk" if seen else "cache-hit" if int(prefix) > 0 else "prefill",
                    None if rows is None else int(rows)))
    if len(_EXTENDS) > 10000:
        _EXTENDS.clear()
    return out


def forward_selection(fault: dict[str, Any], forward_batch: Any) -> tuple[bool, Rows | None]:
    """``(matches, rows)``: whether the fault runs in this forward, and in an extend
    batch whose requests are in several modes the rows of the requests in wanted
    modes (``None``: every row).  No ``when`` and no ``after``: every forward, every
    row.  Call once per model forward: it counts the forwards and each request's
    extends."""
    _FORWARDS[0] += 1
    requests = _request_modes(forward_batch)
    after = fault.get("after")
    if after is not None and _FORWARDS[0] <= int(after):
        return False, None
    wanted = wanted_modes(fault)
    if wanted is None:
        return True, None
    hits = [mode in wanted for mode, _rows in requests]
    if not any(hits):
        return False, None
    if all(hits) or any(rows is None for _mode, rows in requests):
        return True, None
    ranges, start = [], 0
    for hit, (_mode, rows) in zip(hits, requests):
        if hit:
            ranges.append((start, start + int(rows)))
        start += int(rows)
    return True, Rows(tuple(ranges), start)
