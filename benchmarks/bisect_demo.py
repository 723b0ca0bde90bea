"""A real ``git bisect run`` with pytest-eagle3 finding the commit that broke the wiring.

Builds a local git repository of SGLang's Python package (the release installed
in this environment, unpacked; forks bisect their own checkout the same way),
with a handful of commits, one of which brings back the pre-PR #25454 id rule
("always add 1": the Kimi-K2.5 capture bug of SGLang 0.5.9, every aux slot one layer
late and no embedding slot).  Then runs, as docs/bisect-and-self-test.md says::

    git bisect start <bad> <good>
    git bisect run python -m pytest --pyargs pytest_eagle3.suite --eagle3-bisect --device cpu

with the repository first on ``PYTHONPATH`` (what an editable install of the
checkout does), and checks that bisect names the breaking commit.

    python benchmarks/bisect_demo.py [--workdir DIR] [--json FILE]

Exit 0 when ``git bisect`` found exactly the breaking commit.  About 1 minute
per bisect step on 2 cores (one TP 1 engine each).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RULE_FILE = "sglang/srt/models/deepseek_v2.py"
GOOD_RULE = """            if layer_ids and layer_ids[0] == 1:
                self.model.layers_to_capture = [val + 1 for val in layer_ids]
            else:
                self.model.layers_to_capture = list(layer_ids)"""
BAD_RULE = """            self.model.layers_to_capture = [val + 1 for val in layer_ids]"""


def git(repo: Path, *args: str, check: bool = True) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "demo", "GIT_AUTHOR_EMAIL": "demo@example.invalid",
           "GIT_COMMITTER_NAME": "demo", "GIT_COMMITTER_EMAIL": "demo@example.invalid"}
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def commit_note(repo: Path, name: str, text: str) -> str:
    (repo / "NOTES.md").write_text(((repo / "NOTES.md").read_text() if (repo / "NOTES.md").exists() else "")
                                   + text + "\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", name)
    return git(repo, "rev-parse", "HEAD")


def build_repo(repo: Path) -> tuple[str, str, str]:
    """``(good, breaking, bad)`` commits of a fresh repository at ``repo``."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("SGLang is not installed in this environment")
    src = Path(next(iter(spec.submodule_search_locations)))
    shutil.copytree(src, repo / "sglang", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    text = (repo / RULE_FILE).read_text()
    if GOOD_RULE not in text:
        raise SystemExit(f"{RULE_FILE} of this SGLang does not have the 0.5.13+ id rule this demo edits")
    git(repo, "init", "-q")
    good = commit_note(repo, "import the installed SGLang", "release as installed")
    commit_note(repo, "docs: a harmless change", "a harmless change")
    (repo / RULE_FILE).write_text(text.replace(GOOD_RULE, BAD_RULE))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "deepseek: always offset EAGLE-3 aux layer ids by one")
    breaking = git(repo, "rev-parse", "HEAD")
    commit_note(repo, "docs: another harmless change", "another harmless change")
    bad = commit_note(repo, "docs: a third harmless change", "a third harmless change")
    return good, breaking, bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="eagle3-bisect-"))
    repo = work / "sglang-src"
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    good, breaking, bad = build_repo(repo)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p)}
    git(repo, "bisect", "start", bad, good)
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "pytest_eagle3.suite", "--eagle3-bisect",
           "--device", "cpu", "-q", "-p", "no:cacheprovider", "--rootdir", str(work)]
    t0 = time.monotonic()
    proc = subprocess.run(["git", "-C", str(repo), "bisect", "run", *cmd], capture_output=True, text=True,
                          env=env, cwd=work)
    seconds = time.monotonic() - t0
    log = proc.stdout + proc.stderr
    (work / "bisect.log").write_text(log)
    found = next((line.split()[0] for line in log.splitlines() if line.endswith("is the first bad commit")), None)
    verdicts = [line for line in log.splitlines() if line.startswith("eagle3 bisect: ")]
    git(repo, "bisect", "reset", check=False)
    result = {"good": good, "breaking": breaking, "bad": bad, "found": found, "seconds": round(seconds, 1),
              "steps": len(verdicts), "verdicts": verdicts, "log": str(work / "bisect.log")}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if found == breaking else 1


if __name__ == "__main__":
    sys.exit(main())
