"""``pytest-eagle3 inspect``: contract vs. what an SGLang version captures, verdict, fix.

Drafts are written the way the packaged contracts suite writes them
(``suite.support.write_draft_config``: ids under ``eagle_config``) plus an
``fc.weight`` safetensors header of the right shape, for tiny-dsv3 (8 layers,
hidden 256).  Versions are passed with ``--sglang-version`` so the verdicts do
not depend on the install; one test uses the installed SGLang.
"""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.safetensors_files import write_safetensors
from pytest_eagle3.cli import main as cli
from pytest_eagle3.contracts import idfix
from pytest_eagle3.cli import inspect as inspect_cli
from pytest_eagle3.cli import inspection, preflight
from pytest_eagle3.contracts.catalog import load_contract_fixtures
from pytest_eagle3.contracts.contract import Contract
from pytest_eagle3.contracts.draft import TOP_LEVEL_KEY
from pytest_eagle3.conventions import predict, rule_for_version
from pytest_eagle3.suite.support import write_draft_config

L, H = 8, 256
NEW, OLD = "0.5.23", "0.5.12"

#: (fixture, version) -> (verdict, fix ids or None).  Pinned; see the module docstring.
EXPECTED = {
    ("default-no-ids", NEW): ("match", None),
    ("kimi-embedding-first", NEW): ("match", None),
    ("specforge-default-ids", NEW): ("match", None),
    ("speculators-default-ids", NEW): ("match", None),
    ("vllm-first-id-1", NEW): ("mismatch", [4, 1, 6]),
    ("default-no-ids", OLD): ("match", None),
    ("kimi-embedding-first", OLD): ("mismatch", None),
    ("specforge-default-ids", OLD): ("match", None),
    ("speculators-default-ids", OLD): ("mismatch", [1, 3, 4]),
    ("vllm-first-id-1", OLD): ("mismatch", [0, 3, 5]),
}
FIXTURES = {f.name: f for f in load_contract_fixtures(L, hidden_size=H)}


def make_draft(directory: Path, ids, *, slots: int = 3, hidden: int = H, config: dict | None = None) -> Path:
    """An HF-format draft (as the suite writes it) with ``fc.weight`` ``[hidden, slots * hidden]``."""
    write_draft_config(directory, ids, hidden)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    write_safetensors(directory / "model.safetensors", {"fc.weight": ("BF16", [hidden, slots * hidden])})
    return directory


