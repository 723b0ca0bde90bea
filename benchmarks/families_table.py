"""Print docs/families.md's measured table from the suite's JSON reports.

Usage::

    pytest --pyargs pytest_eagle3.suite --eagle3-target families --tp 2 --eagle3-report out/report.json
    python benchmarks/families_table.py out/report-tiny-*.json

Per family (one report each): the id rule and its source, what each id list's
engine captured (``test_capture_order``: the measured snapshot per slot, or
what the failure says the slots hold), the shipped draft's accept length / rate
at each TP size, the suite's outcome and wall time.  Reads only the reports.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_CASE = re.compile(r"\[tp(\d+)-(.+)\]$")
_HOLDS = re.compile(r"slot (\d+) holds (.+?) \(rel\.err")


def _label(index: int | None, num_layers: int) -> str:
    if index is None:
        return "?"
    return "final_prenorm" if index == num_layers + 1 else f"hs[{index}]"


def family_row(report: dict) -> dict:
    run = report.get("run", {})
    target = run.get("target") or "?"
    tests = report.get("tests", [])
    rule, cases, accept = "", {}, {}
    for t in tests:
        props = t.get("properties") or {}
        m = _CASE.search(t["nodeid"])
        if not m:
            continue
        tp, case = int(m.group(1)), m.group(2)
        if "test_capture_order" in t["nodeid"] and tp == 1:
            rule = rule or (props.get("eagle3_rule") or {}).get("kind", "") + " (" + \
                (props.get("eagle3_rule") or {}).get("source", "") + ")"
            measured = props.get("eagle3_measured_rule") or {}
            ids = measured.get("ids")
            L = measured.get("num_layers", 8)
            got = measured.get("measured") or []
            if got and all(g is not None for g in got):
                text = ", ".join(_label(g, L) for g in got)
            else:
                holds = _HOLDS.findall(t.get("message") or "")
                text = "; ".join(f"slot {s}: {what}" for s, what in holds) or f"failed: {(t.get('message') or '')[:80]}"
            cases[case] = (ids, text)
        if "test_draft_acceptance_meets_the_gate" in t["nodeid"]:
            length, rate = props.get("eagle3_accept_length"), props.get("eagle3_accept_rate")
            accept[tp] = (length, rate, t["outcome"])
    outcomes = {}
    for t in tests:
        outcomes[t["outcome"]] = outcomes.get(t["outcome"], 0) + 1
    return {"target": target, "rule": rule, "cases": cases, "accept": accept, "outcomes": outcomes,
            "seconds": run.get("duration_s")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    args = ap.parse_args(argv)
    rows = [family_row(json.loads(p.read_text())) for p in args.reports]
    for r in rows:
        print(f"## {r['target']}: {r['rule']}")
        for case, (ids, text) in sorted(r["cases"].items()):
            print(f"  {case} ids {ids}: {text}")
        for tp, (length, rate, outcome) in sorted(r["accept"].items()):
            print(f"  acceptance TP {tp}: {length} / {rate} ({outcome})")
        print(f"  outcomes {r['outcomes']}, {r['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
