"""worker/pp_relay.py without an engine: the stage arithmetic, the relay of each
stage's captures and of the per-request hidden states, the lift of the
capture-only check; engine/pp_start.py's ``[pp-earlier-stage]`` line; and
collection under the lift.

On the real engine: ``tests/e2e/test_pp.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pytest_eagle3.engine import pp_start, server_log
from pytest_eagle3.engine.config import EngineConfig
from pytest_eagle3.planning import collect, declare
from pytest_eagle3.settings import GpuProbe, Settings
from pytest_eagle3.sglang_source import install
from pytest_eagle3.sglang_source.install import sglang_location_and_version
from pytest_eagle3.target.spec import TargetSpec
from pytest_eagle3.worker import pp_relay, upstream_fixes
from pytest_eagle3.worker.env import FIX_ENV

LOCATION, _ = sglang_location_and_version()
needs_validation_hook = pytest.mark.skipif(
    LOCATION is None or not (LOCATION / "srt/arg_groups/validation_hook.py").is_file(),
    reason="needs an installed SGLang with srt/arg_groups/validation_hook.py (0.5.23)")
H = 4


def test_the_fixes_are_in_the_catalog() -> None:
    assert upstream_fixes.PP_LIFTS <= set(upstream_fixes.CATALOG)
    assert upstream_fixes.read_fix({FIX_ENV: "pp-capture-relay"}) == "pp-capture-relay"


def test_stage_ids_and_merge() -> None:
    assert pp_relay.stage_ids([0, 3, 5], 0, 4) == [0, 3]
    assert pp_relay.stage_ids([0, 3, 5], 4, 8) == [5]
    assert pp_relay.stage_ids([8], 4, 8) == []  # id L: never a layer's input
    assert pp_relay.stage_ids([5, 8], 4, 8, last=True) == [5, 8]  # ... so the last stage's packer falls short
    assert pp_relay.stage_ids([-1, 0], 0, 4, first=True) == [-1, 0]
    a, b = torch.zeros(3, 2 * H), torch.ones(3, H)
    assert pp_relay.merge(None, b) is b and pp_relay.merge(a, None) is a
    merged = pp_relay.merge(a, b)
    assert merged.shape == (3, 3 * H) and merged[:, :2 * H].eq(0).all() and merged[:, 2 * H:].eq(1).all()


class _Group(SimpleNamespace):
    pass


class _Proxy:
    def __init__(self, tensors: dict[str, Any]) -> None:
        self.tensors = tensors


def _stage(rank: int, start: int, end: int, wanted: list[int]) -> SimpleNamespace:
    group = _Group(is_first_rank=rank == 0, is_last_rank=rank == 1, rank_in_group=rank, world_size=2)
    return SimpleNamespace(pp_group=group, layers_to_capture=list(wanted), start_layer=start, end_layer=end)


def test_a_stage_relays_its_own_layers_and_the_last_stage_puts_them_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage 0 (layers 0-3) captures ids 0 and 3 and sends them with the proxy tensors;
    stage 1 (layers 4-7) captures id 5 and returns ``[tokens, 3 * H]``, stage 0's columns first."""
    seen: list[list[int]] = []
    rows0 = torch.arange(3 * 2 * H, dtype=torch.float32).reshape(3, 2 * H)

    def stage0_forward(model: Any, *args: Any, **kwargs: Any) -> _Proxy:
        seen.append(list(model.layers_to_capture))
        return _Proxy({"hidden_states": torch.zeros(3, H)})

    monkeypatch.setattr(pp_relay, "_with_recorded_packer",
                        lambda original, model, asked, *a, **k: (original(model, *a, **k), rows0 if asked else None))
    stage0 = _stage(0, 0, 4, [0, 3, 5])
    proxy = pp_relay.around_stage_forward(stage0_forward, stage0, "ids", "pos", "batch", None, None)
    assert seen == [[0, 3]] and stage0.layers_to_capture == [0, 3, 5]  # restored after the forward
    assert proxy.tensors[pp_relay.STAGE_KEY] is rows0

    own = torch.full((3, H), 7.0)

    def stage1_forward(model: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(list(model.layers_to_capture))
        return torch.zeros(3, H), own

    stage1 = _stage(1, 4, 8, [0, 3, 5])
    hidden, aux = pp_relay.around_stage_forward(stage1_forward, stage1, "ids", "pos", "batch", None, proxy)
    assert seen[-1] == [5] and aux.shape == (3, 3 * H)
    assert torch.equal(aux[:, :2 * H], rows0) and torch.equal(aux[:, 2 * H:], own)


def test_the_last_stage_without_layers_of_its_own_returns_the_relayed_rows() -> None:
    rows = torch.ones(2, 2 * H)
    stage1 = _stage(1, 4, 8, [0, 3])
    out = pp_relay.around_stage_forward(lambda model, *a, **k: torch.zeros(2, H), stage1,
                                        pp_proxy_tensors=_Proxy({pp_relay.STAGE_KEY: rows}))
    assert out[1] is rows


def test_a_last_stage_with_nothing_fails_as_sglangs_packer_does() -> None:
    """No rows arrived and none on its layers: SGLang's caller would unpack a bare tensor."""
    stage1 = _stage(1, 4, 8, [0, 3])
    with pytest.raises(RuntimeError, match="captured 0 of 2 aux hidden states"):
        pp_relay.around_stage_forward(lambda model, *a, **k: torch.zeros(2, H), stage1, pp_proxy_tensors=_Proxy({}))


def test_the_packer_of_an_earlier_stage_is_recorded_and_restored() -> None:
    """SGLang's own packer class, swapped for a recording subclass for one forward only; a
    stage asked for layers it did not capture raises as ``finalize`` does."""
    dsv2 = pytest.importorskip("sglang.srt.models.deepseek_v2")
    real = dsv2.AuxHiddenStatePacker

    def forward(model: Any, n: int) -> _Proxy:
        packer = dsv2.AuxHiddenStatePacker(n)
        for i in range(n):
            packer.append(torch.full((3, H), float(i)))
        return _Proxy({"hidden_states": torch.zeros(3, H)})

    out, rows = pp_relay._with_recorded_packer(forward, None, True, 2)
    assert dsv2.AuxHiddenStatePacker is real and rows.shape == (3, 2 * H) and rows[:, H:].eq(1).all()
    assert pp_relay._with_recorded_packer(forward, None, False, 0)[1] is None
    with pytest.raises(RuntimeError, match="captured 0 of 2"):
        pp_relay._with_recorded_packer(lambda model: (dsv2.AuxHiddenStatePacker(2), None)[1], None, True)
    assert dsv2.AuxHiddenStatePacker is real


def test_the_hook_targets_are_the_installed_sglangs() -> None:
    """SGLang's HookRegistry only logs a target it cannot resolve: pin each one and its arguments."""
    pytest.importorskip("sglang.srt.models.deepseek_v2")
    import inspect
    import pkgutil

    wanted = {
        pp_relay.CAPTURE_CHECK: ["server_args"], pp_relay.PP_CHECK: ["cfg"],
        pp_relay.SET_LAYERS: ["self", "layer_ids"],
        pp_relay.STAGE_FORWARD: ["self", "input_ids", "positions", "forward_batch", "input_embeds", "pp_proxy_tensors"],
        pp_relay.PREPARE_OUTPUTS: ["self", "result", "batch"],
        pp_relay.PREP_RESULT: ["self", "batch", "mb_metadata", "pp_outputs"],
        pp_relay.SEND_PROXY: ["self", "result"],
    }
    for target, params in wanted.items():
        assert list(inspect.signature(pkgutil.resolve_name(target)).parameters) == params, target


def test_without_pp_or_captures_the_forward_is_sglangs() -> None:
    single = SimpleNamespace(pp_group=_Group(is_first_rank=True, is_last_rank=True), layers_to_capture=[0, 3],
                             start_layer=0, end_layer=8)
    assert pp_relay.around_stage_forward(lambda model, *a, **k: "sglang", single) == "sglang"


def test_set_layers_runs_sglangs_rule_on_an_earlier_stage() -> None:
    """SGLang's method returns at once unless ``pp_group.is_last_rank``: the fix lets it run
    (the inner model's list set) and leaves the stage's ``capture_aux_hidden_states`` off."""

    def sglang_method(model: Any, layer_ids: list[int]) -> None:
        if not model.pp_group.is_last_rank:
            return
        model.capture_aux_hidden_states = True
        model.model.layers_to_capture = list(layer_ids)

    group = _Group(is_last_rank=False)
    model = SimpleNamespace(pp_group=group, capture_aux_hidden_states=False, model=SimpleNamespace(layers_to_capture=[]))
    pp_relay.around_set_layers(sglang_method, model, [0, 3, 5])
    assert model.model.layers_to_capture == [0, 3, 5] and model.capture_aux_hidden_states is False
    assert model.pp_group is group


def test_the_per_request_hidden_states_ride_back_to_the_first_stage() -> None:
    hidden = torch.ones(5, 3 * H)
    result = SimpleNamespace(logits_output=SimpleNamespace(hidden_states=hidden), extend_input_len_per_req=[2, 3])
    sent = pp_relay.after_prepare_outputs({"next_token_ids": 0}, None, result, SimpleNamespace(return_hidden_states=True))
    assert sent[pp_relay.RETURN_KEY] is not None and sent[pp_relay.RETURN_LENS_KEY] == [2, 3]
    assert pp_relay.RETURN_KEY not in pp_relay.after_prepare_outputs(
        {}, None, result, SimpleNamespace(return_hidden_states=False))

    received = SimpleNamespace(logits_output=SimpleNamespace(hidden_states=None), extend_input_len_per_req=None)
    out = pp_relay.around_prep_result(lambda *a: received, None, "batch", "meta", _Proxy(sent))
    assert torch.equal(out.logits_output.hidden_states, hidden) and out.extend_input_len_per_req == [2, 3]
    # Stage 0 without logprobs: SGLang builds no logits output; the relay makes one.
    pytest.importorskip("sglang.srt.layers.logits_processor")
    bare = SimpleNamespace(logits_output=None, extend_input_len_per_req=None)
    out = pp_relay.around_prep_result(lambda *a: bare, None, "batch", "meta", _Proxy(sent))
    assert torch.equal(out.logits_output.hidden_states, hidden) and out.logits_output.next_token_logits is None


def test_the_capture_check_sees_pp_size_one(monkeypatch: pytest.MonkeyPatch) -> None:
    vh = pytest.importorskip("sglang.srt.arg_groups.validation_hook")
    args = SimpleNamespace(pp_size=2, other="x")
    monkeypatch.setattr(vh, "resolving_view", lambda a: a)
    seen = pp_relay.around_capture_check(lambda a: (vh.resolving_view(a).pp_size, vh.resolving_view(a).other), args)
    assert seen == (1, "x") and args.pp_size == 2 and vh.resolving_view(args) is args


def _config(tmp_path: Path, pp: int) -> EngineConfig:
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    return EngineConfig(model_path=str(tmp_path), tp=1, device="cpu",
                        server_args=(("pp_size", pp), ("tp_size", 1)), env=())


@needs_validation_hook
def test_a_short_packer_at_pp_is_named(tmp_path: Path) -> None:
    cause = "RuntimeError: captured 2 of 3 aux hidden states (sglang/srt/layers/aux_hidden_states.py:87)"
    key, line = pp_start.explain_start(_config(tmp_path, 2), cause, str(LOCATION))
    assert line.startswith("[pp-earlier-stage] at PP 2 only the last stage captures")
    other = pp_start.explain_start(_config(tmp_path, 2), cause.replace("2 of 3", "1 of 3"), str(LOCATION))
    assert other[0] == key and other[1] != line  # one cause for every engine it stops; each line its counts
    assert "the last stage holds layers 4-7 and captured 2 of the 3 layers to capture" in line
    assert "the other one lies on an earlier stage (stage 0: layers 0-3)" in line and "#39634" in line
    assert pp_start.explain_start(_config(tmp_path, 1), cause, str(LOCATION)) is None
    with pytest.MonkeyPatch.context() as mp:  # under the relay every stage captures: not this defect
        mp.setenv(FIX_ENV, "pp-capture-relay")
        assert pp_start.explain_start(_config(tmp_path, 2), cause, str(LOCATION)) is None
    assert pp_start.explain_start(_config(tmp_path, 2), "TypeError: x", str(LOCATION)) is None


def test_the_start_cause_is_the_schedulers_exception(tmp_path: Path) -> None:
    """The launcher's warm-up request to a dying server may be logged before the
    scheduler's traceback: the scheduler's is the cause."""
    log = tmp_path / "s.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/entrypoints/http_server.py", line 9, in warm\n'
        "ConnectionRefusedError: [Errno 111] Connection refused\n"
        "[PP1] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/layers/aux_hidden_states.py", line 87, in finalize\n'
        "RuntimeError: captured 2 of 3 aux hidden states\n")
    assert server_log.startup_cause(log) == \
        ": RuntimeError: captured 2 of 3 aux hidden states (sglang/srt/layers/aux_hidden_states.py:87)"


