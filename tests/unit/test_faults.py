"""worker/faults.py (the catalog) and worker/fault_injection.py without an engine: the switch,
the catalog, each hook on small stand-ins.

The real effect inside SGLang's workers is proven end to end by
``tests/e2e/test_fault_self_test.py``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pytest_eagle3.worker import fault_injection, fault_when, faults, sglang_hooks
from pytest_eagle3.worker.env import FAULT_ENV
from pytest_eagle3.worker.faults import CATALOG, FaultError, describe, read_fault
from pytest_eagle3.planning.selftest import self_test_plan

PUBLIC_KINDS = (
    "offset-twice", "offset-missing", "ids-ignored", "reversed-order", "normalized-input", "no-residual",
    "unreduced-embedding", "partial-sum", "dp-gather-scaled", "aliased-capture", "before-fused-allreduce",
    "partial-before-dp-reduce-scatter", "other-rank-slice-after-dp-reduce-scatter", "wrong-request-rows",
    "no-residual-on-cache-hit", "no-residual-on-later-chunk", "partial-sum-on-rank-decode",
    "stale-no-residual", "half-precision-copy", "draft-fc-reversed", "tree-order-aux", "chunk-seam-prediction",
    "pp-earlier-stage-zeroed",
    "tbo-microbatch-dropped", "tbo-microbatches-swapped",
)


def test_catalog_lists_every_public_bug_class_with_its_source() -> None:
    assert tuple(CATALOG) == PUBLIC_KINDS
    for kind, (what, source) in CATALOG.items():
        assert what and source, kind
    assert "#25454" in CATALOG["offset-twice"][1]
    assert "#22836" in CATALOG["ids-ignored"][1] and "#50170" in CATALOG["ids-ignored"][1]
    assert "#14464" in CATALOG["no-residual"][1]
    assert "#28343" in CATALOG["partial-sum"][1]
    assert "#31699" in CATALOG["dp-gather-scaled"][1]
    assert "#26163" in CATALOG["wrong-request-rows"][1]
    assert "#39286" in CATALOG["aliased-capture"][1]
    assert "#28343" in CATALOG["before-fused-allreduce"][1]
    assert "#28343" in CATALOG["partial-before-dp-reduce-scatter"][1]
    assert "#39634" in CATALOG["pp-earlier-stage-zeroed"][1]
    assert all("#32680" in CATALOG[k][1] for k in ("tbo-microbatch-dropped", "tbo-microbatches-swapped"))
    assert "#37949" in CATALOG["tree-order-aux"][1] and "#26800" in CATALOG["chunk-seam-prediction"][1]


def test_one_record_per_kind_and_the_tables_are_its_views() -> None:
    """Each kind is one FaultKind; the tables the plan and the injection read are derived from it."""
    names = [k.name for k in faults.KINDS]
    assert len(names) == len(set(names)) and list(CATALOG) == names
    for k in faults.KINDS:
        assert set(k.needs) <= set(faults.NEEDS), k
        assert (k.name in faults.NEEDS_TP) == ("tp" in k.needs)
        assert faults.named_as(k.name) == k.tag
        assert k.confined is None or k.confined[0] in CATALOG
    assert faults.named_as("no-residual-on-cache-hit") == "no-residual"
    assert faults.named_as("draft-fc-reversed") is None and faults.named_as("partial-sum") == "partial-sum"


def test_diagnosis_tags_cover_the_catalog() -> None:
    from pytest_eagle3.verdicts import diagnose, draft_feed

    KINDS = set(diagnose.KINDS) | set(draft_feed.KINDS)

    assert set(CATALOG) - set(faults.CONFINED) - set(faults.TEST_TAGS) <= set(KINDS)
    # A confined kind is named by the computation it runs (the path is the run's evidence).
    assert {faults.named_as(k) for k in faults.CONFINED} <= set(KINDS)
    assert {faults.named_as(k) for k in faults.TEST_TAGS} - {None} <= set(KINDS)


def test_run_level_kinds_name_a_tag_of_the_run_level_diagnosis() -> None:
    from pytest_eagle3.verdicts import run_cause

    assert set(faults.RUN_LEVEL) <= set(CATALOG)
    tags = {"path-only", "rank-mode", "stale-state", "precision", "draft-side"}
    assert set(faults.RUN_LEVEL.values()) == tags
    for tag in tags:  # each tag is a headline the diagnosis can print
        assert any(text.startswith(f"[{tag}]") for text in vars(run_cause).values() if isinstance(text, str))


@pytest.mark.parametrize("raw", ["", "  "])
def test_off_unless_asked(raw: str) -> None:
    assert read_fault({}) is None
    assert read_fault({FAULT_ENV: raw}) is None


def test_read_fault_forms() -> None:
    assert read_fault({FAULT_ENV: "partial-sum"}) == {"kind": "partial-sum"}
    assert read_fault({FAULT_ENV: json.dumps({"kind": "dp-gather-scaled", "slots": [1]})}) == {
        "kind": "dp-gather-scaled", "slots": [1]}
    with pytest.raises(FaultError, match="unknown fault kind 'nope'; known: offset-twice, "):
        read_fault({FAULT_ENV: "nope"})
    with pytest.raises(FaultError, match="is not JSON"):
        read_fault({FAULT_ENV: "{kind"})
    assert describe({"kind": "partial-sum"}).startswith("partial-sum: a slot holds the post-attention residual")
    assert describe({"kind": "offset-twice", "rank": 1}).startswith('offset-twice {"rank": 1}: ')


def test_hooks_never_install_a_fault_outside_a_pytest_eagle3_engine(monkeypatch) -> None:
    """A stray PYTEST_EAGLE3_FAULT in a production server's environment does nothing:
    the hook module acts only when pytest-eagle3 started the engine (hook sets on)."""
    calls = []
    monkeypatch.setattr(fault_injection, "install", lambda: calls.append(1))
    monkeypatch.setenv(FAULT_ENV, "partial-sum")
    monkeypatch.delenv(sglang_hooks.HOOKS_ENV, raising=False)
    sglang_hooks.load()
    assert calls == []


def test_hooks_install_the_fault_before_the_recorder(monkeypatch) -> None:
    from pytest_eagle3.worker import recorder_hook

    order = []
    monkeypatch.setattr(fault_injection, "install", lambda: order.append("fault") or {"kind": "partial-sum"})
    monkeypatch.setattr(recorder_hook, "install", lambda: order.append("record"))
    monkeypatch.setenv(sglang_hooks.HOOKS_ENV, "record")
    monkeypatch.setenv(FAULT_ENV, "partial-sum")
    monkeypatch.setattr(sglang_hooks, "_loaded", False)
    sglang_hooks.load()
    assert order == ["fault", "record"]
    order.clear()
    monkeypatch.delenv(FAULT_ENV)
    monkeypatch.setenv(sglang_hooks.HOOKS_ENV, "record,fault")
    monkeypatch.setattr(sglang_hooks, "_loaded", False)  # once per process: a new one
    sglang_hooks.load()
    assert order == ["fault", "record"]


@pytest.fixture
def registry():
    hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry", exc_type=ImportError)
    saved = {k: list(v) for k, v in hook_registry.HookRegistry._hooks.items()}
    yield hook_registry.HookRegistry
    hook_registry.HookRegistry._hooks.clear()
    hook_registry.HookRegistry._hooks.update(saved)
    fault_injection._FAULT = None


@pytest.mark.parametrize(("kind", "targets"), [
    ("offset-twice", [fault_injection.SET_LAYERS]),
    ("ids-ignored", [fault_injection.SET_LAYERS]),
    ("reversed-order", [fault_injection.PACKER_SLOT]),
    ("partial-sum", [fault_injection.MODEL_FORWARD, fault_injection.LAYER_FORWARD]),
    ("wrong-request-rows", [fault_injection.MODEL_FORWARD]),
    ("aliased-capture", [fault_injection.PACKER_APPEND, fault_injection.PACKER_FINALIZE,
                         fault_injection.LIST_CAPTURE]),
    ("before-fused-allreduce", [fault_injection.MODEL_FORWARD, fault_injection.LAYER_FORWARD]),
])
def test_install_registers_hooks_on_sglang_targets(registry, kind, targets) -> None:
    before = {k: len(v) for k, v in registry._hooks.items()}
    assert fault_injection.install({"kind": kind}) == {"kind": kind}
    added = sorted(k for k, v in registry._hooks.items() if len(v) > before.get(k, 0))
    assert added == sorted(targets)


def fake_model(layers_to_capture, num_layers=8):
    return SimpleNamespace(model=SimpleNamespace(layers_to_capture=list(layers_to_capture)),
                           config=SimpleNamespace(num_hidden_layers=num_layers), capture_aux_hidden_states=True)


@pytest.mark.parametrize(("kind", "after"), [
    ("offset-twice", [1, 4, 6]), ("offset-missing", [-1, 2, 4]), ("ids-ignored", [2, 4, 5]),
])
def test_id_faults_rewrite_layers_to_capture(monkeypatch, kind, after) -> None:
    monkeypatch.setattr(fault_injection, "_FAULT", {"kind": kind})
    model = fake_model([0, 3, 5])
    assert fault_injection._after_set_layers(None, model, [0, 3, 5]) is None
    assert model.model.layers_to_capture == after


def test_packer_writes_in_reverse() -> None:
    torch = pytest.importorskip("torch")
    aux = pytest.importorskip("sglang.srt.layers.aux_hidden_states", exc_type=ImportError)
    from pytest_eagle3.worker.fault_injection import _around_packer_slot

    original = aux.AuxHiddenStatePacker.slot
    packer = aux.AuxHiddenStatePacker(3)
    old = fault_injection._FAULT
    fault_injection._FAULT = {"kind": "reversed-order"}
    try:
        for k in range(3):
            _around_packer_slot(original, packer, torch.full((2, 4), float(k))).copy_(torch.full((2, 4), float(k)))
    finally:
        fault_injection._FAULT = old
    assert packer.finalize()[0].tolist() == [2.0] * 4 + [1.0] * 4 + [0.0] * 4


def test_decode_rows_rotate_between_requests(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(fault_injection, "_FAULT", {"kind": "wrong-request-rows"})
    aux = torch.arange(3, dtype=torch.float32).unsqueeze(1).repeat(1, 4)
    decode = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: True))
    fault_injection._wrong_request_rows((None, aux), decode)
    assert aux[:, 0].tolist() == [1.0, 2.0, 0.0]
    extend = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: False))
    fault_injection._wrong_request_rows((None, aux), extend)
    assert aux[:, 0].tolist() == [1.0, 2.0, 0.0]


def test_self_test_plan_names_collected_suite_tests(tmp_path) -> None:
    """Every test the self-test expects to fail exists in the packaged suite at its TP."""
    import subprocess
    import sys

    pytest.importorskip("sglang", exc_type=ImportError)
    plan = self_test_plan()
    assert set(plan) == set(CATALOG)
    assert all(plan[k][0] == 2 for k in faults.NEEDS_TP)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "pytest_eagle3.suite", "--tp", "2", "--device", "cpu",
         "--eagle3-slow", "--collect-only", "-q", "-p", "no:cacheprovider"],  # the TBO kinds run with it
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    collected = {line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line}
    wanted = {name for _, names in plan.values() for name in names}
    assert wanted <= collected, (sorted(wanted - collected), proc.stdout[-2000:], proc.stderr[-2000:])


def test_an_aliased_capture_reads_what_a_later_in_place_write_left() -> None:
    """aliased-capture on SGLang's own packer: a slot ends up holding what its
    borrowed tensor holds at the end of the forward, not what it held when captured."""
    torch = pytest.importorskip("torch")
    aux = pytest.importorskip("sglang.srt.layers.aux_hidden_states", exc_type=ImportError)
    from pytest_eagle3.worker.fault_injection import _around_packer_append, _around_packer_finalize

    cls = aux.AuxHiddenStatePacker
    residual = torch.zeros(2, 4)
    for fault in (None, {"kind": "aliased-capture"}):
        packer = cls(2)
        old = fault_injection._FAULT
        fault_injection._FAULT = fault
        try:
            residual.fill_(1.0)
            (_around_packer_append if fault else lambda o, p, h: o(p, h))(cls.append, packer, residual)
            residual.fill_(2.0)  # the next layer's fused_add_rmsnorm rewrites the residual in place
            (_around_packer_append if fault else lambda o, p, h: o(p, h))(cls.append, packer, residual)
            residual.fill_(3.0)
            out = _around_packer_finalize(cls.finalize, packer) if fault else packer.finalize()
        finally:
            fault_injection._FAULT = old
        want = [3.0] * 8 if fault else [1.0] * 4 + [2.0] * 4
        assert out[0].tolist() == want, fault


def test_before_fused_allreduce_changes_nothing_where_sglang_does_not_fuse(monkeypatch) -> None:
    """The fault reads SGLang's own gate; on a CPU without the fusion stand-in it is false."""
    pytest.importorskip("sglang.srt.layers.layer_boundary.residual.add_norm", exc_type=ImportError)
    from pytest_eagle3.worker import fault_reads

    assert fault_reads.fusion_applies(8) is False


