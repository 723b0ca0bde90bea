"""``--eagle3-prompts FILE``: token ids or text (the target's tokenizer), checked
before any engine starts (bad files: ``tests/unit/test_bad_input.py``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.target.prompts import load_prompts, read_entries
from pytest_eagle3.target.spec import load_packaged_prompts, prompts_path

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                                        or importlib.util.find_spec("tokenizers") is None,
                                        reason="transformers is not installed")


def test_every_entry_form(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"prompts": [[1, 2], {"ids": [3]}, {"text": "a b"}, "c"]}))
    assert read_entries(f) == [[1, 2], [3], "a b", "c"]
    f = tmp_path / "p.txt"
    f.write_text("\ufefffirst prompt\n\n  second  \n", encoding="utf-8")
    assert read_entries(f) == ["first prompt", "second"]
    f = tmp_path / "P.JSON"
    f.write_text("\ufeff" + json.dumps([[1, 2], {"ids": None, "text": "x"}], indent=2), encoding="utf-8")
    assert read_entries(f) == [[1, 2], "x"]
    f = tmp_path / "p.jsonl"
    f.write_text('[1, 2, 3]\n\n{"text": "y"}\n"z"\n')
    assert read_entries(f) == [[1, 2, 3], "y", "z"]


def test_the_packaged_prompts_read_through_the_same_code() -> None:
    assert load_packaged_prompts() == load_prompts(prompts_path(), vocab_size=2**62)


def tokenizer_dir(path: Path) -> Path:
    """A word-level Hugging Face tokenizer (``tokenizer.json``) of 6 words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "draft", "reads", "aux", "states"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return path


@needs_transformers
def test_text_is_tokenized_by_the_targets_tokenizer(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("the draft reads aux states\n")
    assert load_prompts(f, vocab_size=6, tokenizer_dir=tokenizer_dir(tmp_path / "target")) == [[1, 2, 3, 4, 5]]
    with pytest.raises(Eagle3ConfigError, match="prompt 0 has id 5 >= the target's vocab_size 5"):
        load_prompts(f, vocab_size=5, tokenizer_dir=tmp_path / "target")


def test_the_suite_sends_the_users_prompts(pytester: pytest.Pytester, tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps([[5, 6, 7, 8], [1500, 2, 3]]))
    pytester.makepyfile("""
        def test_prompts(eagle3_prompts):
            assert eagle3_prompts == [[5, 6, 7, 8], [1500, 2, 3]]
    """)
    result = pytester.runpytest_subprocess("--eagle3-prompts", str(f), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
