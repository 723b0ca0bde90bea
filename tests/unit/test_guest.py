"""pytest-eagle3 is a guest in every environment it is installed in.

A ``pytest11`` plugin loads for every project of the environment (a fork's own
test suite included), so its hooks touch only items that use its ``eagle3_*``
fixtures: another project's ``slow``, ``gpu`` and ``tp`` marks keep their
meaning, its order is kept, and ``-m gpu`` on a machine without a GPU is only
refused when it selects pytest-eagle3's own tests.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.plugin.run import Eagle3Run
from pytest_eagle3.plugin.validate import MSG_GPU_NONE

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
    one, two = Eagle3Run(pytestconfig), Eagle3Run(pytestconfig)
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
    result.stderr.fnmatch_lines(["*" + MSG_GPU_NONE.format(how="*").split("(")[0] + "*--device cpu*"])
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


#: An ML project's conftest that defines the short spellings pytest-eagle3 is known by.
OWN_OPTIONS_CONFTEST = """
import pytest

def pytest_addoption(parser):
    parser.addoption("--device", default="cuda", help="the project's device")
    parser.addoption("--tp", type=int, default=1, help="the project's TP size")

@pytest.fixture
def device(request):
    return request.config.getoption("--device")

@pytest.fixture
def tp(request):
    return request.config.getoption("--tp")
"""

OWN_OPTIONS_TESTS = """
def test_device(device):
    assert device == "meta"

def test_tp(tp):
    assert tp == 3
"""


def test_a_projects_own_device_and_tp_win(pytester: pytest.Pytester) -> None:
    """A conftest that defines ``--device`` and ``--tp`` keeps them: pytest runs,
    the outcomes are those of ``-p no:eagle3``, and the header names
    pytest-eagle3's own spellings."""
    pytester.makeconftest(OWN_OPTIONS_CONFTEST)
    pytester.makepyfile(test_own=OWN_OPTIONS_TESTS)
    args = ["-v", "-p", "no:cacheprovider", "--device", "meta", "--tp", "3"]
    with_plugin = pytester.runpytest_subprocess(*args)
    without = pytester.runpytest_subprocess("-p", "no:eagle3", *args)
    assert without.ret == 0, without.stdout.str() + without.stderr.str()
    assert with_plugin.ret == 0, with_plugin.stdout.str() + with_plugin.stderr.str()
    assert _outcomes(with_plugin) == _outcomes(without)
    with_plugin.stdout.fnmatch_lines([
        "eagle3: --tp belongs to custom options (a conftest's parser.addoption) here; pytest-eagle3's is --eagle3-tp",
        "eagle3: --device belongs to custom options (a conftest's parser.addoption) here; pytest-eagle3's is --eagle3-device",
    ])
    assert "--sglang-arg belongs" not in with_plugin.stdout.str()
    # pytest-eagle3's own names still work beside the project's.
    both = pytester.runpytest_subprocess(*args, "--eagle3-tp", "2", "--eagle3-device", "cpu")
    assert both.ret == 0, both.stdout.str() + both.stderr.str()
    both.stdout.fnmatch_lines(["eagle3: device cpu (from cli), tp 2 (from cli), *"])


def test_short_spellings_work_where_free(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--tp", "2", "--device", "cpu", "--sglang-arg", "a=1")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["eagle3: device cpu (from cli), tp 2 (from cli), *", "eagle3: sglang args a=1 (from cli)"])
    assert "belongs to" not in result.stdout.str()
