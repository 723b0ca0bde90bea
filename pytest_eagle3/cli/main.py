"""``pytest-eagle3`` console command: answers in seconds, loads no model.

Subcommands:

* ``info``: the installed SGLang, the capture API it offers and its aux
  layer-id rule (``conventions.py``), with ``--ids`` predicting what a list of
  draft ids will capture on a ``--layers``-layer target.
* ``inspect``: a draft checkpoint's training contract against what an SGLang
  version captures for it, with a verdict and a fix (``preflight.py``).
* ``self-test``: the packaged suite run once per fault injected into the
  installed SGLang, and once clean (``selftest.py``; this one starts engines).

Exit codes: 0 success, 1 a check failed, 2 usage error (argparse) or an
environment problem (SGLang missing).  Usage errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.cli.inspect import add_inspect_parser, cmd_inspect
from pytest_eagle3.cli.selftest import add_self_test_parser, cmd_self_test


def _ids(value: str) -> list[int]:
    try:
        return [int(v) for v in value.replace("[", "").replace("]", "").replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like '0,4,6', got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pytest-eagle3",
        description="Check what SGLang feeds an EAGLE-3 draft, without starting a model.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="what the installed SGLang captures and how it reads aux layer ids")
    info.add_argument("--ids", type=_ids, help="draft aux layer ids to predict, e.g. 1,4,6")
    info.add_argument("--layers", type=int, default=None, help="target layer count L (needed with --ids)")
    info.add_argument("--cache", default=None, help="cache dir for the SGLang flag probe (default: none)")
    add_inspect_parser(sub)
    add_self_test_parser(sub)
    return parser


def cmd_info(args: argparse.Namespace) -> int:
    from pytest_eagle3.capture.api import Eagle3CaptureUnsupported, select_method
    from pytest_eagle3.verdicts.conventions import predict, rule_for
    from pytest_eagle3.engine.install import probe
    from pytest_eagle3.verdicts.snapshots import full_label

    install = probe(args.cache)
    print(install.describe())
    try:
        method = select_method(install)
    except Eagle3CaptureUnsupported as exc:
        method = f"none without a draft ({exc})"
    print(f"capture API: {method}")
    print(f"aux layer-id rule: {rule_for(install.version)}")
    if args.ids is not None:
        if args.layers is None:
            print("pytest-eagle3 info: --ids needs --layers L", file=sys.stderr)
            return 2
        p = predict(args.ids, args.layers, install.version)
        print(f"ids {args.ids} -> layers_to_capture {list(p.layers_to_capture)}")
        for slot, index in enumerate(p.snapshots):
            print(f"  slot {slot}: {full_label(index, args.layers)}")
        if p.fails_at_first_forward:
            print(f"  SGLang fails at the first forward: layers {list(p.missing)} are never reached "
                  f"or repeat (captured {len(p.snapshots)} of {len(p.layers_to_capture)})")
            return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            return cmd_info(args)
        if args.command == "inspect":
            return cmd_inspect(args)
        if args.command == "self-test":
            return cmd_self_test(args)
    except Eagle3Error as exc:
        print(f"pytest-eagle3: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
