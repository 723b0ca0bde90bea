"""Bad input: each mistake is one line that says what to do, with no traceback
into pytest-eagle3 and nothing half-written left in the cache.

Every case runs the packaged suite (``--pyargs pytest_eagle3.suite``) in a
subprocess with its own cache directory.  None of them may start SGLang: target
and cache mistakes are usage errors found before any test runs, and the SGLang
cases fail in the ``eagle3_sglang`` fixture, which comes before the checkpoint
and the engine in the fixture chain.  As a guard, each inner run gets a
``conftest.py`` (the invocation directory's conftest applies to ``--pyargs``
runs) whose ``eagle3_engine_pool`` fails the test instead of starting an
engine; a regression that got that far shows up as a wrong message.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from pytest_eagle3.target.checkpoint.cache import cache_key
from pytest_eagle3.plugin import header
from pytest_eagle3.target.checkpoint import builder, cache, ensure_checkpoint, entry_dir
from pytest_eagle3.sglang_source.install import IMPORT_FAILED, NOT_INSTALLED, SGLangInstall, probe
from pytest_eagle3.engine.pool import FAILED_BEFORE
from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.plugin.options import ENV_TARGET
from pytest_eagle3.plugin.validate import (MSG_CACHE_NOT_WRITABLE, MSG_FROM_SOURCE, MSG_PP_CPU_PROCESSES,
                                           MSG_PP_LAYERS, MSG_PP_NO_FLAG, check_pp_flag, check_tp_divides)
from pytest_eagle3.plugin.session import LOG_SECTION, LOG_SHOWN_BEFORE
from pytest_eagle3.target.spec import MISSING_CONFIG_MSG, UNKNOWN_TARGET_MSG, TargetSpec, list_presets

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")

SUITE = ("--pyargs", "pytest_eagle3.suite", "-p", "no:cacheprovider")
#: An inner run that hangs (e.g. a real engine start slipped through) fails the test.
INNER_TIMEOUT_S = 300

GUARD_CONFTEST = '''
import pytest

ENGINE_GUARD = "bad-input test reached an SGLang engine start"


class NoEnginePool:
    def __init__(self, log_dir):
        self.log_dir = log_dir

    def log_path(self, config):
        return self.log_dir / f"{config.name}.log"

    def get(self, config):
        pytest.fail(ENGINE_GUARD, pytrace=False)

    def close(self):
        pass


@pytest.fixture(scope="session")
def eagle3_engine_pool(tmp_path_factory):
    return NoEnginePool(tmp_path_factory.mktemp("sglang-logs"))
'''

#: Makes ``importlib.util.find_spec("sglang")`` answer "not installed" in the inner run.
HIDE_SGLANG = '''
import importlib.util

_find_spec = importlib.util.find_spec


def _without_sglang(name, package=None):
    if name == "sglang" or name.startswith("sglang."):
        return None
    return _find_spec(name, package)


importlib.util.find_spec = _without_sglang
'''

#: Python traceback frames or pytest long-repr locations inside the library.
LIBRARY_FRAME = re.compile(r"pytest_eagle3/[\w/]+\.py[\":]")


def run_suite(pytester: pytest.Pytester, cache_dir: Path, *args: str, conftest: str = "",
              flags: Path | None = None) -> pytest.RunResult:
    """The packaged suite in a child pytest with ``cache_dir`` as its cache;
    ``flags``: a probed ``sglang-flags`` directory copied into it first
    (:func:`probed_flags`)."""
    if flags is not None:
        shutil.copytree(flags, cache_dir / flags.name, dirs_exist_ok=True)
    pytester.makeconftest(GUARD_CONFTEST + conftest)
    return pytester.runpytest_subprocess(
        *SUITE, "--eagle3-cache", str(cache_dir), *args, timeout=INNER_TIMEOUT_S
    )


def output(result: pytest.RunResult) -> str:
    return "\n".join(result.outlines + result.errlines)


def assert_no_traceback(result: pytest.RunResult) -> None:
    text = output(result)
    assert "Traceback" not in text, text
    assert "During handling of the above exception" not in text, text
    assert not LIBRARY_FRAME.search(text), text
    assert "INTERNALERROR" not in text, text


def assert_usage_error(result: pytest.RunResult, message: str) -> None:
    """Exit code 4 and exactly one line on stderr: ``ERROR: <message>``."""
    assert "\n" not in message
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output(result)
    assert [line for line in result.errlines if line.strip()] == [f"ERROR: {message}"], output(result)
    assert_no_traceback(result)


def error_sections(result: pytest.RunResult) -> dict[str, list[str]]:
    """``{test id: body lines}`` of the ERRORS block of a run."""
    lines = result.outlines
    start = lines.index(next(line for line in lines if re.fullmatch(r"=+ ERRORS =+", line)))
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[start + 1:]:
        if line.startswith("=" * 5) or line.startswith("- eagle3 "):  # next section
            break
        match = re.fullmatch(r"_+ ERROR at setup of (.+?) _+", line)
        if match:
            current = sections.setdefault(match.group(1), [])
        elif current is not None and line.strip() and not re.match(r"\[gw\d+\] ", line):
            current.append(line)
    return sections


def assert_each_setup_error_is(result: pytest.RunResult, line: str) -> None:
    """Every test errors at setup, each showing just ``line``; nothing passes."""
    assert "\n" not in line
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output(result)
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors", 0) >= 4 and "passed" not in outcomes and "failed" not in outcomes, outcomes
    sections = error_sections(result)
    assert len(sections) == outcomes["errors"], output(result)
    assert all(body == [line] for body in sections.values()), output(result)
    assert_no_traceback(result)


def assert_nothing_half_written(cache_dir: Path) -> None:
    """No temporary file or directory anywhere under ``cache_dir`` (it may not exist)."""
    leftovers = [p for p in cache_dir.rglob("*") if ".tmp" in p.name or ".old-" in p.name]
    assert leftovers == []


# ------------------------------------------------------------ target and --tp


def test_unknown_preset(pytester: pytest.Pytester, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    result = run_suite(pytester, cache_dir, "--eagle3-target", "no-such-preset")
    assert_usage_error(
        result, UNKNOWN_TARGET_MSG.format(value="no-such-preset", known=", ".join(list_presets()))
    )
    assert not cache_dir.exists()  # found before anything touched the cache


def test_unknown_preset_from_env_names_the_variable(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_TARGET, "no-such-preset")
    result = run_suite(pytester, tmp_path / "cache")
    message = UNKNOWN_TARGET_MSG.format(value="no-such-preset", known=", ".join(list_presets()))
    assert_usage_error(
        result, MSG_FROM_SOURCE.format(message=message, where=f"env {ENV_TARGET}")
    )


def _small_target(target: Path) -> Path:
    """A target directory with only a ``config.json``: 4 layers, 6 attention heads."""
    target.mkdir()
    (target / "config.json").write_text(
        '{"num_hidden_layers": 4, "hidden_size": 96, "vocab_size": 256, "num_attention_heads": 6}'
    )
    return target


def test_tp_that_does_not_divide_the_heads(pytester: pytest.Pytester, tmp_path: Path) -> None:
    target = _small_target(tmp_path / "six-heads")
    cache_dir = tmp_path / "cache"
    result = run_suite(pytester, cache_dir, "--tp", "4", "--eagle3-target", str(target))
    message = check_tp_divides(4, 6)
    assert message == "--tp 4 does not divide the target's 6 attention heads; use --tp 1 or 2"
    assert_usage_error(result, message)
    assert not cache_dir.exists()


def test_pp_above_the_layers_and_too_many_cpu_processes(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """``--pp 6`` on a 4-layer target, and ``--pp 16`` (or ``--tp 4 --pp 4``) on cpu: one usage
    line each, before any engine."""
    target = _small_target(tmp_path / "four-layers")
    cache_dir = tmp_path / "cache"
    result = run_suite(pytester, cache_dir, "--pp", "6", "--eagle3-target", str(target))
    assert_usage_error(result, MSG_PP_LAYERS.format(pp=6, layers=4))
    assert not (cache_dir / "checkpoints").exists()
    result = run_suite(pytester, cache_dir, "--pp", "16")
    assert_usage_error(result, MSG_PP_CPU_PROCESSES.format(tp=1, pp=16, n=16))
    result = run_suite(pytester, cache_dir, "--tp", "4", "--pp", "4")
    assert_usage_error(result, MSG_PP_CPU_PROCESSES.format(tp=4, pp=4, n=16))


def test_pp_on_an_sglang_without_pp_size() -> None:
    """A fork whose server has no ``--pp-size``: one line naming it."""
    fork = SGLangInstall(version="0.0.1", location="/fork/sglang", flags=frozenset({"tp-size"}), python="python")
    assert check_pp_flag(2, fork) == MSG_PP_NO_FLAG.format(pp=2, sglang=fork.describe())
    assert check_pp_flag(1, fork) is None and check_pp_flag(2, None) is None


def test_target_directory_without_config(pytester: pytest.Pytester, tmp_path: Path) -> None:
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    result = run_suite(pytester, tmp_path / "cache", "--eagle3-target", str(empty))
    assert_usage_error(result, MISSING_CONFIG_MSG.format(path=empty.resolve()))
    assert list(empty.iterdir()) == []


def test_bad_target_does_not_break_unrelated_runs(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A project without eagle3 tests, in an environment where the plugin is
    # installed and a stale eagle3 target and an unusable default cache are set.
    blocker = tmp_path / "afile"
    blocker.write_text("")
    monkeypatch.setenv(ENV_TARGET, "no-such-preset")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "xdg"))
    pytester.makepyfile("def test_plain(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=1)


# ------------------------------------------------------------ SGLang


def test_sglang_not_installed(pytester: pytest.Pytester, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    result = run_suite(pytester, cache_dir, conftest=HIDE_SGLANG)
    result.stdout.fnmatch_lines([header.HEADER_NO_SGLANG])
    assert_each_setup_error_is(result, "Eagle3SGLangMissing: " + NOT_INSTALLED.format(python=sys.executable))
    assert_nothing_half_written(cache_dir)


def test_sglang_that_fails_to_import(pytester: pytest.Pytester, tmp_path: Path) -> None:
    # A fork's source tree on PYTHONPATH (pytester puts its directory there)
    # shadows the installed SGLang; its server entry point does not import.
    fork = pytester.mkpydir("sglang")
    (fork / "version.py").write_text('__version__ = "0.0.1.dev0"\n')
    (fork / "launch_server.py").write_text('raise ImportError("boom")\n')
    cache_dir = tmp_path / "cache"  # fresh: the flag list is cached per install
    result = run_suite(pytester, cache_dir)
    expected = IMPORT_FAILED.format(
        version="0.0.1.dev0", location=fork.resolve(), error="ImportError: boom", python=sys.executable
    )
    assert_each_setup_error_is(result, f"Eagle3SGLangMissing: {expected}")
    assert_nothing_half_written(cache_dir)
    assert not (cache_dir / "sglang-flags").exists() or list((cache_dir / "sglang-flags").iterdir()) == []


# ------------------------------------------------------------ cache


def test_cache_under_a_regular_file(pytester: pytest.Pytester, tmp_path: Path) -> None:
    # Root ignores permission bits, so "not writable" is a path through a file.
    blocker = tmp_path / "afile"
    blocker.write_text("keep me")
    result = run_suite(pytester, blocker / "cache")
    assert_usage_error(
        result,
        MSG_CACHE_NOT_WRITABLE.format(
            path=blocker / "cache", source="cli", reason=f"{blocker} is not a directory"
        ),
    )
    assert blocker.read_text() == "keep me"


def test_unusable_default_cache_is_reported_for_the_suite(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "xdg"))
    pytester.makeconftest(GUARD_CONFTEST)
    result = pytester.runpytest_subprocess(*SUITE, timeout=INNER_TIMEOUT_S)
    default = blocker / "xdg" / "pytest-eagle3"
    assert_usage_error(
        result,
        MSG_CACHE_NOT_WRITABLE.format(path=default, source="default", reason=f"{blocker} is not a directory"),
    )


@pytest.fixture
def small_spec() -> TargetSpec:
    """A 2-layer variant of the default preset that builds in a fraction of a second."""
    tiny = TargetSpec.preset("tiny-dsv3")
    return TargetSpec.from_dict({
        "name": "bad-input",
        "seed": 3,
        "init": tiny.init.to_dict(),
        "config": dict(tiny.config, num_hidden_layers=2, vocab_size=256),
    })


@pytest.mark.parametrize("failure", [RuntimeError("weights exploded"), KeyboardInterrupt(), OSError(28, "No space left on device")],
                         ids=["bug", "ctrl-c", "disk-full"])
def test_build_failing_midway_leaves_nothing(
    small_spec: TargetSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    real_build = builder.build_checkpoint

    def half_build(spec: TargetSpec, out_dir: Path) -> None:
        real_build(spec, out_dir)  # every file written ...
        (out_dir / builder.WEIGHTS_FILE).write_bytes(b"truncated")  # ... one of them cut short
        raise failure

    monkeypatch.setattr(builder, "build_checkpoint", half_build)
    expected = Eagle3ConfigError if isinstance(failure, OSError) else type(failure)
    with pytest.raises(expected) as info:
        ensure_checkpoint(small_spec, tmp_path)
    if isinstance(failure, OSError):
        assert str(info.value) == cache.UNWRITABLE_MSG.format(
            path=tmp_path / "checkpoints", error="[Errno 28] No space left on device"
        )
    entry = entry_dir(small_spec, tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [f"{entry.name}.lock"]
    assert_nothing_half_written(tmp_path)

    monkeypatch.setattr(builder, "build_checkpoint", real_build)
    assert ensure_checkpoint(small_spec, tmp_path) == entry
    assert cache.check_entry(entry, cache_key(small_spec)) is None
    assert_nothing_half_written(tmp_path)


# ------------------------------------------------------------ real failures


SIX_TESTS_SHARING_A_BROKEN_FIXTURE = '''
import pytest
from pytest_eagle3.errors import Eagle3EngineError

MESSAGE = {message!r}


@pytest.fixture(scope="session")
def shared_engine():
    raise Eagle3EngineError(MESSAGE)


@pytest.mark.parametrize("n", range(6))
def test_uses_engine(shared_engine, n):
    pass
'''


def test_session_fixture_error_is_one_line_per_test(pytester: pytest.Pytester) -> None:
    # An Eagle3Error in a session fixture errors every test that uses it: six
    # short sections with the same line, not six tracebacks.
    message = "SGLang server tp1-capture exited with code 1 during startup (log: /tmp/x.log)"
    pytester.makepyfile(SIX_TESTS_SHARING_A_BROKEN_FIXTURE.format(message=message))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.parseoutcomes() == {"errors": 6}
    sections = error_sections(result)
    assert len(sections) == 6
    assert all(body == [f"Eagle3EngineError: {message}"] for body in sections.values()), output(result)
    assert_no_traceback(result)


SHARED_BROKEN_ENGINE = '''
import pytest
from pytest_eagle3.plugin import session
from pytest_eagle3.engine import server, server_log
from pytest_eagle3.engine.pool import EnginePool
from pytest_eagle3.errors import Eagle3EngineError


class Config:
    name = "tp1-capture"
    model_path, tp, device, server_args, env = "/m", 1, "cpu", (), ()

    def args(self):
        return []

    def env_dict(self):
        return {}

    def describe(self):
        return "tp1 capture"


CONFIG = Config()


def exits_during_startup(self, progress=None):
    self.log_path.write_text("Traceback (most recent call last):\\n"
                             '  File "/venv/site-packages/sglang/srt/utils/common.py", line 3614, in cap\\n'
                             "    cap = torch.cuda.get_device_capability()\\n"
                             '  File "/venv/site-packages/torch/cuda/__init__.py", line 372, in _lazy_init\\n'
                             "RuntimeError: Found no NVIDIA driver on your system.\\n"
                             + "".join(f"log line {i}\\n" for i in range(300)))
    raise Eagle3EngineError(server.STARTUP_FAILED.format(
        name=self.name, code=1, log=self.log_path, n=server_log.LOG_TAIL_LINES,
        tail=server_log.log_tail(self.log_path), cause=server_log.startup_cause(self.log_path)))


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server.SGLangServer, "spawn", lambda self: self)
        mp.setattr(server.SGLangServer, "wait_ready", exits_during_startup)
        yield EnginePool(log_dir=tmp_path_factory.mktemp("sglang-logs"))


@pytest.mark.parametrize("n", range(6))
def test_capture(pool, request, n):
    session.attach_log(request.node, CONFIG.name, pool.log_path(CONFIG))
    pool.get(CONFIG, who=request.node.nodeid)
'''


def test_engine_that_failed_to_start_is_reported_once(pytester: pytest.Pytester) -> None:
    # Six tests share an engine config whose start fails: the first shows the
    # error with the log tail; the other five one line each, not five more walls.
    pytester.makepyfile(SHARED_BROKEN_ENGINE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=6)
    text = result.stdout.str()
    assert text.count("log line 299") == 2  # the message's tail and the log section, first test only
    # The others point to the first in one line: no log section at all.
    assert text.count(LOG_SECTION.format(title="tp1-capture")) == 1
    log = pytester.path / "runpytest-0" / "sglang-logs0" / "tp1-capture.log"
    first_line = ("SGLang server tp1-capture exited with code 1 during startup: RuntimeError: Found no NVIDIA "
                  f"driver on your system. (sglang/srt/utils/common.py:3614) (log: {log})")
    assert ("Eagle3EngineError: " + first_line) in result.outlines, text
    repeat = "Eagle3StartCauseSeen: " + FAILED_BEFORE.format(
        name="tp1-capture", who="test_engine_that_failed_to_start_is_reported_once.py::test_capture[0]",
        error=first_line)
    assert result.outlines.count(repeat) == 5, text
    assert len(result.outlines) < 350, text


ENGINES_FAILING_FOR_ONE_CAUSE = '''
import pytest
from pytest_eagle3.plugin import session
from pytest_eagle3.plugin.run import get_run
from pytest_eagle3.engine import server, server_log
from pytest_eagle3.engine.config import EngineConfig
from pytest_eagle3.engine.pool import EnginePool
from pytest_eagle3.errors import Eagle3EngineError


def config(tp, ids, draft=None):
    args = [("tp_size", tp), ("return_aux_hidden_state_layer_ids", ids)]
    if draft:
        args.append(("speculative_draft_model_path", draft))
    return EngineConfig(model_path="/m", tp=tp, device="cpu", server_args=tuple(sorted(args)), env=())


CONFIGS = [config(1, (0, 3, 5)), config(1, (1, 3, 4)), config(1, (2, 4, 5)), config(2, (0, 3, 5)),
           config(1, (0, 3, 5), draft="/d")]


def moe_type_error(self, progress=None):
    self.log_path.write_text("Traceback (most recent call last):\\n"
                             '  File "/venv/site-packages/sglang/srt/layers/moe/fused_moe_triton/layer.py", line 321, in __init__\\n'
                             "    self.quant_method.create_weights(layer=self, **extra)\\n"
                             "TypeError: create_weights() got an unexpected keyword argument 'with_bias'\\n"
                             + "".join(f"log line {i}\\n" for i in range(300)))
    cause = server_log.startup_cause(self.log_path)
    raise Eagle3EngineError(server.STARTUP_FAILED.format(
        name=self.name, code=1, log=self.log_path, n=server_log.LOG_TAIL_LINES,
        tail=server_log.log_tail(self.log_path), cause=cause), cause=cause.removeprefix(": "))


@pytest.fixture(scope="session")
def pool(tmp_path_factory, pytestconfig):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server.SGLangServer, "spawn", lambda self: self)
        mp.setattr(server.SGLangServer, "wait_ready", moe_type_error)
        p = EnginePool(log_dir=tmp_path_factory.mktemp("sglang-logs"), upcoming=CONFIGS)
        get_run(pytestconfig).pool = p
        yield p


@pytest.mark.parametrize("n", range(len(CONFIGS)))
def test_capture(pool, request, n):
    session.attach_log(request.node, CONFIGS[n].name, pool.log_path(CONFIGS[n]))
    pool.get(CONFIGS[n], who=request.node.nodeid)
'''


def test_engines_failing_to_start_for_one_cause_report_it_once(pytester: pytest.Pytester) -> None:
    # A fork whose MoE layer raises while the model is built: five engine
    # configurations (three differ only in the capture ids), one cause.  The
    # first test shows it with the log tail, every other test one line, the
    # summary one line; the two configurations that share the first one's
    # startup path are not started.
    pytester.makepyfile(ENGINES_FAILING_FOR_ONE_CAUSE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=5)
    text = result.stdout.str()
    first = "test_engines_failing_to_start_for_one_cause_report_it_once.py::test_capture[0]"
    cause = ("TypeError: create_weights() got an unexpected keyword argument 'with_bias' "
             "(sglang/srt/layers/moe/fused_moe_triton/layer.py:321)")
    assert text.count("log line 299") == 2, text  # the first test's message and its log section only
    assert text.count("Captured sglang log") == 1, text
    one_liners = [line for line in result.outlines if line.startswith("E   Eagle3StartCauseSeen: ")
                  or line.startswith("Eagle3StartCauseSeen: ")]
    assert len(one_liners) == 4 and all(first in line for line in one_liners), text
    assert sum("was not started" in line for line in one_liners) == 2, text
    assert sum("already reported" in line and cause in line for line in one_liners) == 2, text
    assert f"SGLang could not start on this tier: {cause}, in 5 of 5 engine configurations" in result.outlines, text
    assert "  2 of them not started: same startup path as one that failed" in result.outlines, text


XDIST_STUB_SGLANG = '''

@pytest.fixture(scope="session")
def eagle3_sglang():
    import sys
    from pytest_eagle3.sglang_source.install import SGLangInstall

    return SGLangInstall("0.5.23", "/nowhere/sglang", frozenset(), sys.executable)
'''


def test_bad_target_under_xdist(pytester: pytest.Pytester, tmp_path: Path) -> None:
    # xdist workers do not raise the usage error (the controller would show an
    # INTERNALERROR wall); each test's setup error is the same one line instead.
    pytest.importorskip("xdist")
    result = run_suite(pytester, tmp_path / "cache", "--eagle3-target", "no-such-preset", "-n", "2",
                       conftest=XDIST_STUB_SGLANG)
    message = UNKNOWN_TARGET_MSG.format(value="no-such-preset", known=", ".join(list_presets()))
    assert_each_setup_error_is(result, f"Eagle3ConfigError: {message}")


@pytest.fixture(scope="module")
def probed_flags(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The installed SGLang's flag list, probed once for the module (``launch_server
    --help``: about 6 s, which each child with a fresh cache would otherwise spend
    before the check under test); ``None`` without SGLang (nothing to probe)."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return None
    cache_dir = tmp_path_factory.mktemp("flags")
    probe(cache_dir)
    return cache_dir / "sglang-flags"


@pytest.mark.parametrize(("name", "text", "error"), [
    ("p.json", "{not json", "not JSON: "),
    ("p.json", '{"prompts": 3}', 'expected {"prompts": [...]} or a JSON list of prompts'),
    ("p.json", '{"prompts": []}', "no prompts"),
    ("p.json", '{"prompts": [[1, 2], [3, -1]]}', "prompt 1 must be a non-empty list of non-negative token ids or text"),
    ("p.json", '[[1, 2], [3, 999999]]', "prompt 1 has id 999999 >= the target's vocab_size 2048"),
    ("p.txt", "hello world\n", "prompt 0 is text, but the target (a synthetic preset) has no tokenizer"),
])
def test_bad_prompts_file_is_one_line_before_any_engine(pytester: pytest.Pytester, tmp_path: Path,
                                                         probed_flags: Path | None,
                                                         name: str, text: str, error: str) -> None:
    prompts = tmp_path / name
    prompts.write_text(text)
    result = run_suite(pytester, tmp_path / "cache", "--eagle3-prompts", str(prompts), flags=probed_flags)
    line = next((x for x in result.errlines if x.startswith("ERROR: ")), output(result))
    assert line.startswith(f"ERROR: --eagle3-prompts: prompts file {prompts} is invalid: ") and error in line, line
    assert_usage_error(result, line[len("ERROR: "):])


def test_an_empty_prompts_path_is_a_usage_error(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = run_suite(pytester, tmp_path / "cache", "--eagle3-prompts", "")
    assert_usage_error(result, "--eagle3-prompts: expected a file of prompts, got an empty path")


def test_a_draft_whose_config_is_not_json_is_one_line_before_collection(pytester: pytest.Pytester,
                                                                       tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{\n oops")
    result = run_suite(pytester, tmp_path / "cache", "--eagle3-draft", str(draft), "--eagle3-stack", "speculators")
    line = next((x for x in result.errlines if x.startswith("ERROR: ")), output(result))
    assert line.startswith(f"ERROR: --eagle3-draft: draft config {draft / 'config.json'} is invalid: "), line
    assert_usage_error(result, line[len("ERROR: "):])
