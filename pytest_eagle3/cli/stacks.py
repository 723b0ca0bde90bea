"""``pytest-eagle3 stacks``: the facts the contracts rely on, read from the stacks' own files.

With no argument it reads the installed vLLM, speculators and SpecForge (those
installed); with paths it reads each wheel (``.whl``, read in place), unpacked
wheel or source folder, and a folder of wheels; ``--download SPEC ...`` first
fetches wheels with ``pip download --no-deps`` into a temporary folder (nothing
is installed or imported).  Exit 0 when every fact holds (at its lines, at other
lines, or as an older release the project models), 1 when one has changed,
2 for a path that is not a stack or a failed download.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from pytest_eagle3.stack_source.catalog import FACTS
from pytest_eagle3.stack_source.files import StackFiles, installed, open_path
from pytest_eagle3.stack_source.report import read_stack

#: The releases ``tox -e stacks`` checks by default (the latest on the index).
LATEST = ("vllm", "speculators", "specforge")


def add_stacks_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("stacks", help="check the facts the contracts rely on against vLLM, speculators and "
                       "SpecForge's own files (installed, wheels or folders)")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="a .whl, an unpacked wheel or source folder, or a folder of wheels (default: the installed stacks)")
    p.add_argument("--download", nargs="*", metavar="SPEC", default=None,
                   help="pip download --no-deps these requirement specs first (default with no SPEC: "
                   f"{' '.join(LATEST)}, the latest releases) and read the wheels")


def _expand(path: Path) -> list[Path]:
    """A folder of wheels is its wheels; anything else is itself."""
    if path.is_dir() and not any(path.glob("*.dist-info")) and any(path.glob("*.whl")):
        return sorted(path.glob("*.whl"))
    return [path]


def _download(specs: Sequence[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
           "--dest", str(dest), *specs]
    print(f"downloading: {' '.join(specs)} (pip download --no-deps)", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"pip download failed (exit {done.returncode}):\n{tail}")


def _copies(args: argparse.Namespace, tmp: Path) -> tuple[list[StackFiles], list[str]]:
    paths = [Path(p) for p in args.paths]
    if args.download is not None:
        _download(args.download or LATEST, tmp)
        paths.append(tmp)
    if not paths:
        found = [installed(name) for name in FACTS]
        missing = [name for name, files in zip(FACTS, found) if files is None]
        if missing:
            print(f"not installed here: {', '.join(missing)} (give a wheel, or --download)")
        return [f for f in found if f is not None], missing
    return [open_path(p) for path in paths for p in _expand(path)], []


def cmd_stacks(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="eagle3-stacks-") as tmp:
        try:
            copies, missing = _copies(args, Path(tmp))
        except RuntimeError as exc:
            print(f"pytest-eagle3 stacks: {exc}", file=sys.stderr)
            return 2
        changed = older = 0
        for files in copies:
            report = read_stack(files)
            print("\n".join(report.lines()))
            changed += len(report.broken)
            older += len(report.older)
    if not copies:
        print("no stack to read")
        return 0
    if changed:
        print(f"{changed} fact(s) changed")
    else:
        print("every fact read holds" + (" or matches an older release the project models" if older else "")
              + (f" (not checked: {', '.join(missing)})" if missing else ""))
    return 1 if changed else 0