def _batch(mode: str, rids=(), prefixes=()):
    forward_mode = SimpleNamespace(is_decode=lambda: mode == "DECODE", is_target_verify=lambda: mode == "VERIFY",
                                   is_extend=lambda: mode in ("EXTEND", "VERIFY"))
    return SimpleNamespace(forward_mode=forward_mode, rids=list(rids), extend_prefix_lens_cpu=list(prefixes))


def test_confined_faults_run_only_in_their_forwards(monkeypatch) -> None:
    monkeypatch.setattr(fault_when, "_EXTENDS", {})
    hit, chunk, decode = ({"when": "cache-hit"}, {"when": "later-chunk"}, {"when": "decode-verify"})
    def match(fault, batch):
        return fault_when.forward_selection(fault, batch)[0]

    # A fresh prefill (no cached prefix), then its second chunk: a later chunk, not a hit.
    assert not match(hit, _batch("EXTEND", ["a"], [0]))
    assert match(chunk, _batch("EXTEND", ["a"], [16]))
    # A repeat of a prompt whose prefix the radix cache held: a hit, not a later chunk.
    assert match(hit, _batch("EXTEND", ["b"], [39]))
    monkeypatch.setattr(fault_when, "_EXTENDS", {})
    assert not match(chunk, _batch("EXTEND", ["c"], [39]))
    assert match(decode, _batch("DECODE", ["a"])) and match(decode, _batch("VERIFY", ["a"], [40]))
    assert not match(hit, _batch("VERIFY", ["d"], [40])) and not match(decode, _batch("EXTEND", ["e"], [0]))
    assert match({}, _batch("EXTEND", ["f"], [0]))