@needs_validation_hook
@pytest.mark.parametrize("fix", [None, "pp-capture-gate-lifted"])
def test_under_a_lift_every_pp_test_stays(monkeypatch: pytest.MonkeyPatch, fix: str | None) -> None:
    if fix:
        monkeypatch.setenv(FIX_ENV, fix)
    else:
        monkeypatch.delenv(FIX_ENV, raising=False)
    facts = TargetSpec.preset("tiny-dsv3").facts
    sglang = install.probe(None)
    settings = Settings(tp=1, pp=2, device="cpu", gpu=GpuProbe(0, "test"))
    ctx = declare.NeedContext(settings, 1, sglang, facts)
    reasons = {collect.collect_reason(n, ctx) for n in declare.case_needs()}
    gated = {r for r in reasons if r is not None and r.startswith("--eagle3-pp 2:")}
    assert bool(gated) == (fix is None)


def test_eagle3_meets_the_checks_eagle_meets() -> None:
    """The PP check runs on a view where EAGLE3 reads EAGLE; other reads pass through."""
    cfg = SimpleNamespace(speculative_algorithm="EAGLE3", disable_overlap_schedule=True)
    seen = pp_relay.around_pp_check(lambda c: (c.speculative_algorithm, c.disable_overlap_schedule), cfg)
    assert seen == ("EAGLE", True) and cfg.speculative_algorithm == "EAGLE3"
    assert pp_relay.around_pp_check(lambda c: c.speculative_algorithm, SimpleNamespace(speculative_algorithm=None)) \
        is None