def speculators_draft(directory: Path, ids, *, slots: int = 3) -> Path:
    """A speculators-format draft: ids at top level, where SGLang does not look."""
    directory.mkdir(parents=True)
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              TOP_LEVEL_KEY: list(ids), "target_hidden_size": H,
              "transformer_layer_config": {"hidden_size": H, "num_hidden_layers": 1}}
    (directory / "config.json").write_text(json.dumps(config))
    write_safetensors(directory / "model.safetensors", {"fc.weight": ("BF16", [H, slots * H])})
    return directory


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code, out, _ = run(capsys, *argv, "--json")
    return code, json.loads(out)


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run, expect exit 2 and one line on stderr without a traceback; return it."""
    try:
        code = cli.main(["inspect", *argv])
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("usage:")
             and not ln.startswith("       ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------------------
# Every fixture contract, on the new and the old SGLang rule
# ----------------------------------------------------------------------------------------


#: Ends at the last layer's output (id L): a capture DeepSeek's model never reaches.
LAST_LAYER = "vllm-last-layer"


def test_every_fixture_is_pinned() -> None:
    assert {name for name, _ in EXPECTED} | {LAST_LAYER} == set(FIXTURES)


@pytest.mark.parametrize("version", [NEW, OLD])
def test_last_layer_contract_fails_on_deepseek(version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fx = FIXTURES[LAST_LAYER]
    assert list(fx.ids) == [5, 6, 8] and fx.contract.to_snapshot_indices(L)[-1] == L + 1  # final_prenorm
    draft = make_draft(tmp_path / LAST_LAYER, fx.ids, slots=3)
    code, result = run_json(capsys, "--draft", str(draft), "--stack", fx.stack, "--target", "tiny-dsv3",
                            "--sglang-version", version)
    assert result["verdict"] == "fails" and code == 1 and result["fix"]["ids"] is None
    assert "never reaches" in result["fix"]["text"]


@pytest.mark.parametrize(("name", "version"), sorted(EXPECTED), ids=lambda v: str(v))
def test_fixture_verdicts(name: str, version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fx = FIXTURES[name]
    verdict, fix_ids = EXPECTED[name, version]
    draft = make_draft(tmp_path / name, fx.ids, slots=fx.contract.k)
    code, result = run_json(capsys, "--draft", str(draft), "--stack", fx.stack, "--target", "tiny-dsv3",
                            "--sglang-version", version)
    assert result["verdict"] == verdict and code == result["exit_code"] == (0 if verdict == "match" else 1)
    assert result["contract"]["human"] == fx.expected
    # The verdict is the rule's prediction on the ids SGLang reads (the suite measures the same).
    predicted = predict(list(fx.ids) if fx.ids is not None else None, L, version).snapshots
    assert (list(predicted) == fx.contract.to_snapshot_indices(L)) == (verdict == "match")
    assert result["by_default"] == (fx.ids is None)
    if verdict == "match":
        assert result["fix"] is None
        return
    assert result["fix"]["ids"] == fix_ids
    assert [s["ok"] for s in result["slots"]] == [False] * 3


@pytest.mark.parametrize(("name", "version"), [k for k, v in EXPECTED.items() if v[1]], ids=lambda v: str(v))
def test_fix_inverts_the_rule(name: str, version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The suggested ids make ``predict`` yield the contract, and the recheck command says MATCH."""
    fx = FIXTURES[name]
    draft = make_draft(tmp_path / name, fx.ids, slots=fx.contract.k)
    _, result = run_json(capsys, "--draft", str(draft), "--stack", fx.stack, "--layers", str(L),
                         "--sglang-version", version)
    ids = result["fix"]["ids"]
    p = predict(ids, L, version)
    assert not p.fails_at_first_forward and list(p.snapshots) == fx.contract.to_snapshot_indices(L)
    # Apply it as the fix line says, then run the recheck line.
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (draft / "config.json").write_text(json.dumps(cfg))
    argv = shlex.split(result["recheck"])
    assert argv[:2] == ["pytest-eagle3", "inspect"]
    code, out, _ = run(capsys, *argv[2:])
    assert code == 0 and "verdict:   MATCH" in out


def test_kimi_embedding_on_old_sglang_cannot_be_fixed_by_ids(tmp_path: Path, capsys) -> None:
    fx = FIXTURES["kimi-embedding-first"]
    draft = make_draft(tmp_path / "kimi", fx.ids)
    code, out, _ = run(capsys, "--draft", str(draft), "--stack", "raw", "--layers", "8", "--sglang-version", OLD)
    assert code == 1
    assert "  slot 0: sglang captures out(L0); the contract says embedding" in out
    assert ("fix:       this SGLang cannot capture the embedding (its id rule adds 1 to every id, and its model "
            "fails capturing layer 0, version table (layer 0 since 0.5.14)): no id list works on it; on an SGLang "
            "whose model captures layer 0 (upstream >= 0.5.14), write ids [0, 3, 5]") in out
    assert "recheck:" not in out
    assert "right where SGLang's model captures layer 0 (upstream >= 0.5.14) only" in out


def test_embedding_on_0_5_13_is_not_servable_either(tmp_path: Path, capsys) -> None:
    """0.5.13 has the first-id rule but still fails capturing layer 0 (deepseek_v2.py:2453)."""
    fx = FIXTURES["kimi-embedding-first"]
    draft = make_draft(tmp_path / "kimi", fx.ids)
    code, out, _ = run(capsys, "--draft", str(draft), "--stack", "raw", "--layers", "8", "--sglang-version", "0.5.13")
    assert code == 1
    assert ("its model fails capturing layer 0: residual is None there, version table (layer 0 since 0.5.14)): "
            "no id list works on it") in out
    assert "layers_to_capture [0, 3, 5] has layer 0, which this SGLang cannot capture" in out


