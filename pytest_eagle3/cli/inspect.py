"""``pytest-eagle3 inspect``: the argument parser and command around :mod:`pytest_eagle3.cli.preflight`.

Resolves the target's layer count (``--target`` preset or checkpoint dir, or
``--layers``) and the id rule: the installed SGLang's, read from the model file
of the target's architecture (``sglang_source/model_code.py``: no ``--help`` probe, no
SGLang import), or with ``--sglang-version`` the version table's prediction
for an upstream release that is not installed; then prints the :class:`~pytest_eagle3.cli.preflight.Inspection`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from packaging.version import InvalidVersion, Version

from pytest_eagle3.errors import Eagle3ConfigError, Eagle3ContractError
from pytest_eagle3.contracts.stacks import STACKS
from pytest_eagle3.target.spec import DEFAULT_ARCHITECTURE, resolve_target
from pytest_eagle3.sglang_source.install import locate
from pytest_eagle3.sglang_source.model_code import read_rules
from pytest_eagle3.sglang_source.pp_code import read_pp_code
from pytest_eagle3.errors import Eagle3SGLangMissing
from pytest_eagle3.cli.inspection import unreadable_dict
from pytest_eagle3.cli.preflight import inspect_draft

DESCRIPTION = """\
Print a draft's training contract (what its fc was trained on), what an SGLang
version will capture for it (from the ids SGLang reads: only
eagle_config.eagle_aux_hidden_state_layer_ids), and a verdict with a fix.
No model is loaded and no engine starts; the rule is read from the installed
SGLang's model file (or, with --sglang-version, predicted from the upstream
version table), and the packaged suite (--eagle3-draft/--eagle3-stack) measures it.

verdicts: MATCH (exit 0); MISMATCH (silently fed other layers), FAILS (SGLang
rejects it, e.g. at the first forward), INVALID (the draft contradicts itself
or its stack), UNKNOWN (the installed SGLang's rule could not be read from its
model file; the suite measures it): exit 1.  Usage errors: one line on stderr, exit 2.

