"""``pytest-eagle3`` console command: answers in seconds, loads no model.

Subcommands:

* ``info``: the installed SGLang, the capture API it offers, its aux
  layer-id rule and whether layer 0 can be captured, read from the model file
  of ``--architecture`` (``sglang_source/model_code.py``), with ``--ids`` predicting
  what a list of draft ids will capture on a ``--layers``-layer target; what it
  does with pipeline parallelism (``sglang_source/pp_code.py``), and with
  ``--pp N`` SGLang's own layer split and the stage of each layer to capture;
  with ``--families``, every model file that captures for EAGLE-3 and whether
  the suite runs it, or why not (``target/family_coverage.py``).
* ``inspect``: a draft checkpoint's training contract against what an SGLang
  version captures for it, with a verdict and a fix (``preflight.py``).
* ``stacks``: the facts the training-stack contracts rely on, read from
  vLLM's, speculators' and SpecForge's own files (``stacks.py``).
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
from pytest_eagle3.cli.stacks import add_stacks_parser, cmd_stacks
from pytest_eagle3.capture.api import Eagle3CaptureUnsupported, select_method
from pytest_eagle3.conventions import predict, rule_for_version
from pytest_eagle3.sglang_source.install import locate, probe
from pytest_eagle3.sglang_source.pp_code import read_family_stage_checks, read_pp_code
from pytest_eagle3.stack_source.catalog import FACTS
from pytest_eagle3.stack_source.report import provenance
from pytest_eagle3.target.family_coverage import coverage, summary
from pytest_eagle3.target.spec import DEFAULT_ARCHITECTURE
from pytest_eagle3.verdicts.snapshots import full_label


def _ids(value: str) -> list[int]:
    try:
        return [int(v) for v in value.replace("[", "").replace("]", "").replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like '0,4,6', got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pytest-eagle3",
        description="Check what SGLang feeds an EAGLE-3 draft: info and inspect read the installed code without starting a model; self-test runs the suite with faults injected.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="what the installed SGLang captures and how it reads aux layer ids")
    info.add_argument("--ids", type=_ids, help="draft aux layer ids to predict, e.g. 1,4,6")
    info.add_argument("--layers", type=int, default=None, help="target layer count L (needed with --ids)")
    info.add_argument("--cache", default=None, help="cache dir for the SGLang flag probe (default: none)")
    info.add_argument("--pp", type=int, default=None, metavar="N",
                      help="a pipeline-parallel size: SGLang's layer split over N stages (needs --layers), "
                      "and with --ids which stage each layer to capture is on")
    info.add_argument("--architecture", default=None, metavar="NAME",
                      help="the target's config.json architecture whose model file to read "
                      "(default: DeepseekV3ForCausalLM)")
    info.add_argument("--families", action="store_true",
                      help="every model file of the installed SGLang that captures for EAGLE-3: its id rule, "
                      "default ids and capture site as read, and whether the suite runs it (or why not)")
    add_inspect_parser(sub)
    add_self_test_parser(sub)
    add_stacks_parser(sub)
    return parser


def cmd_info(args: argparse.Namespace) -> int:
    if args.pp is not None and (args.pp < 1 or args.layers is None or not 1 <= args.pp <= args.layers):
        print("pytest-eagle3 info: --pp N needs --layers L with 1 <= N <= L", file=sys.stderr)
        return 2
    if args.families:  # reads files only: no server-flag probe
        version, location = locate()
        print(f"sglang {version} ({location})")
        return cmd_families(location)
    install = probe(args.cache)
    print(install.describe())
    try:
        method = select_method(install)
    except Eagle3CaptureUnsupported as exc:
        method = f"none without a draft ({exc})"
    print(f"capture API: {method}")
    architecture = args.architecture or DEFAULT_ARCHITECTURE
    code = install.model_code(architecture)
    rule = code.rule
    print(f"model: {architecture} ({code.file or 'no model file registers it'})")
    print(f"aux layer-id rule: {rule.describe()}")
    emb = rule.embedding
    state = {True: "can be captured", False: "cannot be captured", None: "unknown (the suite measures it)"}
    print(f"layer 0 (embedding): {state[emb.capturable]}: {emb.why} [{emb.source}]")
    table = rule_for_version(install.version)
    if rule.known and "deepseek_v2.py" in rule.source and (table.kind != rule.kind or table.embedding.capturable != emb.capturable):
        print(f"note: the version number {install.version} suggests '{table.kind}' and layer 0 "
              f"{'capturable' if table.embedding.capturable else 'not capturable'} (upstream releases); "
              "the installed code decides")
    pp = read_pp_code(install.location, architecture)
    print(f"pipeline parallelism: {pp.describe()}")
    print("training and serving stacks (the facts the contracts rely on; pytest-eagle3 stacks checks them):")
    for stack in FACTS:
        print("  " + provenance(stack).replace("\n", "\n  "))
    if args.pp is not None and args.pp > 1:
        print(f"model families at PP: {read_family_stage_checks(install.location).describe()}")
    if args.pp is not None and args.pp > 1 and args.ids is None:
        print("\n".join(pp.split_lines(args.pp, args.layers)))
    if args.ids is not None:
        if args.layers is None:
            print("pytest-eagle3 info: --ids needs --layers L", file=sys.stderr)
            return 2
        p = predict(args.ids, args.layers, rule)
        if not p.known:
            print(f"ids {args.ids}: the rule is unknown ({rule.source})")
            return 1
        if p.setup_error is not None:
            print(f"ids {args.ids}: SGLang's {rule.source} raises {p.setup_error} at engine setup")
            return 1
        print(f"ids {args.ids} -> layers_to_capture {list(p.layers_to_capture)}")
        for slot, index in enumerate(p.snapshots):
            print(f"  slot {slot}: {full_label(index, args.layers)}")
        if args.pp is not None and args.pp > 1:
            print("\n".join(pp.split_lines(args.pp, args.layers, p.layers_to_capture)))
        if p.embedding_fails:
            print(f"  SGLang fails at the first forward: layer 0 cannot be captured ({emb.why})")
            return 1
        if p.fails_at_first_forward:
            print(f"  SGLang fails at the first forward: layers {list(p.missing)} are never reached "
                  f"or repeat (captured {len(p.snapshots)} of {len(p.layers_to_capture)})")
            return 1
    return 0


def cmd_families(location: str) -> int:
    """``info --families``: one block per EAGLE-3 model file (:mod:`pytest_eagle3.target.family_coverage`)."""
    items = coverage(location)
    print(summary(items))
    for item in items:
        print("\n".join(item.lines()))
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
        if args.command == "stacks":
            return cmd_stacks(args)
    except Eagle3Error as exc:
        print(f"pytest-eagle3: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
