"""One root cause, one failure, on the real engine: SGLang's captures disagree with
the id rule the suite read.

The inner run loads a plugin (``-p wrongrule``) that makes the rule reader
answer "always +1" for the installed SGLang, whose DeepSeek model really keeps
ids that do not start with 1 (0.5.23).  For ids ``[0, 3, 5]`` SGLang then
captures ``hs[0], hs[3], hs[5]`` where the rule says ``hs[1], hs[4], hs[6]``:
``test_capture_order`` must be the one failure, naming both and the rule's
source, and ``test_contracts`` must follow the measurement (the contract
*is* what SGLang captured) instead of failing for the same cause.
"""

from __future__ import annotations

import pytest

from tests.inner_run import InnerRun, run_inner

pytestmark = pytest.mark.e2e

WRONG_RULE_PLUGIN = '''
from pytest_eagle3.conventions import rule_for_version
from pytest_eagle3.sglang_source.install import SGLangInstall

_wrong = rule_for_version("0.5.12")  # always +1, layer 0 not capturable


def pytest_configure(config):
    SGLangInstall.id_rule = lambda self, architecture="DeepseekV3ForCausalLM": _wrong
'''


@pytest.fixture(scope="module")
def inner(tmp_path_factory: pytest.TempPathFactory) -> InnerRun:
    pytest.importorskip("sglang")
    work = tmp_path_factory.mktemp("wrong-rule")
    return run_inner(work, ["--pyargs", "pytest_eagle3.suite", "-p", "wrongrule", "--tp", "1", "-k",
                            "kimi-embedding-first and (test_capture_order or test_draft_receives)"],
                     files={"wrongrule.py": WRONG_RULE_PLUGIN}, env={"PYTHONPATH": str(work)})


def test_capture_order_is_the_one_failure_and_names_both(inner: InnerRun) -> None:
    failed = {n: o for n, o in inner.outcomes.items() if o in ("failed", "error")}
    assert list(failed) == ["test_capture_order[tp1-kimi-embedding-first]"], inner.output[-3000:]
    message = inner.messages["test_capture_order[tp1-kimi-embedding-first]"]
    assert "3 of 3 slots differ from the id rule read from version table for upstream sglang 0.5.12" in message
    assert "SGLang captured [hs[0], hs[3], hs[5]], the rule says [hs[1], hs[4], hs[6]]" in message, message


def test_the_contract_test_follows_the_measurement(inner: InnerRun) -> None:
    assert inner.outcomes["test_draft_receives_its_training_contract[tp1-kimi-embedding-first]"] == "passed", \
        inner.output[-3000:]
