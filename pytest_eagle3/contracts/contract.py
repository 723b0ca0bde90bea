"""The training contract of an EAGLE-3 draft: what its ``fc`` expects, slot by slot.

A :class:`Contract` is the ordered list of residual-stream snapshots the draft's
``fc`` projection was trained on, concatenated ``[tokens, K * hidden]``.  Each
entry is an index into transformers' ``output_hidden_states`` tuple ``hs`` of the
target (:mod:`pytest_eagle3.verdicts.snapshots`): ``0`` is the embedding, ``k`` is the
output of layer ``k-1`` (= input of layer ``k``), ``L`` is the final-norm output,
and :data:`~pytest_eagle3.verdicts.snapshots.FINAL_PRENORM` names the output of the last
layer before the final norm (stored as ``L+1``).

Human one-line form (``str(contract)``, :meth:`Contract.parse`)::

    [embedding, out(L2), out(L30)]
    [out(L1), out(L3), out(L4)] + verifier: out(L7, pre-norm)

with ``embedding`` = ``hs[0]``, ``out(Lk)`` = output of layer ``k`` = ``hs[k+1]``
(layers count from 0), ``out(L{L-1}, pre-norm)`` = ``final_prenorm`` and
``final-norm`` = ``hs[L]``.  :meth:`Contract.parse` also accepts ``in(Lk)``
(= ``hs[k]``), ``hs[k]``, ``final_prenorm`` and ``final-prenorm``.

Pure Python: no torch, no SGLang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Union

from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.verdicts.snapshots import FINAL_PRENORM, full_label, prenorm_index

#: One contract entry: an ``hs`` index, or :data:`FINAL_PRENORM`.
Entry = Union[int, str]

# Message templates (tests import these).
EMPTY_MSG = "a contract needs at least one entry; got none"
BAD_ENTRY_MSG = "contract entry {entry!r} is not an hs index (int >= 0) or {prenorm!r}"
DUPLICATE_MSG = "contract lists {label} twice ({entries}); each fc slot must be a different snapshot"
OUT_OF_RANGE_MSG = (
    "contract entry hs[{index}] is outside hs[0]..hs[{num_layers}] of a target with {num_layers} layers"
)
NEEDS_LAYERS_MSG = "{what} needs the target's number of layers; pass num_layers"
LAYERS_DIFFER_MSG = "contract was made for {have} layers, not {want}"
NO_HIDDEN_MSG = "contract has no hidden_size, so its fc input width is unknown"
BAD_HIDDEN_MSG = "hidden_size must be a positive int, got {value!r}"
BAD_LAYERS_MSG = "num_layers must be a positive int, got {value!r}"
PARSE_MSG = (
    "cannot parse contract {text!r}: {why}; write e.g. "
    "'[embedding, out(L2), out(L30)]' or '[out(L1), out(L3)] + verifier: out(L7, pre-norm)'"
)
AMBIGUOUS_LAST_MSG = (
    "L{k} is the last layer of a target with {num_layers} layers: write 'out(L{k}, pre-norm)' "
    "for its output before the final norm or 'final-norm' for hs[{num_layers}]"
)

_OUT = re.compile(r"^out\(\s*L(\d+)\s*(,\s*pre-?norm\s*)?\)$", re.IGNORECASE)
_IN = re.compile(r"^in\(\s*L(\d+)\s*\)$", re.IGNORECASE)
_HS = re.compile(r"^hs\[\s*(\d+)\s*\]$", re.IGNORECASE)
_VERIFIER = re.compile(r"\+\s*verifier\s*:", re.IGNORECASE)


def _check_entry(entry: object) -> Entry:
    if entry == FINAL_PRENORM:
        return FINAL_PRENORM
    if isinstance(entry, bool) or not isinstance(entry, int) or entry < 0:
        raise Eagle3ContractError(BAD_ENTRY_MSG.format(entry=entry, prenorm=FINAL_PRENORM))
    return entry


def _check_positive(value: object, template: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise Eagle3ContractError(template.format(value=value))


def entry_index(entry: Entry, num_layers: int) -> int:
    """Storage index of one entry in a ``[L+2, tokens, hidden]`` snapshot stack.

    Raises:
        Eagle3ContractError: an int entry above ``L``.
    """
    if entry == FINAL_PRENORM:
        return prenorm_index(num_layers)
    assert isinstance(entry, int)
    if entry > num_layers:
        raise Eagle3ContractError(OUT_OF_RANGE_MSG.format(index=entry, num_layers=num_layers))
    return entry


def entry_text(entry: Entry, num_layers: int | None = None) -> str:
    """Human form of one entry: ``embedding``, ``out(L3)``, ``final-norm``, ``out(L7, pre-norm)``."""
    if entry == FINAL_PRENORM:
        return "final-prenorm" if num_layers is None else f"out(L{num_layers - 1}, pre-norm)"
    assert isinstance(entry, int)
    if entry == 0:
        return "embedding"
    if num_layers is not None and entry == num_layers:
        return "final-norm"
    return f"out(L{entry - 1})"


def _parse_token(token: str, num_layers: int | None) -> tuple[Entry, int | None]:
    """One human-form token -> (entry, num_layers implied by it or None)."""
    t = token.strip()
    low = t.lower()
    if low == "embedding":
        return 0, None
    if low in ("final-prenorm", "final_prenorm"):
        return FINAL_PRENORM, None
    if low in ("final-norm", "final_norm"):
        if num_layers is None:
            raise ValueError("'final-norm' is hs[L]; pass num_layers to parse it")
        return num_layers, None
    m = _OUT.match(t)
    if m:
        k = int(m.group(1))
        if m.group(2):
            if num_layers is not None and k != num_layers - 1:
                raise ValueError(
                    f"'out(L{k}, pre-norm)' names the last layer, but the last of {num_layers} layers "
                    f"is L{num_layers - 1}"
                )
            return FINAL_PRENORM, k + 1
        if num_layers is not None and k + 1 == num_layers:
            raise ValueError(AMBIGUOUS_LAST_MSG.format(k=k, num_layers=num_layers))
        return k + 1, None
    m = _IN.match(t) or _HS.match(t)
    if m:
        return int(m.group(1)), None
    raise ValueError(f"unknown entry {t!r}")


def _parse_list(text: str, num_layers: int | None) -> tuple[list[Entry], int | None]:
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError("expected a bracketed list")
    inner = body[1:-1].strip()
    if not inner:
        raise ValueError("the list is empty")
    # Split on commas outside parentheses ("out(L7, pre-norm)" holds one).
    tokens, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            tokens.append(inner[start:i])
            start = i + 1
    tokens.append(inner[start:])
    entries: list[Entry] = []
    implied = None
    for token in tokens:
        entry, layers = _parse_token(token, num_layers)
        entries.append(entry)
        implied = layers if layers is not None else implied
    return entries, implied


@dataclass(frozen=True)
class Contract:
    """What a draft's ``fc`` was trained on.

    Attributes:
        entries: the ``fc`` input slots in order, each an ``hs`` index (int) or
            :data:`FINAL_PRENORM`; slot ``j`` is columns ``j*H .. (j+1)*H`` of fc's input.
        hidden_size: the target hidden size ``H`` each slot holds (None: unknown).
        num_layers: the target's number of layers ``L`` (None: not resolved yet).
        dtype: the dtype the hidden states were captured in, if known (``"bfloat16"``).
        stack: the translator that produced it (a :data:`~pytest_eagle3.contracts.STACKS` key).
        source: where it came from, e.g. ``"/drafts/x (eagle_config ids [1, 3, 4])"``.
        verifier_last: speculators only: the snapshot passed to the draft as the
            verifier's last hidden state (not an ``fc`` input), or None.
        declared_ids: the ids the draft config declares, verbatim (None: it declares none,
            so a server uses its own default).
        notes: caveats a person should read with the verdict (stack-version facts).

    Raises:
        Eagle3ContractError: no entries, a bad entry, a duplicate, an index above
            ``L`` when ``num_layers`` is known, a non-positive size.
    """

    entries: tuple[Entry, ...]
    hidden_size: int | None = None
    num_layers: int | None = None
    dtype: str | None = None
    stack: str = "raw"
    source: str = ""
    verifier_last: Entry | None = None
    declared_ids: tuple[int, ...] | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        entries = tuple(_check_entry(e) for e in self.entries)
        if not entries:
            raise Eagle3ContractError(EMPTY_MSG)
        object.__setattr__(self, "entries", entries)
        if self.verifier_last is not None:
            object.__setattr__(self, "verifier_last", _check_entry(self.verifier_last))
        if self.declared_ids is not None:
            object.__setattr__(self, "declared_ids", tuple(self.declared_ids))
        object.__setattr__(self, "notes", tuple(self.notes))
        _check_positive(self.hidden_size, BAD_HIDDEN_MSG)
        _check_positive(self.num_layers, BAD_LAYERS_MSG)
        seen: dict[Entry, int] = {}
        for e in entries:
            seen[e] = seen.get(e, 0) + 1
        for e, n in seen.items():
            if n > 1:
                raise Eagle3ContractError(
                    DUPLICATE_MSG.format(label=entry_text(e, self.num_layers), entries=self.human())
                )
        if self.num_layers is not None:
            for e in entries + ((self.verifier_last,) if self.verifier_last is not None else ()):
                entry_index(e, self.num_layers)

    # -- human form -----------------------------------------------------------------

    def human(self, num_layers: int | None = None) -> str:
        """One-line form, e.g. ``[embedding, out(L2), out(L30)]``."""
        layers = num_layers if num_layers is not None else self.num_layers
        text = "[" + ", ".join(entry_text(e, layers) for e in self.entries) + "]"
        if self.verifier_last is not None:
            text += " + verifier: " + entry_text(self.verifier_last, layers)
        return text

    def __str__(self) -> str:
        return self.human()

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        num_layers: int | None = None,
        hidden_size: int | None = None,
        dtype: str | None = None,
        stack: str = "raw",
        source: str = "",
    ) -> Contract:
        """Parse the one-line human form; ``str(Contract.parse(s, ...)) == s`` for canonical ``s``.

        ``out(Lk, pre-norm)`` implies ``num_layers = k + 1`` when none is given.

        Raises:
            Eagle3ContractError: text that is not a contract (message shows the form).
        """
        try:
            parts = _VERIFIER.split(text)
            if len(parts) > 2:
                raise ValueError("more than one '+ verifier:' part")
            entries, implied = _parse_list(parts[0], num_layers)
            verifier: Entry | None = None
            if len(parts) == 2:
                verifier, v_implied = _parse_token(parts[1], num_layers)
                implied = v_implied if v_implied is not None else implied
        except ValueError as exc:
            raise Eagle3ContractError(PARSE_MSG.format(text=text, why=exc)) from None
        layers = num_layers if num_layers is not None else implied
        return cls(
            entries=tuple(entries),
            hidden_size=hidden_size,
            num_layers=layers,
            dtype=dtype,
            stack=stack,
            source=source or f"parsed from {text!r}",
            verifier_last=verifier,
        )

    # -- widths and indices ----------------------------------------------------------

    @property
    def k(self) -> int:
        """Number of ``fc`` input slots."""
        return len(self.entries)

    @property
    def fc_input_width(self) -> int:
        """``len(entries) * hidden_size``: the in-features of the draft's ``fc``.

        Raises:
            Eagle3ContractError: ``hidden_size`` is unknown.
        """
        if self.hidden_size is None:
            raise Eagle3ContractError(NO_HIDDEN_MSG)
        return len(self.entries) * self.hidden_size

    @property
    def declares_ids(self) -> bool:
        """False when the draft config names no layers, so a server falls back to its default."""
        return self.declared_ids is not None

    def _layers(self, num_layers: int | None, what: str) -> int:
        if num_layers is None:
            if self.num_layers is None:
                raise Eagle3ContractError(NEEDS_LAYERS_MSG.format(what=what))
            return self.num_layers
        if self.num_layers is not None and num_layers != self.num_layers:
            raise Eagle3ContractError(LAYERS_DIFFER_MSG.format(have=self.num_layers, want=num_layers))
        return num_layers

    def to_snapshot_indices(self, num_layers: int | None = None) -> list[int]:
        """The entries as storage indices of a ``[L+2, tokens, hidden]`` snapshot stack.

        ``hs[k]`` -> ``k``; :data:`FINAL_PRENORM` -> ``L + 1`` (:func:`snapshots.prenorm_index`).

        Raises:
            Eagle3ContractError: ``num_layers`` unknown, different from the contract's,
                or an entry above ``L``.
        """
        layers = self._layers(num_layers, "to_snapshot_indices")
        return [entry_index(e, layers) for e in self.entries]

    def verifier_snapshot_index(self, num_layers: int | None = None) -> int | None:
        """Storage index of :attr:`verifier_last`, or None when there is none."""
        if self.verifier_last is None:
            return None
        return entry_index(self.verifier_last, self._layers(num_layers, "verifier_snapshot_index"))

    def labels(self, num_layers: int | None = None) -> list[str]:
        """``["hs[2] (input of layer 2)", ...]``, one per slot, in snapshots.py terms."""
        layers = self._layers(num_layers, "labels")
        return [full_label(i, layers) for i in self.to_snapshot_indices(layers)]

    def with_num_layers(self, num_layers: int) -> Contract:
        """The same contract resolved against an ``L``-layer target (validates the range)."""
        self._layers(num_layers, "with_num_layers")
        return replace(self, num_layers=num_layers)

    def same_slots(self, other: Contract, num_layers: int | None = None) -> bool:
        """True when both feed ``fc`` the same snapshots in the same order."""
        layers = num_layers if num_layers is not None else (self.num_layers or other.num_layers)
        return self.to_snapshot_indices(layers) == other.to_snapshot_indices(layers)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (stable names) for reports."""
        return {
            "human": self.human(),
            "entries": list(self.entries),
            "snapshot_indices": self.to_snapshot_indices() if self.num_layers is not None else None,
            "hidden_size": self.hidden_size,
            "fc_input_width": self.fc_input_width if self.hidden_size is not None else None,
            "num_layers": self.num_layers,
            "dtype": self.dtype,
            "stack": self.stack,
            "source": self.source,
            "verifier_last": self.verifier_last,
            "declared_ids": list(self.declared_ids) if self.declared_ids is not None else None,
            "notes": list(self.notes),
        }

