"""The eagle3 option group: --help, one-line usage errors, settings and their sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_eagle3.engine import gpus
from pytest_eagle3.engine.gpus import detect_gpus
from pytest_eagle3.plugin import validate
from pytest_eagle3.plugin.parsers import MSG_BAD_PP, MSG_BAD_SGLANG_ARG, MSG_BAD_TIMEOUT, MSG_BAD_TP, parse_sglang_arg
from pytest_eagle3.plugin.resolve import MSG_PP_DISAGREE
from pytest_eagle3.plugin.validate import MSG_NO_GPU, check_tp_divides
from pytest_eagle3.settings import GpuProbe, Settings

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")

# An inner test that dumps the resolved settings.
DUMP_SETTINGS = """
import json
from pytest_eagle3.plugin.run import get_settings

def test_dump(pytestconfig):
    s = get_settings(pytestconfig)
    with open("settings.json", "w") as fh:
        json.dump({
            "tp": s.tp, "pp": s.pp, "device": s.device, "target": s.target, "cache_dir": str(s.cache_dir),
            "rebuild": s.rebuild, "sglang_args": [list(p) for p in s.sglang_args],
            "startup_timeout": s.startup_timeout, "sources": dict(s.sources), "cpu_norm": s.cpu_norm,
        }, fh)
