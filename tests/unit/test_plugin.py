"""Hooks: report header, markers and skips, log tails on failure, run summary."""

from __future__ import annotations

import sys

from pathlib import Path

import pytest

from pytest_eagle3.plugin import header
from pytest_eagle3.plugin import hooks as plugin
from pytest_eagle3.plugin.run import SUMMARY_TITLE
from pytest_eagle3.plugin.session import LOG_SECTION, MSG_SKIP_TP, tail_lines

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")


def test_entry_point_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--trace-config", "--co")
    result.stdout.fnmatch_lines(["*pytest_eagle3/plugin/hooks.py*"])


def test_header_names_versions_and_sources(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTEST_EAGLE3_CACHE", str(tmp_path / "cache"))
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--tp", "2", "--sglang-arg", "log_level=debug")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "eagle3: sglang *",
        "eagle3: torch *, transformers *",
        "eagle3: device cpu (auto: CUDA_VISIBLE_DEVICES=''), tp 2 (from cli), target tiny-dsv3",
        f"eagle3: cache {tmp_path / 'cache'} (from env), startup timeout 600 s",
        "eagle3: sglang args log_level='debug' (from cli)",
    ])


def test_header_without_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    assert header._sglang_line() == header.HEADER_NO_SGLANG


def test_header_reads_version_py_of_a_source_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "sglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / "version.py").write_text('__version__ = "0.4.9.post1"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    # An earlier test may have imported the real SGLang; find_spec would return it.
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    assert header._sglang_line() == f"eagle3: sglang 0.4.9.post1 (version.py) at {pkg}"


MARKED = """
import pytest

@pytest.mark.tp(4)
def test_tp4(eagle3_settings):
    pass

@pytest.mark.tp(2)
def test_tp2(eagle3_settings):
    pass

@pytest.mark.gpu
def test_gpu(eagle3_settings):
    pass

@pytest.mark.tp(1, 2, 4)
def test_each(eagle3_tp):
    assert eagle3_tp in (1, 2)

def test_plain():
    pass
"""


def test_tp_markers_of_own_tests(pytester: pytest.Pytester) -> None:
    """A TP size above --tp of a multi-size test is left out at collection (one
    summary line); a single-size test above --tp skips with the reason; ``gpu``
    marks the GPU suite and runs on the CPU tier too."""
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("--tp", "2", "-rs", "-v")
    result.assert_outcomes(passed=5, skipped=1)
    result.stdout.fnmatch_lines([
        "*::test_each?tp1? PASSED*",
        "*::test_each?tp2? PASSED*",
    ])
    assert "test_each[tp4]" not in result.stdout.str().split("eagle3 left out")[0]
    result.stdout.fnmatch_lines([f"SKIPPED [[]1[]] test_*.py:*: {MSG_SKIP_TP.format(needed=4, tp=2)}"])
    result.stdout.fnmatch_lines(["*eagle3 left out*", "1 left out: needs --tp 4; this run has --tp 2",
                                 "    *::test_each[[]tp4[]]"])
    assert MSG_SKIP_TP.format(needed=4, tp=2) == "needs --tp 4; this run has --tp 2"


def test_item_tp_for_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from pytest_eagle3.plugin.session import item_tp

        @pytest.fixture
        def eagle3_tp(request):
            return item_tp(request.node)
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tp(2)
        def test_marked(eagle3_tp):
            assert eagle3_tp == 2

        @pytest.mark.tp(1, 4)
        def test_each(eagle3_tp, request):
            assert eagle3_tp == request.node.callspec.params["eagle3_tp"]

        def test_unmarked_runs_at_the_run_tp(eagle3_tp):
            assert eagle3_tp == 4
        """
    )
    result = pytester.runpytest("--tp", "4")
    result.assert_outcomes(passed=4)


def test_multi_tp_marker_needs_the_parameter(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tp(1, 2)
        def test_x(eagle3_settings):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*tp(1, 2) runs the test at each TP size through the 'eagle3_tp' argument*"])


def test_bad_tp_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tp(3)
        def test_x(eagle3_settings):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*tp marker takes TP sizes from (1, 2, 4, 8), got (3,)*"])


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.slow
        @pytest.mark.gpu
        @pytest.mark.tp(1)
        def test_x():
            pass
        """
    )
    result = pytester.runpytest("--strict-markers", "-m", "not gpu")
    result.assert_outcomes(deselected=1)
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.gpu: *", "@pytest.mark.tp(*sizes): *", "@pytest.mark.slow: *"])


LOGGED = """
import pytest
from pytest_eagle3.plugin.session import attach_log

@pytest.fixture
def engine(request, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("\\n".join(f"log line {i}" for i in range(500)) + "\\n")
    attach_log(request.node, "tp1 cpu", log)
    return log

@pytest.fixture
def broken_engine(request, tmp_path):
    log = tmp_path / "broken.log"
    log.write_text("scheduler died: RuntimeError boom\\n")
    attach_log(request.node, "tp2 cpu", log)
    raise RuntimeError("engine exited with code -9")

def test_fails(engine):
    assert False, "capture mismatch"

def test_passes(engine):
    pass

def test_setup_fails(broken_engine):
    pass
"""


def test_log_tail_attached_on_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(LOGGED)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=1, passed=1, errors=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_setup_fails*",
        "E       RuntimeError: engine exited with code -9",
        f"*Captured {LOG_SECTION.format(title='tp2 cpu')} setup*",
        "scheduler died: RuntimeError boom",
        "*_ test_fails _*",
        "E       AssertionError: capture mismatch",
        f"*Captured {LOG_SECTION.format(title='tp1 cpu')} call*",
        "log line 300",
        "log line 499",
    ])
    assert "log line 299\n" not in out  # only the last 200 lines
    assert out.count("Captured sglang log tp1 cpu") == 1  # not for the passing test


def test_missing_log_is_named(tmp_path: Path) -> None:
    text = tail_lines(tmp_path / "gone.log")
    assert text.startswith(f"(log {tmp_path / 'gone.log'} is missing: ")


def test_tail_of_a_large_file(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"{'x' * 100} {i}\n" for i in range(10_000)))
    lines = tail_lines(log, lines=200).splitlines()
    assert len(lines) == 200
    assert lines[-1].endswith(" 9999")
    assert lines[0].endswith(" 9800")


def test_engines_summary(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from pytest_eagle3.plugin.run import get_run

        def test_start(pytestconfig):
            get_run(pytestconfig).record_engine("tp1 cpu tiny-dsv3", 17.25)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*{SUMMARY_TITLE}*", "tp1 cpu tiny-dsv3: ready in 17.2 s"])


def test_eagle3_errors_show_one_line_without_traceback(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        from pytest_eagle3.errors import Eagle3ConfigError, Eagle3EngineError

        @pytest.fixture
        def target():
            raise Eagle3ConfigError("unknown target preset 'nope'; known: tiny-dsv3")

        def test_setup(target):
            pass

        def test_call():
            raise Eagle3EngineError("SGLang exited with code -9 before it was ready")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_setup*",
        "Eagle3ConfigError: unknown target preset 'nope'; known: tiny-dsv3",
        "*_ test_call _*",
        "Eagle3EngineError: SGLang exited with code -9 before it was ready",
    ])
    assert "raise Eagle3" not in result.stdout.str()
