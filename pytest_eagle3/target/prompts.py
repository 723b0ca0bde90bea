"""Prompts the suite sends: the packaged token ids, or the user's file
(``--eagle3-prompts FILE``).

Formats (the packaged ``fixtures/prompts.json`` is the first):

* ``.json``: ``{"prompts": [ENTRY, ...]}`` or a bare JSON list of entries,
  where an entry is a list of token ids, ``{"ids": [...]}``, ``{"text": "..."}``
  or a string (text);
* ``.jsonl``: one ENTRY per line;
* any other file: UTF-8 text, one prompt per non-empty line (``1 2 3`` is text).

Suffixes are matched case-insensitively; a UTF-8 byte-order mark is ignored.

Text is tokenized with the target's own tokenizer (``AutoTokenizer`` of the
target directory, without special tokens); a target without one (the
synthetic presets) takes token ids only.  Every id must be below the target's
``vocab_size``.  All of it is checked before any engine starts.

Nothing here imports torch; transformers only for text prompts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_eagle3.errors import Eagle3ConfigError

BAD_PROMPTS_MSG = "prompts file {path} is invalid: {error}"
NO_TOKENIZER = ("prompt {i} is text, but the target {target} has no tokenizer (tokenizer.json or "
                "tokenizer_config.json): give token ids, e.g. {{\"prompts\": [[1, 2, 3]]}}")
#: Files of the Hugging Face tokenizer of a checkpoint directory.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def read_entries(path: Path) -> list[list[int] | str]:
    """The prompts of ``path`` as token-id lists or text, in file order.

    Raises:
        Eagle3ConfigError: unreadable, empty, or an entry that is neither.
    """
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8-sig")  # a leading BOM is not part of the first prompt
    except (OSError, UnicodeDecodeError) as exc:
        raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(path=path, error=exc)) from None
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            data: Any = json.loads(raw)
        except ValueError as exc:
            raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(path=path, error=f"not JSON: {exc}")) from None
        entries = data.get("prompts") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(
                path=path, error='expected {"prompts": [...]} or a JSON list of prompts'))
    elif suffix == ".jsonl":
        entries = []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    entries.append(json.loads(line))
                except ValueError as exc:
                    raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(
                        path=path, error=f"line {n} is not JSON: {exc}")) from None
    else:
        entries = [line.strip() for line in raw.splitlines() if line.strip()]
    if not entries:
        raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(path=path, error="no prompts"))
    out: list[list[int] | str] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict):
            entry = entry.get("ids") if entry.get("ids") is not None else entry.get("text")
        if isinstance(entry, str) and entry.strip():
            out.append(entry)
        elif isinstance(entry, list) and entry and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                       for t in entry):
            out.append(list(entry))
        else:
            raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(
                path=path, error=f"prompt {i} must be a non-empty list of non-negative token ids or text"))
    return out


def load_prompts(path: Path, *, vocab_size: int, tokenizer_dir: Path | None = None) -> list[list[int]]:
    """Token ids of every prompt of ``path`` (text tokenized with the tokenizer of
    ``tokenizer_dir``, the target's checkpoint directory).

    Raises:
        Eagle3ConfigError: bad file, text without a tokenizer, an id >= ``vocab_size``.
    """
    entries = read_entries(path)
    tokenizer = None
    prompts: list[list[int]] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            if tokenizer is None:
                tokenizer = _tokenizer(tokenizer_dir, i, path)
            ids = list(tokenizer(entry, add_special_tokens=False)["input_ids"])
            if not ids:
                raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(path=path, error=f"prompt {i} tokenizes to nothing"))
        else:
            ids = entry
        if max(ids) >= vocab_size:
            raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(
                path=path, error=f"prompt {i} has id {max(ids)} >= the target's vocab_size {vocab_size}"))
        prompts.append(ids)
    return prompts


def _tokenizer(directory: Path | None, i: int, path: Path) -> Any:
    if directory is None or not any((Path(directory) / f).exists() for f in TOKENIZER_FILES):
        target = directory if directory is not None else "(a synthetic preset)"
        raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(path=path, error=NO_TOKENIZER.format(i=i, target=target)))
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # a broken tokenizer is the user's input error, said in one line
        raise Eagle3ConfigError(BAD_PROMPTS_MSG.format(
            path=path, error=f"the tokenizer of {directory} does not load: {type(exc).__name__}: {exc}")) from None