def test_human_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", [1, 3, 4])
    code, out, _ = run(capsys, "--draft", str(draft), "--stack", "specforge-hf", "--target", "tiny-dsv3",
                       "--sglang-version", NEW)
    assert code == 0
    assert out.splitlines() == [
        f"draft:     {draft} (stack specforge-hf, eagle_config ids [1, 3, 4], fc 768 = 3 x 256)",
        "target:    tiny-dsv3, 8 layers, hidden 256",
        "contract:  [out(L1), out(L3), out(L4)]",
        "sglang:    0.5.23 (--sglang-version)",
        "rule:      +1 only when the first id is 1 (version table for upstream sglang 0.5.23 (sglang >= 0.5.13, "
        "PR #25454); a prediction, not read from code)",
        "reads:     ids [1, 3, 4] -> layers_to_capture [2, 4, 5]",
        "captures:  [out(L1), out(L3), out(L4)]",
        # vLLM 0.34.0's one runner never reads eagle_config's key: its default instead, said plainly.
        "vllm:      vllm 0.34.0: reads no ids: its default [2, 4, 5]; captures [out(L1), out(L3), "
        "out(L4)] (vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:103-140; default "
        "vllm/model_executor/models/interfaces.py:1764-1785); vLLM >= 0.34 ignores "
        "eagle_config.eagle_aux_hidden_state_layer_ids [1, 3, 4]: it would serve its default (2, L//2, L-3) = "
        "[2, 4, 5]; move the ids to the top level of config.json (eagle_aux_hidden_state_layer_ids)",
        "verdict:   MATCH: " + preflight.MATCH_REASON,
    ]


def test_json_keys_are_stable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", [1, 4, 6])
    _, result = run_json(capsys, "--draft", str(draft), "--stack", "vllm", "--layers", "8", "--sglang-version", NEW)
    assert tuple(result) == inspection.JSON_KEYS
    assert set(result["sglang"]) == {"version", "source", "rule", "rule_source", "rule_from_code", "ids_read",
                                     "layers_to_capture", "never_reached", "fails_at_first_forward", "captures",
                                     "captures_human"}
    assert result["sglang"]["rule_from_code"] is False  # --sglang-version: the version table
    assert set(result["fix"]) == {"ids", "key", "text", "portable", "permutation"}
    assert result["slots"][0] == {"slot": 0, "sglang": 2, "contract": 1, "ok": False,
                                  "sglang_human": "out(L1)", "contract_human": "out(L0)"}


def test_installed_sglang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_eagle3.sglang_source.install import locate
    from pytest_eagle3.errors import Eagle3SGLangMissing

    try:
        version, location = locate()
    except Eagle3SGLangMissing:
        message = usage_error(capsys, "--draft", str(make_draft(tmp_path / "d", [1, 3, 4])), "--stack",
                              "specforge-hf", "--layers", "8")
        assert inspect_cli.NO_SGLANG_SUFFIX.strip("; ") in message
        return
    draft = make_draft(tmp_path / "d", [1, 3, 4])
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "specforge-hf", "--layers", "8")
    assert result["sglang"]["version"] == version and result["sglang"]["source"] == f"installed at {location}"
    assert code == 0 and result["verdict"] == "match"  # [1, ...] gets +1 on every version


def test_answers_fast_without_heavy_imports(tmp_path: Path) -> None:
    draft = make_draft(tmp_path / "d", [1, 3, 4])
    code = (
        "import sys; from pytest_eagle3.cli import main as cli; "
        f"rc = cli.main(['inspect', '--draft', {str(draft)!r}, '--stack', 'specforge-hf', '--target', 'tiny-dsv3']); "
        "heavy = [m for m in ('torch', 'transformers', 'sglang') if m in sys.modules]; "
        "assert not heavy, heavy; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode in (0, 2), proc.stderr  # 2: no SGLang installed here
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------------------
# Bad input: labelled verdicts (exit 1) and usage errors (exit 2)
# ----------------------------------------------------------------------------------------


def test_no_ids_is_a_labelled_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", None)
    code, out, _ = run(capsys, "--draft", str(draft), "--stack", "specforge-hf", "--layers", "8",
                       "--sglang-version", NEW)
    assert code == 0
    assert "verdict:   MATCH (by SGLang's default): SGLang reads no ids from this draft" in out
    assert "note:      the match depends on SGLang's default list; to pin it: write ids [1, 3, 4]" in out


def test_no_ids_mismatch_gets_ids_to_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # speculators' custom-worker era captured layer *outputs* of its default [2, L//2, L-3] (+ L-1 for
    # the verifier): hs[3], hs[6], hs[8] on 10 layers; SGLang's default captures hs[2], hs[5], hs[7].
    draft = make_draft(tmp_path / "d", None)
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "speculators", "--option",
                            "datagen=custom_worker", "--layers", "10", "--sglang-version", NEW)
    assert code == 1 and result["verdict"] == "mismatch" and result["by_default"]
    assert predict(result["fix"]["ids"], 10, NEW).snapshots == (3, 6, 8)


