"""The per-rank recorder's two halves without an engine: the worker-side hook
(faults, the off switch) and the test-side reader (waiting, missing ranks), and
the partial-sum fit of the per-rank checks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
torch = pytest.importorskip("torch")

from pytest_eagle3.worker import recorder_hook
from pytest_eagle3.engine.recordings import MISSING_RANKS, UNEVEN, Recorder
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.verdicts.rankcheck import check_ranks_agree, partial_sum_fraction

H = 4


def _forward(ids: list[int]) -> tuple[object, object, torch.Tensor, torch.Tensor, object]:
    """(result, model, input_ids, positions, forward_batch) of a fake DeepseekV2Model.forward."""
    aux = torch.arange(len(ids) * 2 * H, dtype=torch.float32).reshape(len(ids), 2 * H) + 1
    shard = SimpleNamespace(org_vocab_start_index=0, org_vocab_end_index=10)
    model = SimpleNamespace(embed_tokens=SimpleNamespace(shard_indices=shard), config=SimpleNamespace(hidden_size=H))
    batch = SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND"))
    return (torch.zeros(len(ids), H), aux), model, torch.tensor(ids), torch.arange(len(ids)), batch


@pytest.fixture
def record_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(recorder_hook.RECORD_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(recorder_hook, "tp_rank_and_size", lambda: (1, 2))
    return tmp_path


def test_recorder_is_off_until_enabled(record_dir: Path) -> None:
    result, model, ids, pos, batch = _forward([1, 2, 3])
    assert recorder_hook._after_forward(result, model, ids, pos, batch) is None
    assert not list(record_dir.rglob("*.safetensors"))


def test_recorder_copies_without_touching_sglang_tensor(record_dir: Path) -> None:
    result, model, ids, pos, batch = _forward([1, 12, 3])
    before = result[1].clone()
    with Recorder(record_dir).recording(fault={"kind": "unreduced-embedding", "rank": 1, "slot": 0}):
        recorder_hook._after_forward(result, model, ids, pos, batch)
    assert torch.equal(result[1], before)
    (path,) = (record_dir / "rank1").glob("*.safetensors")
    from safetensors.torch import load_file

    aux = load_file(str(path))["aux"]
    # token 12 is outside rank 1's shard [0, 10): its embedding row is zero, others kept
    assert torch.equal(aux[1, :H], torch.zeros(H)) and torch.equal(aux[0], before[0])
    assert torch.equal(aux[:, H:], before[:, H:])


def test_partial_sum_fault_scales_one_slot(record_dir: Path) -> None:
    result, model, ids, pos, batch = _forward([1, 2])
    with Recorder(record_dir).recording(fault={"kind": "partial-sum", "rank": 1, "slot": 1}):
        recorder_hook._after_forward(result, model, ids, pos, batch)
    from safetensors.torch import load_file

    (path,) = (record_dir / "rank1").glob("*.safetensors")
    aux = load_file(str(path))["aux"]
    assert torch.allclose(aux[:, H:], result[1][:, H:] / 2) and torch.equal(aux[:, :H], result[1][:, :H])


def test_unknown_fault_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fault 'bitflip'"):
        with Recorder(tmp_path).recording(fault={"kind": "bitflip"}):
            pass


def test_reader_names_ranks_that_wrote_nothing(record_dir: Path) -> None:
    result, model, ids, pos, batch = _forward([1, 2])
    with Recorder(record_dir).recording():
        recorder_hook._after_forward(result, model, ids, pos, batch)  # rank 1 only
        with pytest.raises(Eagle3Error) as exc:
            Recorder(record_dir).read(2, timeout=0.2)
    assert str(exc.value) == MISSING_RANKS.format(missing=[0], timeout=0.2, present=[1])


def test_reader_waits_for_even_counts(record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, model, ids, pos, batch = _forward([1, 2])
    with Recorder(record_dir).recording():
        for rank in (0, 0, 1):
            monkeypatch.setattr(recorder_hook, "tp_rank_and_size", lambda rank=rank: (rank, 2))
            recorder_hook._after_forward(result, model, ids, pos, batch)
        with pytest.raises(Eagle3Error) as exc:
            Recorder(record_dir).read(2, timeout=0.2)
        assert str(exc.value) == UNEVEN.format(timeout=0.2, counts={0: 2, 1: 1})
        recorder_hook._after_forward(result, model, ids, pos, batch)
        records = Recorder(record_dir).read(2, timeout=1)
    assert [len(records[r]) for r in (0, 1)] == [2, 2]
    assert records[1][0].mode == "EXTEND" and records[1][0].shard == (0, 10)
    assert check_ranks_agree(records, hidden_size=H).ok


def test_partial_sum_fit() -> None:
    snap = torch.randn(5, H, generator=torch.Generator().manual_seed(0))
    assert partial_sum_fraction(snap / 4, snap, 4) == (0.25, pytest.approx(0.0, abs=1e-12))
    assert partial_sum_fraction(snap * 3 / 4, snap, 4)[0] == 0.75
    assert partial_sum_fraction(snap, snap, 4) is None  # complete, not partial
    assert partial_sum_fraction(torch.randn(5, H), snap, 4) is None


def test_forwards_are_attributed_to_their_requests(record_dir: Path) -> None:
    """Through the real hook and reader: a health check's 1-token prefill recorded
    before the test's prompts, and a batch of two prompts in one forward, give
    exactly the test's prompts, each with its own rows, in the test's order."""
    from pytest_eagle3.engine.recordings import prefill_records

    def forward(ids: list[int], rids: list[str], lens: list[int]) -> None:
        result, model, input_ids, pos, batch = _forward(ids)
        batch.rids, batch.extend_seq_lens_cpu = rids, lens
        recorder_hook._after_forward(result, model, input_ids, pos, batch)

    with Recorder(record_dir).recording():
        forward([7], ["HEALTH_CHECK"], [1])
        forward([1, 2, 3, 4, 5], ["t-1", "t-0"], [2, 3])
    from pytest_eagle3.engine.recordings import _load

    recs = {1: [_load(1, p) for p in sorted((record_dir / "rank1").glob("*.safetensors"))]}
    assert [r.rids for r in recs[1]] == [("HEALTH_CHECK",), ("t-1", "t-0")]
    mine = prefill_records(recs, ["t-0", "t-1"])[1]
    assert [r.input_ids.tolist() for r in mine] == [[3, 4, 5], [1, 2]]
    assert [r.rids for r in mine] == [("t-0",), ("t-1",)]
    with pytest.raises(Eagle3Error, match="rank 1 recorded no prefill rows of request t-9"):
        prefill_records(recs, ["t-0", "t-9"])


def test_fewer_records_than_prompts_is_a_failure() -> None:
    from pytest_eagle3.engine.recordings import Record
    from pytest_eagle3.verdicts.rankcheck import check_rank_slots

    ref = torch.randn(4, 3, H)
    rec = Record(0, 1, "EXTEND", ref[1].clone(), torch.tensor([1, 2, 3]), None, None)
    report = check_rank_slots({0: [rec]}, [ref, ref], expected=[1], num_layers=2, hidden_size=H)
    assert not report.ok
    assert "rank 0 recorded 1 prefill forwards of the test's requests for 2 prompts" in report.message()


def test_under_attention_dp_each_rank_is_judged_on_the_requests_it_served() -> None:
    """Attention DP: rank 0 served request 1, rank 1 request 0 (served_requests);
    each rank's record is compared with its own request's reference, and a request
    no rank recorded is an error naming it."""
    from pytest_eagle3.engine.recordings import Record, served_requests
    from pytest_eagle3.verdicts.rankcheck import check_rank_slots

    refs = [torch.randn(4, 3, H), torch.randn(4, 3, H)]

    def rec(rank: int, rid: str, aux: torch.Tensor) -> Record:
        return Record(rank, 1, "EXTEND", aux, torch.tensor([1, 2, 3]), torch.arange(3), None, (rid,), (3,))

    records = {0: [rec(0, "r-1", refs[1][1].clone())], 1: [rec(1, "r-0", refs[0][1].clone())]}
    served = served_requests(records, ["r-0", "r-1"])
    assert served == {0: [1], 1: [0]}
    assert check_rank_slots(records, refs, expected=[1], num_layers=2, hidden_size=H, served=served).ok
    swapped = {0: records[1], 1: records[0]}
    assert not check_rank_slots(swapped, refs, expected=[1], num_layers=2, hidden_size=H, served=served).ok
    with pytest.raises(Eagle3Error, match="no DP rank recorded prefill rows of request r-2"):
        served_requests(records, ["r-0", "r-1", "r-2"])


def test_recorder_packs_a_per_layer_list(record_dir: Path) -> None:
    """Releases before 0.5.23 return aux hidden states as one [tokens, H] tensor per
    captured layer (0.5.9 deepseek_v2.py): the record is their concatenation."""
    (hidden, packed), model, ids, pos, batch = _forward([1, 2, 3])
    per_layer = [packed[:, :H].clone(), packed[:, H:].clone()]
    with Recorder(record_dir).recording():
        recorder_hook._after_forward((hidden, per_layer), model, ids, pos, batch)
    (path,) = (record_dir / "rank1").glob("*.safetensors")
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(path))["aux"], packed)


def test_a_wrappers_language_model_forward_without_ids_is_recorded_from_the_batch(record_dir: Path) -> None:
    """A multimodal wrapper calls its language model with embeddings and ``input_ids=None``
    (``general_mm_embed_routine``); the ids come from the forward batch.  Measured before:
    ``AttributeError: 'NoneType' object has no attribute 'detach'`` killed tiny-gemma4-mm's TP 2 engine."""
    result, model, ids, pos, batch = _forward([1, 2, 3])
    batch.input_ids = ids
    with Recorder(record_dir).recording():
        recorder_hook._after_forward(result, model, None, pos, batch)
        bare = SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND"))
        assert recorder_hook._after_forward(result, model, None, pos, bare) is None  # nothing to attribute
    (path,) = (record_dir / "rank1").glob("*.safetensors")
    from safetensors.torch import load_file

    assert load_file(str(path))["input_ids"].tolist() == [1, 2, 3]


def test_mrope_positions_are_recorded_as_the_text_position(record_dir: Path) -> None:
    """Qwen3.5's language model gets M-RoPE positions ``[3, tokens]``; measured before:
    joining a chunked prompt's records failed (``Sizes of tensors must match``)."""
    result, model, ids, pos, batch = _forward([1, 2, 3])
    with Recorder(record_dir).recording():
        recorder_hook._after_forward(result, model, ids, torch.stack([pos, pos, pos]), batch)
    (path,) = (record_dir / "rank1").glob("*.safetensors")
    from safetensors.torch import load_file

    assert load_file(str(path))["positions"].tolist() == [0, 1, 2]
