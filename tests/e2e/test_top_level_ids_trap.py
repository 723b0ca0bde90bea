"""The MLA draft's top-level-ids trap, caught by the packaged suite on the real engine.

The shipped MLA draft (SGLang's ``Eagle3DeepseekV2ForCausalLM``) with its ids
moved from ``eagle_config`` to the top level of ``config.json``: SGLang loads
it (its ``fc`` is still sized for the three ids, ``kimi_k25_eagle3.py``
``_get_eagle_aux_layer_count``) and its target side captures the default layers
(it reads only ``eagle_config``).  Given as ``--eagle3-draft`` with the contract
it was trained on, the suite's contract test must fail and say so, naming the
files that read each key and the fix.  One TP 1 engine (about 1 minute).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.draft_files import with_top_level_ids
from tests.inner_run import run_inner

pytestmark = pytest.mark.e2e

TEST = "test_draft_receives_its_training_contract[tp1-your-draft]"


def test_top_level_ids_fail_the_suite_with_the_trap_named(tmp_path: Path) -> None:
    from pytest_eagle3.draft import shipped_draft_dir
    from pytest_eagle3.sglang_source import id_keys
    from pytest_eagle3.sglang_source.install import sglang_location_and_version

    location, _ = sglang_location_and_version()
    if location is None or not id_keys.has_draft_model(location, "Eagle3DeepseekV2ForCausalLM"):
        pytest.skip("the installed SGLang has no srt/models/kimi_k25_eagle3.py")
    draft = with_top_level_ids(shipped_draft_dir("tiny-dsv3-mla"), tmp_path / "mla-top-level-ids")
    run = run_inner(tmp_path, ["--pyargs", "pytest_eagle3.suite", "--eagle3-draft", str(draft),
                               "--eagle3-stack", "raw", "-k", "your-draft", "--tp", "1"])
    assert run.outcomes.get(TEST) == "failed", (run.outcomes, run.output[-3000:])
    message = run.messages[TEST]
    for needle in ("only at the top level", "the draft's fc is sized for them", "srt/models/kimi_k25_eagle3.py:",
                   "spec_aux_hidden_state.py:", "captures its default layers",
                   "move the ids under eagle_config.eagle_aux_hidden_state_layer_ids", "slot 0"):
        assert needle in message, message
