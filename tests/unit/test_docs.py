"""The documentation stays true to the repository: README.md and docs/*.md link
to files and sections that exist, every repo path they name in backticks
exists, README.md stays short and keeps the command CI runs, code points to
docs/design.md sections that exist, and no page tells build history.

Plain text checks: no torch, no SGLang, well under a second.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DESIGN = DOCS / "design.md"
#: The line ``.ci/run`` greps for (``grep -qxF``): the README's second command.
CI_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[cpu,test]' && .venv/bin/pytest"
MAX_README_LINES = 220
#: Folders whose files may name docs/design.md sections.
CODE_DIRS = ("pytest_eagle3", "tests", "fixtures")
SKIP_DIRS = {".git", ".venv", ".tox", "__pycache__", "node_modules", ".pytest_cache"}
#: Paths in backticks that are SGLang's or a training stack's files, not this repository's.
FOREIGN_PREFIXES = ("srt/", "sglang/", "python/", "vllm/", "speculators/", "specforge/")
PATH_EXTENSIONS = (".py", ".md", ".json", ".ini", ".toml")
#: Build-history wording; ``seed`` alone is fine (random seeds).  Written in
#: pieces so that grepping the repository for these words finds only real uses.
HISTORY = re.compile(r"session [0-9]|seed[- ]era|\blent\b|" r"the se" r"ed's|seed bug|seed draft", re.IGNORECASE)
DESIGN_NAME = "DESIGN" + ".md"  # spelled apart so this file does not match itself
DESIGN_REF = re.compile(r'docs/design\.md,\s*(?:#:\s*)?\\?"([^"\\]+)\\?"')

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(path: Path) -> str:
    """A page without its fenced code blocks (commands and sample output)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: Path) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", prose(path), re.MULTILINE)]


def repo_files() -> set[str]:
    """Names of every file in the repository (outside virtualenvs and caches)."""
    names = set()
    for _dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        names.update(filenames)
    return names


def text_files(top: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        found += [Path(dirpath) / f for f in filenames if f.endswith((".py", ".json", ".md", ".txt", ".toml", ".ini"))]
    return found


def test_docs_pages_exist() -> None:
    names = {p.name for p in DOCS.glob("*.md")}
    assert {"README.md", "design.md", "options.md", "compatibility.md"} <= names, sorted(names)


def test_relative_links_point_to_existing_files_and_sections() -> None:
    """Every relative Markdown link resolves to a file; a ``#section`` to a heading there."""
    checked, broken = 0, []
    for page in pages():
        for target in LINK.findall(prose(page)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such section)")
    assert checked >= 20, f"only {checked} links found: the link pattern no longer matches"
    assert not broken, "\n".join(broken)


def test_readme_is_short_and_keeps_the_ci_command() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    assert CI_COMMAND in lines, f"README.md has no line that is exactly: {CI_COMMAND}"
    assert any(line.startswith("-----") and "eagle3 figures" in line for line in lines), \
        "README.md's 'What a run prints' lacks the eagle3 figures section of a real run"


def path_tokens(page: Path) -> list[str]:
    """Tokens inside backticks that look like a file path of this repository."""
    tokens = []
    for span in CODE_SPAN.findall(prose(page)):
        for token in span.split():
            token = token.strip("(),;:'\"")
            if not token.endswith(PATH_EXTENSIONS) or token.startswith(FOREIGN_PREFIXES):
                continue
            if any(c in token for c in "<>{}") or ":" in token:
                continue  # placeholders (fixtures/targets/<name>.json) and file:line of SGLang
            if re.fullmatch(r"[A-Z_]+", Path(token).stem):
                continue  # FILE.json
            tokens.append(token)
    return tokens


def path_exists(token: str, names: set[str]) -> bool:
    if "*" in token:
        return any(ROOT.glob(token))
    if "/" not in token:
        return token in names
    return any((base / token).exists() for base in (ROOT, ROOT / "pytest_eagle3"))


def test_repo_paths_in_backticks_exist() -> None:
    """``tests/unit/test_layers.py``, ``pytest_eagle3/reaper.py``, ``engine/cpu/recipe.py``
    (relative to pytest_eagle3/): each must exist; a bare file name somewhere in the repo."""
    names = repo_files()
    seen, missing = set(), []
    for page in pages():
        for token in path_tokens(page):
            seen.add(token)
            if not path_exists(token, names):
                missing.append(f"{page.relative_to(ROOT)}: `{token}`")
    assert {"tests/unit/test_layers.py", "pytest_eagle3/reaper.py"} <= seen, sorted(seen)
    assert not missing, "no such file:\n" + "\n".join(missing)


def test_path_check_catches_a_moved_file() -> None:
    names = repo_files()
    assert path_exists("engine/cpu/recipe.py", names)
    assert not path_exists("tests/test_reaper.py", names)
    assert not path_exists("capture/declare.py", names)
    assert path_tokens(DOCS / "layout.md")


def test_code_points_to_design_sections_that_exist() -> None:
    """No reference to the old top-level design file; every docs/design.md
    reference in code names a section, and the section is a heading there."""
    titles = headings(DESIGN)
    stale, unnamed, unknown, refs = [], [], [], 0
    for top in CODE_DIRS:
        for path in text_files(ROOT / top):
            if path == Path(__file__).resolve():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            rel = path.relative_to(ROOT)
            if DESIGN_NAME in text:
                stale.append(str(rel))
            named = DESIGN_REF.findall(text)
            if text.count("docs/design.md") != len(named):
                unnamed.append(str(rel))
            for section in named:
                refs += 1
                if not any(t.startswith(section) for t in titles):
                    unknown.append(f"{rel}: {section!r}")
    assert refs >= 10, f"only {refs} docs/design.md references found"
    assert not stale, f"{DESIGN_NAME} named in: {stale}"
    assert not unnamed, f'docs/design.md without a section ("docs/design.md, \\"Section\\"") in: {unnamed}'
    assert not unknown, "no such section in docs/design.md:\n" + "\n".join(unknown)


@pytest.mark.parametrize("where", ["README.md", "docs", "pytest_eagle3"])
def test_no_build_history_wording(where: str) -> None:
    top = ROOT / where
    files = [top] if top.is_file() else text_files(top)
    assert files
    hits = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_history_pattern_matches_what_it_must() -> None:
    for text in ("measured in sess" "ion 3", "no GPU was le" "nt", "the se" "ed-era release", "the se" "ed's bug"):
        assert HISTORY.search(text), text
    for text in ("seed 0, 900 fixed steps", "a random seed", "silently"):
        assert not HISTORY.search(text), text
