"""Older SGLang releases: feature detection, one-line reasons, and the SGLang 0.5.9 verdicts.

Nothing here starts SGLang: installs are fake package directories holding the
few files feature detection reads (``srt/plugins/__init__.py``,
``srt/models/deepseek_v2.py``).  The real releases run in the tox envs
(``tox -e sglang0509``; docs/compatibility.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from fake_model_files import like_release, write_deepseek_file

import pytest

from pytest_eagle3.planning import declare
from pytest_eagle3.planning.collect import PORTABLE_NOT_NEEDED, PORTABLE_USER_DRAFT, collect_reason
from pytest_eagle3.planning.request import resolve
from pytest_eagle3.engine.config import build_engine_config
from pytest_eagle3.sglang_source.install import SGLangInstall
from pytest_eagle3.worker.sglang_hooks import IMPORT_HOOK_LOADER, PLUGIN_LOADER, SITE_HOOK_DIR
from pytest_eagle3.settings import Settings
from pytest_eagle3.target.spec import TargetSpec

FLAGS = frozenset({"model-path", "tp-size", "device", "skip-tokenizer-init", "disable-radix-cache", "random-seed",
                   "enable-return-hidden-states", "speculative-algorithm", "speculative-draft-model-path",
                   "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens",
                   "attention-backend", "dtype", "disable-custom-all-reduce", "disable-cuda-graph",
                   "mem-fraction-static", "max-total-tokens", "skip-server-warmup", "sleep-on-idle"})


def fake_sglang(root: Path, *, plugins: bool, eagle3: bool = True, version: str = "0.5.9",
                flags: frozenset[str] = FLAGS) -> SGLangInstall:
    pkg = root / "sglang"
    write_deepseek_file(pkg, eagle3=eagle3, **like_release(version))
    if plugins:
        (pkg / "srt" / "plugins").mkdir()
        (pkg / "srt" / "plugins" / "__init__.py").write_text("def load_plugins():\n    pass\n")
    return SGLangInstall(version, str(pkg), flags, sys.executable)


def test_hooks_reach_workers_through_sitecustomize_without_sglang_plugins(tmp_path):
    old = fake_sglang(tmp_path / "old", plugins=False)
    new = fake_sglang(tmp_path / "new", plugins=True, version="0.5.23")
    assert (old.general_plugins, old.hook_loader) == (False, IMPORT_HOOK_LOADER)
    assert (new.general_plugins, new.hook_loader) == (True, PLUGIN_LOADER)
    cfg_old = build_engine_config(old, model_path="/m", tp=2, device="cpu")
    cfg_new = build_engine_config(new, model_path="/m", tp=2, device="cpu")
    assert cfg_old.env_dict()["PYTHONPATH"].split(":")[0] == str(SITE_HOOK_DIR)
    assert str(SITE_HOOK_DIR) not in cfg_new.env_dict()["PYTHONPATH"]
    assert (SITE_HOOK_DIR / "sitecustomize.py").is_file()


def _ctx(install: SGLangInstall, tp: int = 1) -> declare.NeedContext:
    return declare.NeedContext(Settings(tp=2, device="cpu"), tp, install, TargetSpec.preset("tiny-dsv3").facts)


def test_release_without_deepseek_eagle3_is_one_line(tmp_path):
    install = fake_sglang(tmp_path, plugins=False, eagle3=False, version="0.5.4")
    reason = collect_reason(declare.case_needs()[0], _ctx(install))
    assert reason is not None and "\n" not in reason
    assert "0.5.4" in reason and "set_eagle3_layers_to_capture" in reason


def test_release_without_any_hidden_state_return_is_one_line(tmp_path):
    install = fake_sglang(tmp_path, plugins=False, flags=FLAGS - {"enable-return-hidden-states"})
    reason = collect_reason(declare.case_needs()[0], _ctx(install))
    assert reason is not None and "\n" not in reason
    assert "0.5.9" in reason and "--enable-return-hidden-states" in reason


def test_seed_era_contract_is_reported_not_servable_with_inspects_fix(tmp_path):
    """0.5.9: the embedding-first contract is one layer late in every slot, and the fix
    `inspect` proposes is an upgrade (no id list works there)."""
    install = fake_sglang(tmp_path, plugins=False)
    need = next(n for n in declare.case_needs() if n.case == "kimi-embedding-first")
    request = resolve(need, _ctx(install))
    assert request.expected == (0, 3, 5) and request.predicted == (1, 4, 6)
    assert "not servable on this SGLang" in request.xfail_reason
    assert "no id list works on it; on an SGLang whose model captures layer 0 (upstream >= 0.5.14)" \
        in request.xfail_reason
    assert "srt/models/deepseek_v2.py:" in request.xfail_reason  # the rule's source, read from the file


def test_seed_era_acceptance_is_a_known_incompatibility(tmp_path):
    """The shipped draft (kimi-embedding-first, ids [0, 3, 5]) on 0.5.9 is fed hs[1], hs[4],
    hs[6]: the acceptance tests expect the collapse; on 0.5.23 they expect the gate to hold."""
    old = resolve(declare.acceptance_need(), _ctx(fake_sglang(tmp_path / "a", plugins=False)))
    new = resolve(declare.acceptance_need(),
                          _ctx(fake_sglang(tmp_path / "b", plugins=True, version="0.5.23")))
    assert old.expected == new.expected == (0, 3, 5)
    assert old.predicted == (1, 4, 6) and "hs[1], hs[4], hs[6]" in old.xfail_reason
    assert new.predicted == (0, 3, 5) and new.xfail_reason is None


def _run_python(tmp_path: Path, code: str, env_extra: dict[str, str], extra_path: list[Path] = ()) -> str:
    import os
    import subprocess

    fake = tmp_path / "fake"
    (fake / "sglang" / "srt").mkdir(parents=True, exist_ok=True)
    for init in (fake / "sglang" / "__init__.py", fake / "sglang" / "srt" / "__init__.py"):
        init.write_text("")
    (fake / "sglang" / "srt" / "server_args.py").write_text("VALUE = 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_EAGLE3")}
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_HOOK_DIR), *map(str, extra_path), str(fake),
                                         str(Path(__file__).resolve().parents[2])])
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


CHECK = ("import sys; loaded = 'pytest_eagle3.worker.sglang_hooks' in sys.modules; import sglang.srt.server_args; "
         "h = sys.modules.get('pytest_eagle3.worker.sglang_hooks'); "
         "print(loaded, h is not None and h._loaded, getattr(sys, 'eagle3_chained', False))")


def test_sitecustomize_is_inert_without_the_hooks_variable(tmp_path):
    assert _run_python(tmp_path, CHECK, {}) == "False False False"


def test_sitecustomize_loads_hooks_when_server_args_is_imported(tmp_path):
    """The hook set ``none`` names nothing to install: load() runs and installs nothing."""
    assert _run_python(tmp_path, CHECK, {"PYTEST_EAGLE3_SGLANG_HOOKS": "none"}) == "True True False"


def test_sitecustomize_still_runs_the_environments_own(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import sys\nsys.eagle3_chained = True\n")
    assert _run_python(tmp_path, CHECK, {}, extra_path=[own]).endswith("True")


def test_seed_era_xfail_names_the_late_slots_and_the_missing_embedding():
    """What 0.5.9 serves the embedding-first contract (measured: hs[1], hs[4], hs[6] for
    hs[0], hs[3], hs[5]), as the contracts test words it."""
    import torch

    from pytest_eagle3.verdicts.contract import NO_EMBEDDING_SLOT, contract_diagnosis
    from pytest_eagle3.verdicts.compare import compare_slots

    ref = torch.randn(10, 5, 4, generator=torch.Generator().manual_seed(0))
    served = torch.cat([ref[1], ref[4], ref[6]], dim=-1)
    text = contract_diagnosis(compare_slots(served, ref, expected=[0, 3, 5], num_layers=8, hidden_size=4, tol=1e-4))
    assert "3 of 3 slots wrong" in text and "[offset-twice]" in text and "one layer after" in text
    assert "slot 0: holds hs[1] (input of layer 1" in text
    assert text.endswith(NO_EMBEDDING_SLOT)


def _response(decode_rows: int, tokens: int, verifies: int) -> dict:
    return {"output_ids": list(range(tokens)),
            "meta_info": {"hidden_states": [[[0.0] * 6] * 3] + [[1.0] * 6] * decode_rows,
                          "spec_verify_ct": verifies, "spec_accept_length": tokens / verifies,
                          "spec_accept_rate": 0.5, "completion_tokens": tokens, "id": "r"}}


def test_decode_rows_per_verify_step_are_refused_not_misattributed():
    """0.5.9 returns one decode row per verify step: 8 tokens from 5 verifies give 5
    rows, not 7; mapping them to positions would compare the wrong rows."""
    from pytest_eagle3.capture.response import Eagle3DecodeRowsNotPerToken, parse_response
    from pytest_eagle3.capture.draft_path import parse_draft_response

    assert parse_response(_response(7, 8, 7), [1, 2, 3]).decode.shape == (7, 6)
    with pytest.raises(Eagle3DecodeRowsNotPerToken, match="5 decode hidden-state rows for 8 generated tokens"):
        parse_response(_response(5, 8, 5), [1, 2, 3])
    run = parse_draft_response(_response(5, 8, 5), [1, 2, 3])
    assert run.captures.prefill.shape == (3, 6) and run.captures.decode.shape[0] == 0
    assert run.output_ids == list(range(8)) and "one row per verify step" in run.decode_note


def test_portable_acceptance_draft_runs_only_where_the_shipped_one_cannot(tmp_path):
    """Always-+1 releases (0.5.9, 0.5.12): the shipped draft's collapse is an XFAIL, so the portable draft (ids [1, 3, 4],
    hs[2], hs[4], hs[5] under every rule) gives that release an acceptance gate that must hold."""
    portable = declare.acceptance_need(portable=True)
    old = _ctx(fake_sglang(tmp_path / "a", plugins=False))
    new = _ctx(fake_sglang(tmp_path / "b", plugins=True, version="0.5.23"))
    assert collect_reason(portable, old) is None
    request = resolve(portable, old)
    assert request.ids == (1, 3, 4) and request.expected == request.predicted == (2, 4, 5)
    assert request.xfail_reason is None and request.draft.endswith("tiny-dsv3-portable")
    assert collect_reason(portable, new) == PORTABLE_NOT_NEEDED.format(
        sglang=new.install.describe())
    mine = declare.NeedContext(Settings(tp=2, device="cpu", draft=str(tmp_path)), 1, old.install, old.facts)
    assert collect_reason(portable, mine) == PORTABLE_USER_DRAFT