def test_wrong_slots_of_earlier_stages_are_named() -> None:
    """``[pp-earlier-stage]``: exactly the slots whose layers an earlier stage holds are
    wrong, and a slot of the last stage is right."""
    from pytest_eagle3.verdicts.diagnose import pp_earlier_stage_text

    def verdicts(*ok: bool) -> list[SimpleNamespace]:
        return [SimpleNamespace(slot=i, ok=v) for i, v in enumerate(ok)]

    stages = ((0, 4), (4, 8))
    text = pp_earlier_stage_text(verdicts(False, False, True), [0, 3, 5], stages)
    assert text is not None and text.startswith("slots 0, 1 (layers 0, 3, on stage 0: layers 0-3) are wrong while "
                                                "the last stage's slot (2) is right")
    assert pp_earlier_stage_text(verdicts(False, True, True), [0, 3, 5], stages) is None  # slot 1 (stage 0) right
    # A slot with a diagnosis of its own (an unreduced embedding) keeps it.
    assert pp_earlier_stage_text(verdicts(False, False, True), [0, 3, 5], stages, diagnosed={0}) is None
    assert pp_earlier_stage_text(verdicts(False, False, False), [0, 3, 5], stages) is None  # the last stage's too
    assert pp_earlier_stage_text(verdicts(False, False, True), [0, 3, 5], ((0, 8),)) is None  # no PP
    three = pp_earlier_stage_text(verdicts(True, False, True), [1, 3, 6], ((0, 2), (2, 5), (5, 8)))
    assert three is None  # slot 0 (stage 0) right, slot 1 (stage 1) wrong: not every earlier slot
    assert "stage 1: layers 2-4" in pp_earlier_stage_text(verdicts(False, False, True), [2, 3, 6],
                                                          ((0, 2), (2, 5), (5, 8)))


