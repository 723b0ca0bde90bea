"""The result of ``pytest-eagle3 inspect`` (:func:`pytest_eagle3.cli.preflight.inspect_draft`):
its verdicts and exit codes, slot by slot, as aligned lines for people and stable JSON for machines."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_eagle3.contracts.contract import Contract, entry_text
from pytest_eagle3.contracts.draft import EAGLE_CONFIG_KEY, PROVENANCE_IDS_KEY, DraftInfo
from pytest_eagle3.contracts.idfix import Fix
from pytest_eagle3.contracts.servers import ServerRead
from pytest_eagle3.conventions import IdRule, Prediction

#: The verdicts (:mod:`pytest_eagle3.cli.preflight` says what each means) and their exit codes.
MATCH, MISMATCH, FAILS, INVALID, UNKNOWN_VERDICT = "match", "mismatch", "fails", "invalid", "unknown"
EXIT_CODES = {MATCH: 0, MISMATCH: 1, FAILS: 1, INVALID: 1, UNKNOWN_VERDICT: 1}


@dataclass(frozen=True)
class Slot:
    """One ``fc`` input slot: the snapshot SGLang puts there and the one the contract wants.

    ``sglang``/``contract`` are ``hs`` indices (``L+1`` = final_prenorm), None for no slot.
    """

    index: int
    sglang: int | None
    contract: int | None

    @property
    def ok(self) -> bool:
        return self.sglang == self.contract


def _text(index: int | None, num_layers: int) -> str:
    if index is None:
        return "nothing"
    return entry_text("final_prenorm" if index == num_layers + 1 else index, num_layers)


@dataclass(frozen=True)
class Inspection:
    """What :func:`~pytest_eagle3.cli.preflight.inspect_draft` found; :meth:`lines` for people, :meth:`to_dict` for machines."""

    draft: DraftInfo
    stack: str
    stack_source: str
    num_layers: int
    target: str
    contract: Contract | None
    contract_error: str | None
    sglang_version: str
    sglang_source: str
    ids_read: tuple[int, ...] | None
    prediction: Prediction
    verdict: str
    reason: str
    by_default: bool = False
    slots: tuple[Slot, ...] = ()
    fix: Fix | None = None
    recheck: str | None = None
    notes: tuple[str, ...] = field(default=())
    rule: IdRule | None = None
    vllm: tuple[ServerRead, ...] = ()

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def captures_text(self) -> str:
        return "[" + ", ".join(_text(i, self.num_layers) for i in self.prediction.snapshots) + "]"

    def lines(self) -> list[str]:
        """The aligned human report (no trailing newline)."""
        L, d = self.num_layers, self.draft
        ids = f"{_key_name(d.ids_key)} ids {list(d.ids)}" if d.ids is not None else "no ids"
        fc = "fc not read"
        if d.fc_input_width is not None:
            h = d.target_hidden_size
            fc = f"fc {d.fc_input_width}" + (f" = {d.fc_input_width // h} x {h}" if h and d.fc_input_width % h == 0
                                             else "")
        stack = f"stack {self.stack}" + (f" from {self.stack_source}" if self.stack_source != "--stack" else "")
        out = [f"draft:     {d.path} ({stack}, {ids}, {fc})", f"target:    {self.target}"]
        out.append(f"contract:  {self.contract.human(L)}" if self.contract is not None
                   else f"contract:  none: {self.contract_error}")
        p = self.prediction
        read = f"ids {list(self.ids_read)}" if self.ids_read is not None else "no ids (default [2, L//2, L-3])"
        rule = self.rule.describe() if self.rule is not None else p.rule
        out.append(f"sglang:    {self.sglang_version} ({self.sglang_source})")
        out.append(f"rule:      {rule}")
        out.append(f"reads:     {read} -> layers_to_capture {list(p.layers_to_capture)}")
        out.append(f"captures:  {self.captures_text()}")
        for r in self.vllm:
            out.append(f"vllm:      {r.describe(lambda i: _text(i, L))}")
        label = self.verdict.upper() + (" (by SGLang's default)" if self.by_default else "")
        out.append(f"verdict:   {label}: {self.reason}")
        for s in self.slots:
            if not s.ok:
                out.append(f"  slot {s.index}: sglang captures {_text(s.sglang, L)}; "
                           f"the contract says {_text(s.contract, L)}")
        if self.fix is not None:
            out.append(f"fix:       {self.fix.text}")
        if self.recheck is not None:
            out.append(f"recheck:   {self.recheck}")
        out.extend(f"note:      {n}" for n in self.notes)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON fields (see ``pytest-eagle3 inspect --help``)."""
        d, p, L = self.draft, self.prediction, self.num_layers
        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "by_default": self.by_default,
            "draft": {
                "path": str(d.path), "config_format": d.config_format, "ids": _list(d.ids),
                "ids_key": d.ids_key, "target_hidden_size": d.target_hidden_size,
                "fc_shape": _list(d.fc_shape), "fc_input_width": d.fc_input_width,
            },
            "stack": self.stack,
            "stack_source": self.stack_source,
            "target": {"description": self.target, "num_layers": L},
            "contract": self.contract.to_dict() if self.contract is not None else None,
            "contract_error": self.contract_error,
            "sglang": {
                "version": self.sglang_version, "source": self.sglang_source, "rule": p.rule,
                "rule_source": self.rule.source if self.rule is not None else p.source,
                "rule_from_code": bool(self.rule is not None and self.rule.from_code),
                "ids_read": _list(self.ids_read), "layers_to_capture": list(p.layers_to_capture),
                "never_reached": list(p.missing), "fails_at_first_forward": p.fails_at_first_forward,
                "captures": list(p.snapshots), "captures_human": self.captures_text(),
            },
            "slots": [{"slot": s.index, "sglang": s.sglang, "contract": s.contract, "ok": s.ok,
                       "sglang_human": _text(s.sglang, L), "contract_human": _text(s.contract, L)}
                      for s in self.slots],
            "fix": self.fix.to_dict() if self.fix is not None else None,
            "recheck": self.recheck,
            "notes": list(self.notes),
            "vllm": [{"server": r.server, "key": r.key, "ids": list(r.ids), "captures": list(r.snapshots),
                      "fails": r.fails, "source": r.source, "note": r.note} for r in self.vllm],
        }


JSON_KEYS = ("verdict", "exit_code", "reason", "by_default", "draft", "stack", "stack_source", "target",
             "contract", "contract_error", "sglang", "slots", "fix", "recheck", "notes", "vllm")


def unreadable_dict(path: str | Path, reason: str) -> dict[str, Any]:
    """:meth:`Inspection.to_dict`'s keys for a draft :func:`~pytest_eagle3.contracts.draft.load_draft` rejected (nothing else known)."""
    out: dict[str, Any] = dict.fromkeys(JSON_KEYS)
    out.update(verdict=INVALID, exit_code=EXIT_CODES[INVALID], reason=reason, by_default=False,
               draft={"path": str(path)}, contract_error=reason, slots=[], notes=[], vllm=[])
    return out


def _list(values: Any) -> list[Any] | None:
    return list(values) if values is not None else None


def _key_name(key: str | None) -> str:
    if key == PROVENANCE_IDS_KEY:
        return "SpecForge provenance"
    return "eagle_config" if key == EAGLE_CONFIG_KEY else "top-level"