def test_ids_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", [1, 3, 9])
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "specforge-hf", "--layers", "8",
                            "--sglang-version", NEW)
    assert code == 1 and result["verdict"] == "invalid" and result["contract"] is None
    assert "id 9 in [1, 3, 9] is outside 0..7" in result["reason"]
    # SGLang's side is still reported: it would never reach layer 10.
    assert result["sglang"]["never_reached"] == [10]


def test_plus_one_past_the_last_layer_fails_before_any_engine(tmp_path: Path, capsys) -> None:
    draft = make_draft(tmp_path / "d", [1, 3, 7])
    code, out, _ = run(capsys, "--draft", str(draft), "--stack", "specforge-hf", "--layers", "8",
                       "--sglang-version", NEW)
    assert code == 1
    assert ("verdict:   FAILS: SGLang fails at the first forward, not at startup: layers_to_capture [2, 4, 8] "
            "has layer 8, which a target of 8 layers never reaches (0..7) (captured 2 of 3)") in out
    assert "  slot 2: sglang captures nothing; the contract says out(L7, pre-norm)" in out
    assert ("fix:       no id list works: the contract wants out(L7, pre-norm) (output of layer 7 before the "
            "final norm), which this SGLang model's capture never reaches (it captures layer inputs only") in out


def test_past_the_last_layer_names_the_range_the_model_captures(tmp_path: Path) -> None:
    """Where the model captures the last layer's output (gpt-oss, Gemma 3), the
    reachable range named is 0..L, not 0..L-1."""
    draft = make_draft(tmp_path / "d", [1, 3, 8])
    rule = replace(rule_for_version(NEW), last_layer="srt/models/gpt_oss.py:735")
    result = preflight.inspect_draft(draft, num_layers=8, sglang_version=NEW, stack="vllm", rule=rule)
    assert result.verdict == inspection.FAILS
    assert "has layer 9, which a target of 8 layers never reaches (0..8)" in result.reason


def test_default_collapses_on_a_small_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = speculators_draft(tmp_path / "d", [1, 3, 4])
    code, result = run_json(capsys, "--draft", str(draft), "--layers", "6", "--sglang-version", NEW)
    assert code == 1 and result["verdict"] == "fails" and result["stack"] == "speculators"
    assert result["sglang"]["ids_read"] is None and result["sglang"]["layers_to_capture"] == [2, 3, 3]
    assert "names layer 3 twice" in result["reason"] and "(captured 2 of 3)" in result["reason"]
    assert result["fix"]["ids"] == [3, 1, 4] and idfix.KEEP_TOP_LEVEL_NOTE in result["fix"]["text"]


def test_speculators_format_top_level_ids_are_ignored(tmp_path: Path, capsys) -> None:
    draft = speculators_draft(tmp_path / "d", [2, 4, 5])
    for version in (NEW, OLD):
        code, result = run_json(capsys, "--draft", str(draft), "--target", "tiny-dsv3", "--sglang-version", version)
        assert code == 0 and result["verdict"] == "match" and result["by_default"]
        assert result["stack_source"] == "speculators config format"
        assert preflight.TOP_LEVEL_WHY in result["reason"]


def test_slot_count_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = speculators_draft(tmp_path / "d", [1, 2, 4, 5], slots=4)
    code, result = run_json(capsys, "--draft", str(draft), "--layers", "8", "--sglang-version", NEW)
    assert code == 1 and result["verdict"] == "fails"
    assert "SGLang captures 3 slots but the draft's fc takes 4" in result["reason"]


def test_duplicate_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", [2, 4, 4])
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "vllm", "--layers", "8", "--sglang-version", NEW)
    assert code == 1 and result["verdict"] == "invalid" and tuple(result) == inspection.JSON_KEYS
    assert "name layer 4 more than once" in result["reason"]
    assert result["sglang"]["fails_at_first_forward"]


