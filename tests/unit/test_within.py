"""The run-level cause's attributes beyond TP size, rank, mode, path and send order:
the prefill chunk and the batch size separate comparisons, the slots and rows
inside them narrow a named cause (``verdicts/separation.py``, ``verdicts/within.py``)."""

from __future__ import annotations

from dataclasses import replace

from pytest_eagle3.verdicts.observation import Observation
from pytest_eagle3.verdicts.run_cause import diagnose_run
from pytest_eagle3.verdicts.within import ROWS, SLOT, row_boundary, within

IDS = (0, 3, 5)


def obs(ok: bool = True, **kw) -> Observation:
    kw.setdefault("ids", IDS)
    kw.setdefault("slot_count", 3)
    return Observation(test=kw.pop("test", "t"), check=kw.pop("check", "captures"), ok=ok, **kw)


def wrong(o: Observation, slots=(0, 1, 2), rows=None) -> Observation:
    return replace(o, ok=False, wrong_slots=tuple(slots), wrong_rows=tuple(rows or ()), kinds=("no-residual",))


def chunked_run() -> list[Observation]:
    """Per-rank rows of prompts chunked in three (chunks 2 and 3 are both ``later-chunk``),
    plain API captures, and two batched paths of different sizes."""
    out = [obs(mode="prefill", chunk=1, batch=1, order=0, engine="e"),
           obs(mode="decode", path="decode", batch=1, order=1, engine="e"),
           obs(mode="prefill", path="batch", chunk=1, batch=2, order=2, engine="e", test="b2"),
           obs(mode="prefill", path="batch", chunk=1, batch=4, order=3, engine="e", test="b4")]
    for rank in (0, 1):
        for chunk, (a, b) in enumerate(((0, 16), (16, 32), (32, 40)), start=1):
            out.append(obs(check="ranks", tp=2, rank=rank, mode="prefill" if chunk == 1 else "later-chunk",
                           chunk=chunk, batch=1, rows=(a, b), order=0, engine="r", request=0))
    return out


def test_a_fault_on_third_chunks_is_named_by_the_chunk_not_the_mode() -> None:
    """Chunks 2 and 3 share the ``later-chunk`` mode: only the chunk index separates
    a fault on third chunks (before: the mode could not, and nothing was named)."""
    run = [wrong(o) if o.chunk == 3 else o for o in chunked_run()]
    diag = diagnose_run(run)
    assert diag.tag == "confined", diag.headline
    assert "prefill chunk 3" in diag.headline
    assert ("prefill chunk", frozenset({"3"})) in diag.named


def test_a_fault_on_one_batch_size_is_named_by_the_batch_size() -> None:
    run = [wrong(o) if o.batch == 4 else o for o in chunked_run()]
    diag = diagnose_run(run)
    assert diag.tag == "confined" and "batch size 4" in diag.headline, diag.headline


def test_an_attribute_a_wrong_comparison_does_not_know_is_never_named() -> None:
    """A decode comparison has no prefill chunk: a fault on decode and chunk 3 is named by
    the modes and ranks, never by a chunk value it lacks."""
    run = [wrong(o) if o.chunk == 3 or o.mode == "decode" else o for o in chunked_run()]
    diag = diagnose_run(run)
    assert all(name != "prefill chunk" for name, _ in diag.named), diag.headline


def test_the_slots_every_wrong_comparison_shares_narrow_the_cause() -> None:
    run = [wrong(o, slots=(1, 2)) if o.chunk == 3 else o for o in chunked_run()]
    diag = diagnose_run(run)
    assert (SLOT, frozenset({"1", "2"})) in diag.named
    assert diag.headline.endswith("; inside them only slot 1 or 2 wrong, the rest right"), diag.headline


def test_slots_that_differ_between_wrong_comparisons_are_not_named() -> None:
    run = [wrong(o, slots=(1,) if o.rank == 0 else (2,)) if o.chunk == 3 else o for o in chunked_run()]
    diag = diagnose_run(run)
    assert diag.tag == "confined" and all(name != SLOT for name, _ in diag.named), diag.headline