stack: a speculators-format config means speculators; a SpecForge 0.2 run
directory (training_state.pt beside config.json, or in its <run>-latest or
<run>-step<N> checkpoints) means specforge, its ids read from the provenance
record when config.json has none; a Hugging Face-format config (eagle_config)
is written by several stacks that read its ids as different layers, so it needs
--stack (or --contract)."""

EPILOG = """\
--json keys: verdict, exit_code, reason, by_default, draft{path, config_format,
ids, ids_key, target_hidden_size, fc_shape, fc_input_width}, stack,
stack_source, target{description, num_layers}, contract (null if invalid),
contract_error, sglang{version, source, rule, rule_source, rule_from_code, ids_read, layers_to_capture,
never_reached, fails_at_first_forward, captures, captures_human},
slots[{slot, sglang, contract, ok, sglang_human, contract_human}],
fix{ids, key, text, portable, permutation} (null unless MISMATCH/FAILS),
recheck, notes, vllm[{server, key, ids, captures, fails, source, note}] (what
vLLM 0.34.0's runner would read from this config and capture on a DeepSeek
target, and why the ids it declares are not read; 0.33's V2 and V1 runners where
a 0.33 release is installed).  Snapshots are HF output_hidden_states indices (L+1 =
final_prenorm)."""

NEEDS_LAYERS_MSG = (
    "the target's layer count is unknown: pass --layers L or --target PRESET|PATH "
    "(a draft config's num_hidden_layers is the draft's own depth, not the target's)"
)
LAYERS_DIFFER_MSG = "--layers {layers} disagrees with --target {target}, which has {target_layers} layers"
NO_SGLANG_SUFFIX = "; or pass --sglang-version V to ask about a version without installing it"


def _version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise argparse.ArgumentTypeError(f"expected a release number like 0.5.23, got {value!r}") from None
    return value


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive layer count, got {value!r}")
    return n


def _option(value: str) -> tuple[str, Any]:
    name, sep, raw = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    low = raw.strip().lower()
    parsed: Any = raw.strip()
    if low in ("true", "false"):
        parsed = low == "true"
    elif low.lstrip("-").isdigit():
        parsed = int(low)
    return name.strip(), parsed


def add_inspect_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``inspect`` subcommand to ``sub`` (an argparse subparsers action)."""

    p = sub.add_parser(
        "inspect", help="check a draft's training contract against what SGLang will capture for it",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--draft", required=True, metavar="PATH", help="the draft checkpoint directory (config.json, "
                   "*.safetensors holding fc.weight)")
    p.add_argument("--target", metavar="PATH|PRESET", help="the target: a preset name (tiny-dsv3), a spec "
                   "*.json, or a checkpoint directory; gives L and checks the hidden size")
    p.add_argument("--layers", type=_positive, metavar="L", help="the target's number of layers (without --target)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--stack", choices=list(STACKS), metavar="NAME",
                       help=f"the training stack that made the draft: {', '.join(STACKS)} "
                       "(default: speculators for a speculators-format config; required otherwise)")
    which.add_argument("--contract", metavar="TEXT", help="the contract itself instead of a stack, e.g. "
                       "'[embedding, out(L2), out(L30)]' (to re-check a draft after a fix)")
    p.add_argument("--option", type=_option, action="append", default=[], metavar="KEY=VALUE",
                   help="a stack option: datagen=custom_worker (speculators), capture=output_hidden_states "
                   "(specforge-hf), sglang_version=V (specforge, specforge-sglang), final_layer=false (vllm)")
    p.add_argument("--sglang-version", type=_version, metavar="V", help="predict for upstream SGLang V "
                   "from the version table (for an SGLang that is not installed) instead of reading the "
                   "installed SGLang's rule from its model file")
    p.add_argument("--pp", type=_positive, metavar="N", help="a pipeline-parallel size: whether the installed "
                   "SGLang serves EAGLE-3 at PP N, and which stage each layer it captures for this draft is on")
    p.add_argument("--json", action="store_true", help="print JSON with stable keys (see below)")
    return p


def _layers(args: argparse.Namespace) -> tuple[int, str, int | None, str]:
    """``(L, description, target hidden size or None, architecture)``."""

    if args.target is not None:
        t = resolve_target(args.target)
        if args.layers is not None and args.layers != t.facts.num_layers:
            raise Eagle3ConfigError(LAYERS_DIFFER_MSG.format(layers=args.layers, target=args.target,
                                                             target_layers=t.facts.num_layers))
        return (t.facts.num_layers, f"{t.name}, {t.facts.num_layers} layers, hidden {t.facts.hidden_size}",
                t.facts.hidden_size, t.facts.architecture)
    if args.layers is None:
        raise Eagle3ConfigError(NEEDS_LAYERS_MSG)
    return args.layers, f"{args.layers} layers (--layers)", None, DEFAULT_ARCHITECTURE


def _sglang(args: argparse.Namespace, architecture: str) -> tuple[str, str, Any, str | None]:
    """``(version, where it came from, rule, location)``: the installed SGLang's rule is
    read from its model file for ``architecture``; ``--sglang-version`` asks the
    version table (rule and location ``None``)."""
    if args.sglang_version is not None:
        return args.sglang_version, "--sglang-version", None, None

    try:
        version, location = locate()
    except Eagle3SGLangMissing as exc:
        raise Eagle3SGLangMissing(str(exc) + NO_SGLANG_SUFFIX) from None
    return version, f"installed at {location}", read_rules(location, architecture).rule, location


def cmd_inspect(args: argparse.Namespace) -> int:
    L, target, hidden, architecture = _layers(args)
    version, source, rule, location = _sglang(args, architecture)
    try:
        result = inspect_draft(
            args.draft, num_layers=L, sglang_version=version, sglang_source=source, target=target,
            target_hidden_size=hidden, stack=args.stack, contract_text=args.contract, options=dict(args.option),
            rule=rule, sglang_location=location,
        )
    except Eagle3ContractError as exc:
        # load_draft rejected a readable config (bad or conflicting ids, unreadable weights).
        if args.json:
            print(json.dumps(unreadable_dict(args.draft, str(exc)), indent=2))
        else:
            print(f"draft:     {args.draft}\nverdict:   INVALID: {exc}")
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print("\n".join(result.lines()))
        if args.pp is not None and args.pp > 1 and location is not None:
            pp = read_pp_code(location, architecture)
            print(f"pp:        {pp.describe()}")
            print("\n".join("           " + line.strip() if i else "           " + line
                            for i, line in enumerate(pp.split_lines(args.pp, L, result.prediction.layers_to_capture))))
    return result.exit_code