"""


def run_settings(pytester: pytest.Pytester, *args: str) -> dict:
    pytester.makepyfile(test_dump=DUMP_SETTINGS)
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    return json.loads((pytester.path / "settings.json").read_text())


def usage_error_lines(result: pytest.RunResult) -> list[str]:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    return [line for line in result.stderr.lines if line.strip()]


def test_help_shows_group_and_flags(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "EAGLE-3 aux hidden states (pytest-eagle3):",
        "  --eagle3-tp=N *",
        "  --eagle3-device=cpu|cuda*",
        "  --eagle3-target=PRESET|PATH",
        "  --eagle3-cache=DIR *",
        "  --eagle3-rebuild *",
        "  --eagle3-sglang-arg=KEY=VALUE",
        "  --eagle3-startup-timeout=SECONDS",
    ])
    # The short spellings, where no other option has them (here: none has).
    result.stdout.fnmatch_lines(["  --tp=N *short for --eagle3-tp*", "  --device=cpu|cuda *short for --eagle3-device*",
                                 "  --sglang-arg=KEY=VALUE*"])
    result.stdout.fnmatch_lines(["  eagle3_target (string):*", "  eagle3_sglang_args (linelist):*"])


def test_help_works_on_a_broken_install(pytester: pytest.Pytester) -> None:
    # Shadow torch, transformers and sglang with modules that fail to import.
    for name in ("torch", "transformers"):
        pytester.makepyfile(**{name: "raise ImportError('broken on purpose')"})
    (pytester.path / "sglang").mkdir()
    (pytester.path / "sglang" / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    # --device cuda with no GPU is not validated under --help either.
    result = pytester.runpytest_subprocess("--help", "--device", "cuda")
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(["*--eagle3-target=PRESET|PATH*"])
    result = pytester.runpytest_subprocess("--co", "-q")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()


def test_plugin_modules_do_not_import_heavy_packages() -> None:
    code = (
        "import sys, pytest_eagle3.plugin.hooks, pytest_eagle3.plugin.options, pytest_eagle3.plugin.session, "
        "pytest_eagle3.verdicts.compare\n"
        "heavy = [m for m in ('torch', 'transformers', 'sglang') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("flag", ["--tp", "--eagle3-tp"])
@pytest.mark.parametrize("value", ["3", "two", "0"])
def test_bad_tp_is_one_line_naming_the_flag(pytester: pytest.Pytester, value: str, flag: str) -> None:
    result = pytester.runpytest_subprocess(flag, value)
    expected = MSG_BAD_TP.format(choices="1, 2, 4 or 8", value=value)
    assert usage_error_lines(result) == [f"ERROR: {expected}"]
    assert expected.startswith("--eagle3-tp/--tp: expected one of 1, 2, 4 or 8")


def test_bad_pp_is_one_line_naming_the_flag(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--pp", "0")
    assert usage_error_lines(result) == ["ERROR: " + MSG_BAD_PP.format(value="0")]


def test_pp_size_among_the_server_args_is_the_pp_of_the_run(pytester: pytest.Pytester) -> None:
    """``--sglang-arg pp_size=2`` is ``--pp 2`` (the PP gate is read for it too); the two must agree."""
    s = run_settings(pytester, "--sglang-arg", "pp-size=2")
    assert s["pp"] == 2 and s["sglang_args"] == [["pp_size", 2]]
    result = pytester.runpytest_subprocess("--pp", "2", "--sglang-arg", "pp_size=4")
    assert usage_error_lines(result) == ["ERROR: " + MSG_PP_DISAGREE.format(pp=2, value=4)]


def test_sglang_arg_without_equals(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--sglang-arg", "foo")
    assert usage_error_lines(result) == ["ERROR: " + MSG_BAD_SGLANG_ARG.format(value="foo")]


def test_bad_device(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--device", "tpu")
    (line,) = usage_error_lines(result)
    assert line == "ERROR: --eagle3-device/--device: expected one of cpu|cuda|auto, got 'tpu'"


def test_bad_startup_timeout(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--eagle3-startup-timeout", "-5")
    expected = MSG_BAD_TIMEOUT.format(flag="--eagle3-startup-timeout", value="-5")
    assert usage_error_lines(result) == [f"ERROR: {expected}"]


def test_device_cuda_without_gpu_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--device", "cuda")
    expected = MSG_NO_GPU.format(probe="CUDA_VISIBLE_DEVICES=''")
    assert usage_error_lines(result) == [f"ERROR: {expected}"]


def test_cache_that_cannot_be_a_directory(pytester: pytest.Pytester) -> None:
    blocker = pytester.path / "afile"
    blocker.write_text("")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--eagle3-cache", str(blocker / "cache"))
    (line,) = usage_error_lines(result)
    assert line.startswith(f"ERROR: eagle3 cache {blocker / 'cache'} (from cli) is not writable: ")
    assert line.endswith("pass --eagle3-cache DIR or set PYTEST_EAGLE3_CACHE to a writable directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_cache_without_permission(pytester: pytest.Pytester, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--eagle3-cache", str(locked / "cache"))
    (line,) = usage_error_lines(result)
    assert "is not writable" in line


def test_defaults(pytester: pytest.Pytester) -> None:
    s = run_settings(pytester)
    assert s["tp"] == 1
    assert s["device"] == "cpu"
    assert s["target"] == "tiny-dsv3"
    assert s["cache_dir"] == str(pytester.path / ".cache" / "pytest-eagle3")  # pytester sets HOME
    assert s["rebuild"] is False
    assert s["sglang_args"] == []
    assert s["startup_timeout"] == 600.0
    assert set(s["sources"].values()) == {"default"}


def test_cli_values_and_sources(pytester: pytest.Pytester, tmp_path: Path) -> None:
    s = run_settings(
        pytester, "--tp", "2", "--device", "cpu", "--eagle3-target", "/models/x",
        "--eagle3-cache", str(tmp_path / "c"), "--eagle3-rebuild",
        "--sglang-arg", "disable-cuda-graph=true", "--sglang-arg", "mem_fraction_static=0.5",
        "--sglang-arg", "attention_backend=intel_amx", "--sglang-arg", "ids=[3, 31]",
        "--eagle3-startup-timeout", "90", "--eagle3-cpu-norm", "native", "--pp", "2",
    )
    assert (s["tp"], s["pp"], s["device"], s["target"], s["rebuild"], s["startup_timeout"], s["cpu_norm"]) == (
        2, 2, "cpu", "/models/x", True, 90.0, "native"
    )
    assert s["cache_dir"] == str(tmp_path / "c")
    assert s["sglang_args"] == [
        ["disable_cuda_graph", True], ["mem_fraction_static", 0.5],
        ["attention_backend", "intel_amx"], ["ids", [3, 31]], ["pp_size", 2],  # --pp is SGLang's --pp-size
    ]
    assert set(s["sources"].values()) == {"cli"}


def test_env_beats_ini_and_cli_beats_env(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytester.makeini(
        "[pytest]\neagle3_target = ini-preset\neagle3_cache = rel/cache\n"
        "eagle3_startup_timeout = 30\neagle3_sglang_args =\n    tp_size=1\n    log_level=debug\n"
    )
    s = run_settings(pytester)
    assert (s["target"], s["sources"]["target"]) == ("ini-preset", "ini")
    assert (s["cache_dir"], s["sources"]["cache_dir"]) == (str(pytester.path / "rel" / "cache"), "ini")
    assert (s["startup_timeout"], s["sources"]["startup_timeout"]) == (30.0, "ini")
    assert s["sglang_args"] == [["tp_size", 1], ["log_level", "debug"]]

    monkeypatch.setenv("PYTEST_EAGLE3_TARGET", "env-preset")
    monkeypatch.setenv("PYTEST_EAGLE3_CACHE", str(tmp_path / "envcache"))
    s = run_settings(pytester, "--sglang-arg", "log_level=info")
    assert (s["target"], s["sources"]["target"]) == ("env-preset", "env")
    assert (s["cache_dir"], s["sources"]["cache_dir"]) == (str(tmp_path / "envcache"), "env")
    assert s["sglang_args"][-1] == ["log_level", "info"]  # later pairs win
    assert s["sources"]["sglang_args"] == "ini+cli"

    s = run_settings(pytester, "--eagle3-target", "cli-preset", "--device", "auto")
    assert (s["device"], s["sources"]["device"]) == ("cpu", "default")
    assert (s["target"], s["sources"]["target"]) == ("cli-preset", "cli")


def test_xdg_cache_home(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    s = run_settings(pytester)
    assert s["cache_dir"] == str(tmp_path / "xdg" / "pytest-eagle3")


# --- pure helpers ---


@pytest.mark.parametrize(
    ("text", "pair"),
    [
        ("a=1", ("a", 1)),
        ("a=1.5", ("a", 1.5)),
        ("a=true", ("a", True)),
        ("a=null", ("a", None)),
        ("a=", ("a", "")),
        ("a=triton", ("a", "triton")),
        ("a={\"k\": [1]}", ("a", {"k": [1]})),
        ("a=x=y", ("a", "x=y")),
        ("--enable-foo=1", ("enable_foo", 1)),
    ],
)
def test_parse_sglang_arg(text: str, pair: tuple) -> None:
    assert parse_sglang_arg(text) == pair


@pytest.mark.parametrize("text", ["foo", "=1", "a b=1", ""])
def test_parse_sglang_arg_rejects(text: str) -> None:
    with pytest.raises(pytest.UsageError, match="^--sglang-arg: expected KEY=VALUE"):
        parse_sglang_arg(text)


def test_check_tp_divides() -> None:
    assert check_tp_divides(4, 16) is None
    assert check_tp_divides(8, 12) == (
        "--tp 8 does not divide the target's 12 attention heads; use --tp 1, 2 or 4"
    )


@pytest.mark.parametrize("visible", ["", "-1"])
def test_detect_gpus_honours_hidden_devices(visible: str) -> None:
    probe = detect_gpus({"CUDA_VISIBLE_DEVICES": visible})
    assert probe.count == 0
    assert probe.how == f"CUDA_VISIBLE_DEVICES={visible!r}"


def test_detect_gpus_caps_by_visible_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "_physical_gpus", lambda: (8, "nvidia-smi -L: 8 GPUs"))
    probe = detect_gpus({"CUDA_VISIBLE_DEVICES": "2,3"})
    assert probe.count == 2
    assert probe.how == "nvidia-smi -L: 8 GPUs, CUDA_VISIBLE_DEVICES='2,3'"
    assert detect_gpus({}).count == 8


def test_too_few_gpus_for_tp() -> None:
    settings = Settings(tp=4, device="cuda", gpu=GpuProbe(2, "nvidia-smi -L: 2 GPUs"))
    with pytest.raises(pytest.UsageError) as info:
        validate.validate_settings(settings)
    assert str(info.value) == (
        "--tp 4 needs 4 GPUs on --device cuda but 2 are visible (nvidia-smi -L: 2 GPUs); "
        "lower --tp or make more GPUs visible"
    )


def test_cache_problem(tmp_path: Path) -> None:
    assert validate.cache_problem(tmp_path / "not" / "yet") is None
    (tmp_path / "f").write_text("")
    assert validate.cache_problem(tmp_path / "f" / "x") == f"{tmp_path / 'f'} is not a directory"


def test_cpu_norm_path_from_env_and_its_bad_value(pytester: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``PYTEST_EAGLE3_CPU_NORM_PATH`` sets the norm path (source "env"); a value
    outside auto/inplace/native is a usage error naming the variable."""
    monkeypatch.setenv("PYTEST_EAGLE3_CPU_NORM_PATH", "native")
    s = run_settings(pytester)
    assert (s["cpu_norm"], s["sources"]["cpu_norm"]) == ("native", "env")
    monkeypatch.setenv("PYTEST_EAGLE3_CPU_NORM_PATH", "fast")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only")
    result.stderr.fnmatch_lines(["*PYTEST_EAGLE3_CPU_NORM_PATH='fast': expected auto, inplace*native*"])


def test_the_gpu_probe_runs_once_per_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # -n auto, --eagle3-list-variants and pytest_configure each resolve settings;
    # the GPU probe (nvidia-smi) behind them runs once.
    from pytest_eagle3.plugin import resolve
    from pytest_eagle3.settings import GpuProbe

    calls = []
    monkeypatch.setattr(resolve, "detect_gpus", lambda env: calls.append(1) or GpuProbe(0, "test"))
    config = pytester.parseconfig("--eagle3-device", "cpu")
    first = resolve.resolve_settings(config, validate=False)
    second = resolve.resolve_settings(config, validate=False)
    assert first.gpu is second.gpu and len(calls) == 1