def test_when_names_the_diagnosis_modes_one_or_several(monkeypatch) -> None:
    """``when`` takes the run-level diagnosis's modes, a list of them too: a first
    extend without a cached prefix is ``prefill`` (a whole prompt or its first chunk)."""
    monkeypatch.setattr(fault_when, "_EXTENDS", {})
    def match(fault, batch):
        return fault_when.forward_selection(fault, batch)[0]

    first = {"when": "prefill"}
    assert match(first, _batch("EXTEND", ["a"], [0]))  # chunk 1 of a
    assert not match(first, _batch("EXTEND", ["a"], [16]))  # chunk 2 of a: a later chunk
    assert not match(first, _batch("EXTEND", ["b"], [39]))  # a radix-cache hit
    both = {"when": ["prefill", "decode"]}
    assert match(both, _batch("EXTEND", ["c"], [0])) and match(both, _batch("DECODE", ["c"]))
    assert not match(both, _batch("VERIFY", ["c"], [40]))
    assert match({"when": ["verify"]}, _batch("VERIFY", ["c"], [40]))
    # A mixed extend batch (a fresh prompt beside a cached one) matches either mode.
    assert match({"when": "cache-hit"}, _batch("EXTEND", ["d", "e"], [0, 12]))


def test_a_mixed_extend_batch_writes_only_the_wanted_requests_rows(monkeypatch) -> None:
    """In an extend batch of a later chunk (4 rows) beside a fresh prompt (3 rows),
    a ``prefill`` fault writes the fresh prompt's rows only (measured before: sample 9
    of ``--grammar 12 --seed 0`` left 8 wrong later-chunk comparisons on the batch path);
    where the slot does not hold the forward's tokens one row each, every row."""
    import torch

    monkeypatch.setattr(fault_when, "_EXTENDS", {"a": 1})
    batch = _batch("EXTEND", ["a", "b"], [16, 0])
    batch.extend_seq_lens_cpu = [4, 3]
    matches, rows = fault_when.forward_selection({"when": "prefill"}, batch)
    assert matches and rows == fault_when.Rows(((4, 7),), 7)
    slot = torch.zeros(7, 2)
    fault_injection._write_rows(slot, torch.ones(7, 2), rows)
    assert slot[:, 0].tolist() == [0, 0, 0, 0, 1, 1, 1]
    padded = torch.zeros(8, 2)
    fault_injection._write_rows(padded, torch.ones(8, 2), rows)
    assert bool((padded == 1).all())
    # Lengths that do not pair with the requests: every row (and every request counted).
    monkeypatch.setattr(fault_when, "_EXTENDS", {"a": 1})
    short = _batch("EXTEND", ["a", "b"], [16, 0])
    short.extend_seq_lens_cpu = [4]
    assert fault_when.forward_selection({"when": "prefill"}, short) == (True, None)
    # Every request wanted: every row.
    monkeypatch.setattr(fault_when, "_EXTENDS", {"a": 1})
    assert fault_when.forward_selection({"when": ["prefill", "later-chunk"]}, batch) == (True, None)


