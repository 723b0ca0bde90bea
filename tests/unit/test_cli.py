"""``pytest-eagle3 info``: the installed SGLang and the id rule, in seconds, no model."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_eagle3.cli import main as cli
from pytest_eagle3.stack_source.catalog import FACTS


@pytest.fixture(scope="module")
def flag_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flags")


def test_info_predicts_slots(capsys: pytest.CaptureFixture[str], flag_cache: Path) -> None:
    assert cli.main(["info", "--ids", "1,4,6", "--layers", "8", "--cache", str(flag_cache)]) == 0
    out = capsys.readouterr().out
    assert "ids [1, 4, 6] -> layers_to_capture [2, 5, 7]" in out
    assert "slot 0: hs[2] (input of layer 2)" in out
    # Where each stack's facts come from: read from its installed files, or recorded from a named wheel.
    for stack, release in (("vllm", "0.34.0"), ("speculators", "0.9.0"), ("specforge", "0.2.0")):
        assert (f"  {stack}: read from the installed files: {stack} " in out
                or f"  {stack}: {len(FACTS[stack])} facts are recorded constants, read from the {stack} {release} wheel (" in out)


def test_info_flags_ids_that_fail_at_first_forward(capsys: pytest.CaptureFixture[str], flag_cache: Path) -> None:
    assert cli.main(["info", "--ids", "1,4,7", "--layers", "8", "--cache", str(flag_cache)]) == 1
    assert "SGLang fails at the first forward: layers [8]" in capsys.readouterr().out


def test_info_ids_need_layers(capsys: pytest.CaptureFixture[str], flag_cache: Path) -> None:
    assert cli.main(["info", "--ids", "1,4,6", "--cache", str(flag_cache)]) == 2
    assert "--ids needs --layers" in capsys.readouterr().err


def test_bad_ids_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["info", "--ids", "one,two", "--layers", "8"])
    assert exc.value.code == 2
    assert "expected integers like '0,4,6'" in capsys.readouterr().err