def test_fc_width_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", [1, 3, 4], slots=4)
    code, out, _ = run(capsys, "--draft", str(draft), "--stack", "specforge-hf", "--layers", "8",
                       "--sglang-version", NEW)
    assert code == 1
    assert "verdict:   INVALID: draft" in out and "fc.weight [256, 1024] has input width 1024" in out


def test_target_hidden_size_disagrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", [1, 3, 4], hidden=128)
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "specforge-hf", "--target", "tiny-dsv3",
                            "--sglang-version", NEW)
    assert code == 1 and "target hidden size 128, but the target has hidden size 256" in result["reason"]


def test_conflicting_id_lists_are_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", [1, 3, 4])
    cfg = json.loads((draft / "config.json").read_text())
    cfg[TOP_LEVEL_KEY] = [2, 4, 5]
    (draft / "config.json").write_text(json.dumps(cfg))
    code, out, _ = run(capsys, "--draft", str(draft), "--stack", "vllm", "--layers", "8", "--sglang-version", NEW)
    assert code == 1 and "verdict:   INVALID: draft config" in out and "declares two different id lists" in out
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "vllm", "--layers", "8", "--sglang-version", NEW)
    assert code == 1 and result["verdict"] == "invalid" and tuple(result) == inspection.JSON_KEYS


def test_unordered_contract_needs_fc_permuted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SpecForge's HF backend concatenates in listed order: [4, 1, 5] -> hs[5], hs[2], hs[6].
    draft = make_draft(tmp_path / "d", [4, 1, 5])
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "specforge-hf", "--layers", "8",
                            "--sglang-version", NEW)
    assert code == 1 and result["contract"]["snapshot_indices"] == [5, 2, 6]
    fix = result["fix"]
    assert fix["permutation"] == [1, 0, 2] and fix["ids"] == [1, 4, 5] and fix["portable"]
    assert predict(fix["ids"], L, NEW).snapshots == (2, 5, 6)
    assert [[5, 2, 6][i] for i in fix["permutation"]] == [2, 5, 6]
    assert "no id list reorders captures" in fix["text"]


def test_specforge_sglang_defaults_to_the_serving_version(tmp_path: Path, capsys) -> None:
    draft = make_draft(tmp_path / "d", [2, 4, 5])
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "specforge-sglang", "--layers", "8",
                            "--sglang-version", OLD)
    assert code == 0 and preflight.DATAGEN_NOTE.format(version=OLD) in result["notes"]
    code, result = run_json(capsys, "--draft", str(draft), "--stack", "specforge-sglang", "--option",
                            "sglang_version=0.5.23", "--layers", "8", "--sglang-version", OLD)
    assert code == 1 and result["fix"]["ids"] == [1, 3, 4]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--stack", "nope"], "invalid choice: 'nope'"),
        (["--stack", "vllm", "--option", "datagen=x"], "--option datagen: stack 'vllm' takes final_layer"),
        (["--stack", "vllm", "--option", "oops"], "expected KEY=VALUE"),
        (["--contract", "[out(L1), banana]"], "--contract: cannot parse contract"),
        (["--stack", "vllm", "--contract", "[embedding]"], "not allowed with argument"),
        (["--contract", "[embedding]", "--option", "x=1"], preflight.OPTIONS_WITH_CONTRACT_MSG),
        ([], "is in Hugging Face format"),
        (["--stack", "vllm", "--sglang-version", "latest"], "expected a release number like 0.5.23"),
    ],
)
def test_usage_errors(args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = make_draft(tmp_path / "d", [1, 3, 4])
    line = usage_error(capsys, "--draft", str(draft), "--layers", "8", "--sglang-version", NEW, *args)
    assert needle in line


def test_draft_path_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--stack", "vllm", "--layers", "8", "--sglang-version", NEW]
    assert "is not a directory" in usage_error(capsys, "--draft", str(tmp_path / "missing"), *common)
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in usage_error(capsys, "--draft", str(tmp_path / "empty"), *common)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert "is invalid: " in usage_error(capsys, "--draft", str(bad), *common)
    no_aux = make_draft(tmp_path / "no-aux", [1, 3, 4])
    cfg = json.loads((no_aux / "config.json").read_text())
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    (no_aux / "config.json").write_text(json.dumps(cfg))
    assert "use_aux_hidden_state = false" in usage_error(capsys, "--draft", str(no_aux), *common)


def test_target_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = str(make_draft(tmp_path / "d", [1, 3, 4]))
    common = ["--draft", draft, "--stack", "vllm", "--sglang-version", NEW]
    assert inspect_cli.NEEDS_LAYERS_MSG in usage_error(capsys, *common)
    assert "--layers 6 disagrees with --target tiny-dsv3, which has 8 layers" in usage_error(
        capsys, *common, "--layers", "6", "--target", "tiny-dsv3")
    assert "unknown" in usage_error(capsys, *common, "--target", "no-such-preset").lower()
    assert "expected a positive layer count" in usage_error(capsys, *common, "--layers", "0")
    cfg = json.loads(Path(draft, "config.json").read_text())
    del cfg["hidden_size"], cfg["target_hidden_size"]
    Path(draft, "config.json").write_text(json.dumps(cfg))
    assert "pass --target" in usage_error(capsys, *common, "--layers", "8")


# ----------------------------------------------------------------------------------------
# The inverter, exhaustively on 8 layers
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [NEW, OLD])
def test_ids_for_finds_a_list_exactly_when_one_exists(version: str) -> None:
    reachable: set[tuple[int, ...]] = set()
    for k in (1, 2, 3):
        for ids in itertools.product(range(L + 1), repeat=k):
            got = idfix.captures(ids, L, version)
            if got is not None and len(got) == k:
                reachable.add(got)
    for k in (1, 2, 3):
        for wanted in itertools.combinations(range(L + 2), k):
            ids = idfix.ids_for(wanted, L, version)
            assert (ids is not None) == (wanted in reachable), wanted
            if ids is not None:
                assert idfix.captures(ids, L, version) == wanted