def test_a_shared_row_boundary_is_named() -> None:
    """A fault from position 36 on: the third chunks are wrong on rows 36..39 only."""
    run = [wrong(o, rows=[(36, 40)]) if o.chunk == 3 else o for o in chunked_run()]
    diag = diagnose_run(run)
    assert (ROWS, frozenset({"positions 36 on"})) in diag.named, diag.headline
    assert "only positions 36 on wrong" in diag.headline


def test_row_boundaries() -> None:
    a = obs(ok=False, rows=(0, 16), wrong_rows=((4, 16),))
    b = obs(ok=False, rows=(2, 20), wrong_rows=((4, 20),))
    c = obs(ok=False, rows=(0, 16), wrong_rows=((0, 8),))
    d = obs(ok=False, rows=(4, 20), wrong_rows=((4, 8),))
    assert row_boundary([a, b]) == "positions 4 on"
    assert row_boundary([c, replace(c, rows=(0, 30))]) == "positions before 8"
    assert row_boundary([replace(a, wrong_rows=((4, 8),)), d]) == "positions 4..7"
    assert row_boundary([a, c]) is None  # no boundary they share
    assert row_boundary([replace(a, wrong_rows=((0, 16),))]) is None  # every row: nothing inside
    assert row_boundary([replace(a, wrong_rows=((0, 2), (4, 16)))]) is None  # two ranges
    assert row_boundary([replace(a, rows=None)]) is None  # rows not known


def test_within_names_nothing_for_every_slot() -> None:
    assert within([obs(ok=False, wrong_slots=(0, 1, 2))]) == []
    assert within([obs(ok=False, wrong_slots=(2,), slot_count=0)]) == []  # not a slot comparison


def test_a_chunked_rank_comparison_carries_its_chunk_slots_and_rows() -> None:
    """The per-rank observations of a chunked prompt: each chunk's number, its rows'
    positions, the wrong slot and the wrong rows cut to the chunk."""
    import torch

    from pytest_eagle3.engine.recordings import Record, prefill_records
    from pytest_eagle3.plugin.diagnosis import observations_of
    from pytest_eagle3.verdicts.rankcheck import check_rank_slots

    L, H, T = 4, 8, 6
    ref = torch.randn(L + 2, T, H, generator=torch.Generator().manual_seed(1))
    expected = [0, 2, 3]
    aux = torch.cat([ref[i] for i in expected], dim=1)
    bad = aux.clone()
    bad[2:4, H:2 * H] = ref[1][2:4]  # rows 2..3 of the first chunk (rows 0..3), slot 1

    def forwards(rows):
        pos = torch.arange(T)
        return [Record(0, n, "EXTEND", rows[a:b], torch.zeros(b - a, dtype=torch.long), pos[a:b], None,
                       ("r0",), (b - a,)) for n, (a, b) in enumerate(((0, 4), (4, 6)))]

    joined = prefill_records({0: forwards(bad), 1: forwards(aux)}, ["r0"])
    report = check_rank_slots(joined, [ref], expected=expected, num_layers=L, hidden_size=H, tol=1e-4)
    got = [Observation.from_json(o) for o in observations_of(
        report, {"test": "t", "check": "ranks", "ids": expected, "modes": ["later-chunk"], "batch": 1})]
    first = got[0]
    assert (first.rank, first.chunk, first.ok, first.rows, first.wrong_rows, first.wrong_slots, first.slot_count) \
        == (0, 1, False, (0, 4), ((2, 4),), (1,), 3)
    assert (got[1].chunk, got[1].ok, got[1].rows) == (2, True, (4, 6))
    # Rank 1 (right) split by chunk too: its chunks are evidence of their chunk numbers.
    assert [(o.rank, o.chunk, o.ok, o.rows) for o in got[2:]] == [(1, 1, True, (0, 4)), (1, 2, True, (4, 6))]


