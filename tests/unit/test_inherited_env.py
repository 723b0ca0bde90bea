"""engine/inherited_env.py: no engine inherits SGLang's simulated-acceptance knobs.

SGLang 0.5.23 replaces the verify's acceptance with a simulated one when
``SGLANG_SIMULATE_ACC_LEN`` is set (``srt/speculative/spec_utils.py:276-278``);
the suite's accept lengths must be measured.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pytest_eagle3.engine.inherited_env import describe_removed, engine_environ, simulated_acceptance
from pytest_eagle3.engine.server import SGLangServer

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")


def test_simulated_acceptance_variables_are_removed_and_the_rest_kept() -> None:
    runner = {"SGLANG_SIMULATE_ACC_LEN": "3", "SGLANG_SIMULATE_ACC_METHOD": "multinomial",
              "SGLANG_SIMULATE_ACC_TOKEN_MODE": "1", "SGLANG_OTHER": "x", "PATH": "/bin"}
    env = engine_environ(runner, {"TMPDIR": "/t", "SGLANG_SIMULATE_ACC_LEN": "2"})
    assert env == {"SGLANG_OTHER": "x", "PATH": "/bin", "TMPDIR": "/t"}
    assert list(simulated_acceptance(runner)) == [
        "SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD", "SGLANG_SIMULATE_ACC_TOKEN_MODE"]
    assert describe_removed({"PATH": "/bin"}) is None
    assert describe_removed({"SGLANG_SIMULATE_ACC_LEN": "3"}) == "SGLANG_SIMULATE_ACC_LEN=3"


def test_the_spawned_server_process_does_not_see_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real spawn path: the "interpreter" is a script that writes its environment and exits."""
    dump = tmp_path / "env.txt"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nenv > {dump}\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3")
    monkeypatch.setenv("EAGLE3_KEPT", "yes")
    server = SGLangServer("s", {}, log_dir=tmp_path, python=str(python), env={"SGLANG_SIMULATE_ACC_METHOD": "m"})
    server.spawn()
    try:
        server.proc.wait(timeout=30)
    finally:
        server.stop()
    seen = dump.read_text()
    assert "EAGLE3_KEPT=yes" in seen and "SGLANG_SIMULATE_ACC" not in seen


def test_the_header_says_what_was_removed(monkeypatch: pytest.MonkeyPatch, pytester: pytest.Pytester) -> None:
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess()
    assert result.ret == 0
    result.stdout.fnmatch_lines(["eagle3: SGLANG_SIMULATE_ACC_LEN=3 set here: removed from every engine's "
                                 "environment (SGLang would simulate the accept length, *); accept lengths here "
                                 "are measured"])
    monkeypatch.delenv("SGLANG_SIMULATE_ACC_LEN")
    result = pytester.runpytest_subprocess()
    assert result.ret == 0 and "SIMULATE" not in result.stdout.str()
