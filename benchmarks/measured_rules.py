"""Collect the id rule each SGLang release was *measured* to apply, from suite JSON reports.

Every ``test_capture_order`` item of the packaged suite records which snapshot
each captured slot held (``eagle3_measured_rule``, and the slot verdicts) for
the ids it configured.  This script merges those measurements, one entry per
``(sglang, num_layers, ids)``, into ``tests/data/measured_id_rules.json``, which
``tests/unit/test_measured_rules.py`` pins ``conventions.predict`` and
``pytest-eagle3 inspect`` against.

    python benchmarks/measured_rules.py .tox/sglang0509/suite-report.json report-0523.json \\
        --merge tests/data/measured_id_rules.json

Entries already in the ``--merge`` file are kept unless a report measures the
same key again (then the report wins).  Stdlib only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

_HS = re.compile(r"hs\[(\d+)\]")


def _measured_from_verdicts(test: dict) -> list[int | None] | None:
    verdicts = test.get("verdicts") or []
    if not verdicts:
        return None
    out: list[int | None] = []
    for slot in verdicts[0].get("slots") or []:
        m = _HS.fullmatch(str(slot.get("best", "")))
        out.append(int(m.group(1)) if m else None)
    return out or None


def entries_from_report(report: dict, *, source: str, num_layers: int | None = None) -> list[dict]:
    """One entry per passed or failed ``test_capture_order`` item of ``report``."""
    sglang = str((report.get("sglang") or {}).get("version") or "unknown")
    date = str((report.get("run") or {}).get("started") or datetime.date.today().isoformat())[:10]
    out = []
    for test in report.get("tests") or []:
        if "test_capture_order" not in test.get("nodeid", "") or test.get("outcome") not in ("passed", "failed"):
            continue
        props = test.get("properties") or {}
        rule = props.get("eagle3_measured_rule")
        if rule is not None:
            entry = {"sglang": str(rule["sglang"]), "num_layers": int(rule["num_layers"]), "ids": rule["ids"],
                     "measured": rule["measured"]}
            if rule.get("distribution") not in (None, "sglang"):
                entry["distribution"] = rule["distribution"]  # a fork: its number is its own
            if rule.get("rule_source"):
                entry["rule_source"] = rule["rule_source"]
        else:
            measured = _measured_from_verdicts(test)
            layers = props.get("eagle3_num_layers", num_layers)
            if measured is None or layers is None:
                continue
            entry = {"sglang": sglang, "num_layers": int(layers), "ids": props.get("eagle3_ids"),
                     "measured": measured}
        entry.update({"how": "packaged suite, test_capture_order (" + test["nodeid"].split("::")[-1] + ")",
                      "date": date, "source": source})
        out.append(entry)
    return out


def _key(entry: dict) -> tuple:
    return (entry.get("distribution", "sglang"), entry["sglang"], entry["num_layers"], json.dumps(entry["ids"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--merge", type=Path, help="existing measurements file to update in place")
    parser.add_argument("--num-layers", type=int, help="target layers, for reports older than eagle3_measured_rule")
    args = parser.parse_args(argv)
    merged: dict[tuple, dict] = {}
    if args.merge and args.merge.is_file():
        for entry in json.loads(args.merge.read_text())["measurements"]:
            merged[_key(entry)] = entry
    for path in args.reports:
        for entry in entries_from_report(json.loads(path.read_text()), source=path.name,
                                         num_layers=args.num_layers):
            merged[_key(entry)] = entry
    doc = {"about": "SGLang's aux layer-id rule as measured by the packaged suite (benchmarks/measured_rules.py)",
           "measurements": sorted(merged.values(), key=lambda e: (e["sglang"], json.dumps(e["ids"])))}
    text = json.dumps(doc, indent=1) + "\n"
    if args.merge:
        args.merge.write_text(text)
        print(f"{args.merge}: {len(merged)} measurements", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