def test_a_bad_when_is_refused_before_any_engine() -> None:
    with pytest.raises(faults.FaultError, match="when='first': expected one of prefill, later-chunk"):
        faults.read_fault({FAULT_ENV: '{"kind": "no-residual", "when": "first"}'})
    assert faults.read_fault({FAULT_ENV: '{"kind": "no-residual", "when": ["prefill", "verify"]}'})


def test_tp_and_rank_pick_the_processes_that_write(monkeypatch) -> None:
    writes = fault_injection._writes_here
    monkeypatch.setattr(fault_injection, "_tp", lambda: (1, 2))
    assert writes({"tp": 2}) and writes({"tp": [1, 2], "rank": [0, 1]}) and not writes({"tp": [1]})
    assert not writes({"rank": [0]}) and writes({"rank": "last"}) and writes({"tp": 2, "rank": 1})
    monkeypatch.setattr(fault_injection, "_tp", lambda: (0, 1))
    assert not writes({"tp": 2}) and writes({"rank": 0}) and writes({"rank": "last"})


def test_a_fault_after_n_forwards_waits_for_them(monkeypatch) -> None:
    monkeypatch.setattr(fault_when, "_FORWARDS", [0])
    stale = {"after": 2}
    seen = [fault_when.forward_selection(stale, _batch("EXTEND", [f"r{i}"], [0]))[0] for i in range(4)]
    assert seen == [False, False, True, True]


def test_a_confined_kind_installs_its_computation_with_its_options(registry) -> None:
    fault = fault_injection.install({"kind": "partial-sum-on-rank-decode"})
    assert fault == {"kind": "partial-sum", "when": "decode-verify", "rank": "last",
                     "confined": "partial-sum-on-rank-decode"}
    assert faults.named_as("partial-sum-on-rank-decode") == "partial-sum"


def test_rank_last_is_the_last_tp_rank(monkeypatch) -> None:
    monkeypatch.setattr(fault_injection, "_tp", lambda: (1, 2))
    assert fault_injection._writes_here({"rank": "last"})
    monkeypatch.setattr(fault_injection, "_tp", lambda: (0, 2))
    assert not fault_injection._writes_here({"rank": "last"})