def test_observations_keep_the_new_fields_through_json() -> None:
    o = obs(ok=False, batch=3, chunk=2, wrong_slots=(1,), rows=(16, 23), wrong_rows=((18, 23),))
    import json

    assert Observation.from_json(json.loads(json.dumps(o.to_json()))) == o


def test_a_right_comparison_whose_chunk_is_not_known_blocks_a_chunk_cause() -> None:
    """Rank 1 wrong in chunk 2 of a three-chunk prompt; the API's last chunk (its number not
    known) was right: that comparison may be chunk 2, so ``prefill chunk 2`` alone is never
    named, the rank is."""
    kw = dict(tp=2, order=0, engine="e", batch=1, slot_count=3, request=1)
    run = [obs(mode="later-chunk", chunk=-1, **kw),
           obs(check="ranks", rank=0, mode="prefill", chunk=1, **kw),
           obs(check="ranks", rank=0, mode="later-chunk", chunk=2, **kw),
           obs(check="ranks", rank=1, mode="prefill", chunk=1, **kw),
           wrong(obs(check="ranks", rank=1, mode="later-chunk", chunk=2, **kw)),
           obs(check="ranks", rank=1, mode="later-chunk", chunk=3, **kw)]
    without_rank0 = [o for o in run if o.rank != 0]
    diag = diagnose_run(without_rank0)
    assert dict(diag.named) == {"TP rank": frozenset({"rank 1"}), "prefill chunk": frozenset({"2"})}, diag.headline
    diag = diagnose_run(run)
    assert dict(diag.named).get("TP rank") == frozenset({"rank 1"}), diag.headline


def test_an_attribute_whose_wrong_values_are_all_it_takes_does_not_separate() -> None:
    """Wrong comparisons with batch size 1, right ones whose batch is not known: ``batch
    size 1`` would name every comparison that knows its batch, not a cause."""
    run = [wrong(obs(mode="prefill", chunk=1, batch=1)), wrong(obs(mode="decode", batch=1)),
           obs(mode="prefill", chunk=1, batch=0, test="c"), obs(mode="decode", batch=0, test="c")]
    diag = diagnose_run(run)
    assert all(name != "batch size" for name, _ in diag.named), diag.headline


def test_a_wrong_chunk_carries_its_own_wrong_slots_not_the_whole_requests() -> None:
    """Slot 1 wrong in chunk 2 only, slot 0 off in chunk 1 only (within the tolerance over
    the whole prompt): each chunk's observation names its own wrong slot, so no slot is
    shared and none is named."""
    import torch
    from types import SimpleNamespace

    from pytest_eagle3.plugin.diagnosis import observations_of
    from pytest_eagle3.verdicts.compare import compare_slots
    from pytest_eagle3.verdicts.rankcheck import _chunk_outcomes

    torch.manual_seed(0)
    L, H, T, expected, tol = 4, 8, 32, [1, 2, 3], 0.01
    ref = torch.randn(L + 2, T, H, dtype=torch.float64)
    aux = torch.cat([ref[e] for e in expected], dim=1).clone()
    aux[20:32, H:2 * H] *= 1.5
    aux[0:16, 0:H] *= 1.012
    rec = SimpleNamespace(aux=aux, chunks=(16, 16), positions=torch.arange(T))
    whole = compare_slots(aux, ref, expected=expected, num_layers=L, hidden_size=H, tol=tol, first_row=0)
    assert [v.slot for v in whole.slots if not v.ok] == [1]

    def judge(rows, name):
        return compare_slots(aux[rows], ref[:, rows], diagnose=False, side_names=(name, "ref"), expected=expected,
                             num_layers=L, hidden_size=H, tol=tol, first_row=rows.start)

    report = SimpleNamespace(ok=False, outcomes=_chunk_outcomes(1, 0, rec, whole, judge), kinds=())
    got = [Observation.from_json(e) for e in observations_of(
        report, {"test": "t", "check": "ranks", "tp": 2, "modes": ["later-chunk"]})]
    assert [(o.chunk, o.ok, o.wrong_slots) for o in got] == [(1, False, (0,)), (2, False, (1,))]
    assert within([o for o in got if not o.ok]) == []