def test_the_pp_fault_runs_at_pp_with_the_relay() -> None:
    from pytest_eagle3.planning.selftest import PP_FIX, self_test_args, self_test_env
    from pytest_eagle3.worker.faults import CATALOG, NEEDS_PP, named_as

    assert NEEDS_PP == ("pp-earlier-stage-zeroed",) and NEEDS_PP[0] in CATALOG
    assert self_test_args(NEEDS_PP[0]) == ("--eagle3-pp", "2") and self_test_env(NEEDS_PP[0]) == {FIX_ENV: PP_FIX}
    assert self_test_env("offset-twice") == {} and named_as(NEEDS_PP[0]) == "pp-earlier-stage"
    assert PP_FIX in upstream_fixes.PP_LIFTS


def test_the_zeroed_relay_fault_touches_only_the_relayed_captures() -> None:
    rows, hidden = torch.ones(3, 2 * H), torch.ones(3, H)
    result = SimpleNamespace(pp_hidden_states_proxy_tensors=_Proxy({pp_relay.STAGE_KEY: rows, "hidden_states": hidden}))
    sent = pp_relay.around_send_proxy_zeroed(lambda scheduler, r: r.pp_hidden_states_proxy_tensors.tensors, None,
                                             result)
    assert sent[pp_relay.STAGE_KEY].eq(0).all() and sent[pp_relay.STAGE_KEY].shape == rows.shape
    assert sent["hidden_states"] is hidden


