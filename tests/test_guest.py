"""pytest-eagle3 is a guest in every environment it is installed in.

A ``pytest11`` plugin loads for every project of the environment (a fork's own
test suite included), so its hooks touch only items that use its ``eagle3_*``
fixtures: another project's ``slow``, ``gpu`` and ``tp`` marks keep their
meaning, its order is kept, and ``-m gpu`` on a machine without a GPU is only
refused when it selects pytest-eagle3's own tests.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.plugin import hooks
from pytest_eagle3.plugin.session import Eagle3Session

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")

#: A fork's own tests: its own marks, registered its own way, some with a
#: ``tp`` mark taking arguments pytest-eagle3 would reject.
FOREIGN = """
import pytest

def pytest_configure(config):
    pass

@pytest.mark.slow
def test_slow():
    pass

@pytest.mark.gpu
def test_gpu():
    pass

@pytest.mark.tp(16)
def test_tp16():
    pass

@pytest.mark.tp("ring")
def test_tp_ring():
    pass

@pytest.mark.parametrize("n", [3, 1, 2])
def test_order(n):
    pass

def test_z_last():
    pass
"""

FOREIGN_INI = """
[pytest]
markers =
    slow: the fork's slow tests
    gpu: the fork's GPU tests
    tp: the fork's tensor-parallel tests
"""


def _outcomes(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if "::" in line and (" PASSED" in line or " SKIPPED" in line
                                                                        or " FAILED" in line or " ERROR" in line)]


@pytest.mark.parametrize("extra", [[], ["-m", "gpu"], ["-m", "slow"], ["--tp", "2"], ["-m", "not slow"]])
def test_foreign_outcomes_unchanged(pytester: pytest.Pytester, extra: list[str]) -> None:
    pytester.makepyfile(test_fork=FOREIGN)
    pytester.makeini(FOREIGN_INI)
    args = ["-v", "-p", "no:cacheprovider", *extra]
    with_plugin = pytester.runpytest_subprocess(*args)
    extra_without = [a for a in args if a not in ("--tp", "2")]
    without = pytester.runpytest_subprocess("-p", "no:eagle3", *extra_without)
    assert with_plugin.ret == without.ret, with_plugin.stdout.str() + with_plugin.stderr.str()
    assert _outcomes(with_plugin) == _outcomes(without), with_plugin.stdout.str()
    assert "eagle3 left out" not in with_plugin.stdout.str()


def test_session_plugin_is_hashable(pytestconfig: pytest.Config) -> None:
    one, two = Eagle3Session(pytestconfig), Eagle3Session(pytestconfig)
    assert len({one, two}) == 2 and {one: 1}[one] == 1


OWN = """
import pytest

@pytest.mark.gpu
def test_uses_target(eagle3_target):
    pass
"""


def test_minus_m_gpu_without_a_gpu_stops_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own=OWN)
    result = pytester.runpytest_subprocess("-m", "gpu", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*" + hooks.MSG_GPU_NONE.format(how="*").split("(")[0] + "*--device cpu*"])
    on_cpu = pytester.runpytest_subprocess("-m", "gpu", "--device", "cpu", "-p", "no:cacheprovider",
                                           "--collect-only", "-q")
    assert on_cpu.ret == 0, on_cpu.stdout.str() + on_cpu.stderr.str()
    on_cpu.stdout.fnmatch_lines(["test_own.py::test_uses_target"])


def test_packaged_suite_carries_the_gpu_mark(pytester: pytest.Pytester) -> None:
    """Every packaged test is part of the GPU suite: ``-m gpu --device cpu`` collects
    exactly what the plain run collects."""
    plain = pytester.runpytest_subprocess("--pyargs", "pytest_eagle3.suite", "--device", "cpu", "--tp", "2",
                                          "--collect-only", "-q", "-p", "no:cacheprovider")
    gpu = pytester.runpytest_subprocess("--pyargs", "pytest_eagle3.suite", "--device", "cpu", "--tp", "2",
                                        "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert plain.ret == gpu.ret == 0, gpu.stdout.str() + gpu.stderr.str()
    ids = [line for line in plain.stdout.lines if "::" in line]
    assert ids and ids == [line for line in gpu.stdout.lines if "::" in line]