def test_plan_fix_explains_impossible_cases() -> None:
    one = Contract.parse("[out(L0)]", num_layers=L, hidden_size=H)
    assert idfix.plan_fix(one, L, NEW, key="k").text.startswith(
        "no id list works on this SGLang (+1 only when the first id is 1): [1] always")
    assert idfix.plan_fix(one, L, OLD, key="k").ids == (0,)
    norm = Contract.parse("[out(L2), final-norm]", num_layers=L, hidden_size=H)
    assert "final-norm (final norm output)" in idfix.plan_fix(norm, L, NEW, key="k").text


@pytest.mark.xfail(strict=True, reason="contracts/draft.py load_draft rejects an eagle_config list that differs from "
                   "the top-level one (CONFLICT_MSG), though SGLang reads one and vLLM the other")
def test_speculators_format_fix_rechecks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = speculators_draft(tmp_path / "d", [1, 3, 4])
    _, result = run_json(capsys, "--draft", str(draft), "--layers", "6", "--sglang-version", NEW)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": result["fix"]["ids"]}
    (draft / "config.json").write_text(json.dumps(cfg))
    code, out, _ = run(capsys, *shlex.split(result["recheck"])[2:])
    assert code == 0, out


def test_mla_draft_top_level_ids_trap_read_from_the_installed_sglang(tmp_path: Path, capsys) -> None:
    """The shipped MLA draft with its ids only at the top level: inspect names both
    sides from the installed files (the draft's fc is sized for the ids, the target
    side reads only eagle_config) and the fix, before any engine."""
    from pytest_eagle3.draft import shipped_draft_dir
    from pytest_eagle3.sglang_source import id_keys
    from tests.draft_files import with_top_level_ids
    from pytest_eagle3.sglang_source.install import sglang_location_and_version

    location, _ = sglang_location_and_version()
    if location is None or not id_keys.has_draft_model(location, "Eagle3DeepseekV2ForCausalLM"):
        pytest.skip("needs an installed SGLang with srt/models/kimi_k25_eagle3.py")
    draft = with_top_level_ids(shipped_draft_dir("tiny-dsv3-mla"), tmp_path / "mla-top")
    code, result = run_json(capsys, "--draft", str(draft), "--target", "tiny-dsv3", "--contract",
                            "[embedding, in(L3), in(L5)]")
    assert code == 1 and result["verdict"] == "mismatch" and result["by_default"]
    reason = result["reason"]
    assert "the draft's fc is sized for them" in reason and "srt/models/kimi_k25_eagle3.py:" in reason
    assert "spec_aux_hidden_state.py:" in reason and "move the ids under eagle_config" in reason
    assert result["fix"]["ids"] == [0, 3, 5]