def test_a_gpu_block_holds_every_stage() -> None:
    """At PP an engine's stages take consecutive GPUs from its base GPU: blocks of TP x PP."""
    from pytest_eagle3.engine.gpu_blocks import settings_blocks

    settings = Settings(tp=4, pp=2, device="cuda", gpu=GpuProbe(8, "test"))
    (block,) = settings_blocks(settings, env={})
    assert block.gpus == tuple(str(i) for i in range(8))
    assert [b.gpus for b in settings_blocks(Settings(tp=2, pp=1, device="cuda", gpu=GpuProbe(4, "t")), env={})] == \
        [("0", "1"), ("2", "3")]


@needs_validation_hook
def test_a_pp_engine_is_configured_as_the_installed_checks_ask(tmp_path: Path) -> None:
    """At PP the installed SGLang asserts ``disable_overlap_schedule`` and runs speculative
    decoding behind ``SGLANG_ENABLE_PP_SPEC``: the engine gets both, one OMP core per rank of
    every stage."""
    from pytest_eagle3.capture.draft_path import draft_path_server_args
    from pytest_eagle3.engine.config import build_engine_config
    from pytest_eagle3.sglang_source.pp_code import PP_SPEC_SWITCH

    sglang = install.probe(None)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    capture = build_engine_config(sglang, model_path=str(model), tp=2, device="cpu",
                                  test_args={"enable_return_aux_hidden_states": True,
                                             "speculative_algorithm": "EAGLE3"}, user_args=[("pp_size", 2)])
    assert capture.args()["disable_overlap_schedule"] is True and PP_SPEC_SWITCH not in capture.env_dict()
    assert capture.env_dict()["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 3  # 2 TP ranks x 2 stages
    spec = build_engine_config(sglang, model_path=str(model), tp=1, device="cpu",
                               test_args=draft_path_server_args(sglang, "/d"), user_args=[("pp_size", 2)])
    assert spec.env_dict()[PP_SPEC_SWITCH] == "1"
    plain = build_engine_config(sglang, model_path=str(model), tp=1, device="cpu",
                                test_args=draft_path_server_args(sglang, "/d"))
    assert PP_SPEC_SWITCH not in plain.env_dict() and "disable_overlap_schedule" not in plain.args()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(PP_SPEC_SWITCH, "0")  # the user's own value wins
        mine = build_engine_config(sglang, model_path=str(model), tp=1, device="cpu",
                                   test_args=draft_path_server_args(sglang, "/d"), user_args=[("pp_size", 2)])
        assert PP_SPEC_SWITCH not in mine.env_dict()
        # Under the relay on cuda the engine runs eager: the relayed rows have no CUDA-graph buffer.
        mp.setenv(FIX_ENV, "pp-capture-relay")
        cuda = build_engine_config(sglang, model_path=str(model), tp=1, device="cuda", user_args=[("pp_size", 2)])
        assert cuda.args().get("disable_cuda_graph") is True
