"""The run-level diagnosis (``pytest_eagle3.verdicts.run_cause``): each class of
cause named from the whole run's observations, never a cause the run contradicts."""

from __future__ import annotations

from pytest_eagle3.verdicts.run_cause import (
    LACK_PREFILL, OFFLINE, SERVED, Observation, diagnose_run,
)

IDS = (0, 3, 5)


def obs(test: str = "t", ok: bool = True, **kw) -> Observation:
    kw.setdefault("ids", IDS)
    kw.setdefault("check", "captures")
    return Observation(test=test, ok=ok, **kw)


def plain_run(**overrides) -> list[Observation]:
    """A run's capture comparisons: prefill and later chunks on two tests, decode,
    a batch, a radix-cache hit, per-rank prefill and decode at TP 2."""
    out = [
        obs("order[a]", mode="prefill", order=0, engine="e1"),
        obs("order[a]", mode="later-chunk", order=0, engine="e1"),
        obs("contract[b]", mode="prefill", order=1, engine="e1"),
        obs("contract[b]", mode="later-chunk", order=1, engine="e1"),
        obs("paths[decode]", path="decode", mode="decode", order=2, engine="e1"),
        obs("paths[batch]", path="batch", mode="prefill", order=3, engine="e1"),
        obs("paths[radix]", path="radix-cache-hit", mode="cache-hit", order=4, engine="e1"),
    ]
    for rank in (0, 1):
        for mode in ("prefill", "decode"):
            out.append(obs("per_rank[tp2]", tp=2, mode=mode, rank=rank, check="ranks"))
    return out


def failing(run: list[Observation], pred, **change) -> list[Observation]:
    from dataclasses import replace

    return [replace(o, ok=False, **change) if pred(o) else o for o in run]


def test_clean_run_says_so_in_one_line() -> None:
    diag = diagnose_run(plain_run())
    assert diag.tag == "clean" and diag.lines() == [diag.headline]
    assert diag.headline.startswith("[clean] nothing is wrong: 11 comparisons in 6 tests agree")
    assert diagnose_run([]) is None
    one = diagnose_run([obs("order[a]", mode="prefill")])
    assert one.headline.startswith("[clean] nothing is wrong: 1 comparison in 1 test agrees ")


def test_fault_on_radix_hits_only_is_named_path_only_not_the_id_rule() -> None:
    run = failing(plain_run(), lambda o: o.mode == "cache-hit", kinds=("offset-twice",), line="slot 0 ...")
    diag = diagnose_run(run)
    assert diag.tag == "path-only", diag.lines()
    assert diag.headline.startswith("[path-only] wrong only on cache-hit; right on prefill, later-chunk, decode "
                                    "for ids [0, 3, 5]")
    assert any("[offset-twice] names the id rule" in line and "not the cause" in line for line in diag.evidence)


def test_fault_on_later_chunks_only() -> None:
    diag = diagnose_run(failing(plain_run(), lambda o: o.mode == "later-chunk"))
    assert diag.tag == "path-only" and "wrong only on later-chunk" in diag.headline


def test_fault_on_batches_only_names_the_path() -> None:
    diag = diagnose_run(failing(plain_run(), lambda o: o.path == "batch"))
    assert diag.tag == "path-only" and "wrong only on batch" in diag.headline, diag.lines()


def test_fault_on_one_rank_in_decode_only() -> None:
    diag = diagnose_run(failing(plain_run(), lambda o: o.rank == 1 and o.mode == "decode"))
    assert diag.tag == "rank-mode", diag.lines()
    assert diag.headline.startswith("[rank-mode] rank 1 only, decode only")


def test_fault_after_some_requests_is_stale_state() -> None:
    diag = diagnose_run(failing(plain_run(), lambda o: o.order >= 2))
    assert diag.tag == "stale-state", diag.lines()
    assert "right for the first 2 send(s) of the suite's prompts on each engine, wrong from then on" in diag.headline


def test_lower_precision_copy() -> None:
    run = failing(plain_run(), lambda o: o.rank is None, right_snapshots=True, worst_err=2.1e-4, tol=1e-4)
    diag = diagnose_run(run)
    assert diag.tag == "precision", diag.lines()
    assert "off by up to 2.1e-04 (tolerance 1e-04)" in diag.headline and "float16" in diag.headline


def test_a_wrong_snapshot_is_not_precision() -> None:
    run = failing(plain_run(), lambda o: True, right_snapshots=False, worst_err=2.1e-4, tol=1e-4)
    assert diagnose_run(run).tag != "precision"


def test_captures_right_draft_wrong() -> None:
    run = plain_run() + [
        obs("gate_has_power", level=OFFLINE, check="acceptance", value=3.88),
        obs("gate[tp1]", ok=False, level=SERVED, check="acceptance", value=1.027),
    ]
    diag = diagnose_run(run)
    assert diag.tag == "draft-side", diag.lines()
    assert "offline (accept length 3.88" in diag.headline and "1.027" in diag.headline


def test_draft_wrong_offline_too_is_the_draft() -> None:
    run = plain_run() + [
        obs("gate_has_power", ok=False, level=OFFLINE, check="acceptance", value=1.1),
        obs("gate[tp1]", ok=False, level=SERVED, check="acceptance", value=1.027),
    ]
    assert diagnose_run(run).tag == "draft"


def test_global_fault_keeps_the_tests_cause() -> None:
    run = failing(plain_run(), lambda o: True, kinds=("offset-twice",), line="slot 0 holds hs[1] [offset-twice]")
    diag = diagnose_run(run)
    assert diag.tag == "global" and "[offset-twice]" in diag.headline


def test_what_the_selection_lacked_is_said() -> None:
    run = [obs("paths[radix]", ok=False, path="radix-cache-hit", mode="cache-hit")]
    diag = diagnose_run(run)
    assert LACK_PREFILL in " ".join(diag.lacking)


def test_observations_survive_json() -> None:
    o = obs("x", ok=False, rank=1, mode="decode", kinds=("partial-sum",), value=None)
    assert Observation.from_json(o.to_json()) == o


# --- the per-test side of a lower-precision copy ---------------------------------


def test_a_half_precision_copy_is_named_by_its_test_without_contradiction() -> None:
    """Every slot the right snapshot, off by a float16 round trip: the capture-order
    test names ``[precision]`` and never claims the layers differ from the rule."""
    import torch

    from pytest_eagle3.verdicts import order
    from pytest_eagle3.verdicts.compare import compare_slots

    torch.manual_seed(0)
    L, T, H = 6, 5, 64
    ref = torch.randn(L + 2, T, H)
    expected = [0, 3, 5]
    exact = torch.cat([ref[i] for i in expected], dim=-1)
    copy = exact.to(torch.float16).to(torch.float32)
    report = compare_slots(copy, ref, expected=expected, num_layers=L, hidden_size=H, tol=1e-4)
    assert not report.ok and "precision" in report.kinds
    rule = type("Rule", (), {"known": True, "source": "model.py:10", "kind": "adds one"})()
    verdict = order.check_capture_order(report, rule=rule, ids=expected, predicted=tuple(expected), num_layers=L)
    text = verdict.report.message()
    assert "[precision]" in text and "float16 round trip" in text
    assert "Something besides" not in (verdict.text or "") + text
    assert compare_slots(exact, ref, expected=expected, num_layers=L, hidden_size=H, tol=1e-4).ok


def test_a_failure_without_a_comparison_is_never_called_clean() -> None:
    diag = diagnose_run(plain_run(), unobserved=[("per_rank[agree]", "ranks disagree: 1 of 10")])
    assert diag.tag == "no-verdict" and "1 test(s) failed without one: per_rank[agree]: ranks disagree" in diag.headline
    bad = failing(plain_run(), lambda o: o.mode == "cache-hit")
    diag = diagnose_run(bad, unobserved=[("per_rank[agree]", "ranks disagree")])
    assert diag.tag == "path-only" and diag.evidence[-1].startswith("  also failed, without a comparison: per_rank")
    assert diag.named == (("forward mode", frozenset({"cache-hit"})),)  # the named cause survives the listing


def test_agreeing_pairs_and_right_row_counts_are_no_evidence_of_right_values() -> None:
    """Every capture wrong the same way (a bisect step's wrong ids): the pair checks
    (radix hit vs fresh send) and row counts pass, yet the run is [global], not mixed."""
    run = failing(plain_run(), lambda o: True, kinds=("offset-twice",), line="3 of 3 slots wrong")
    run += [obs("paths[radix]", check="pair", path="radix-cache-hit", mode="cache-hit"),
            obs("paths[plain]", check="rows", mode="prefill")]
    assert diagnose_run(run).tag == "global"


def test_recorded_forwards_get_the_diagnosis_modes() -> None:
    from pytest_eagle3.verdicts.run_cause import forward_mode

    assert forward_mode("EXTEND", 0) == "prefill" and forward_mode("EXTEND", 16) == "later-chunk"
    assert forward_mode("DECODE", 23) == "decode" and forward_mode("TARGET_VERIFY", 30) == "verify"


def test_ranks_that_agree_are_no_evidence_and_one_that_disagrees_is() -> None:
    """``check_ranks_agree`` hands over one outcome per (rank, forward): a rank that
    disagrees in decode joins the rank-mode evidence; agreeing ranks (equally wrong
    ones agree) prove nothing."""
    from types import SimpleNamespace

    import torch

    from pytest_eagle3.plugin.diagnosis import observations_of
    from pytest_eagle3.verdicts.rankcheck import check_ranks_agree

    def rec(rank: int, mode: str, value: float):
        return SimpleNamespace(rank=rank, mode=mode, aux=torch.full((2, 8), value))

    records = {0: [rec(0, "EXTEND", 1.0), rec(0, "DECODE", 2.0)], 1: [rec(1, "EXTEND", 1.0), rec(1, "DECODE", 2.5)]}
    report = check_ranks_agree(records, hidden_size=4)
    assert not report.ok and [(r, i, ok) for r, i, ok, _ in report.outcomes] == [(1, 0, True), (1, 1, False)]
    got = [Observation.from_json({"test": "agree", **o}) for o in observations_of(
        report, {"check": "agree", "ids": [0, 3, 5], "modes": ["prefill", "decode"]})]
    assert [(o.rank, o.mode, o.ok) for o in got] == [(1, "prefill", True), (1, "decode", False)]
    # The value check of rank 1's decode rows agrees (consistent evidence): rank 1, decode only.
    run = failing(plain_run(), lambda o: o.rank == 1 and o.mode == "decode") + got
    assert diagnose_run(run).tag == "rank-mode"
    assert diagnose_run(plain_run() + got[:1]).tag == "clean"


def test_a_rank_0_fault_is_named_rank_0_though_the_agreement_check_lists_rank_1() -> None:
    """The agreement check compares rank 1 with rank 0, so a rank-0 decode fault fails
    there as "rank 1, decode"; the ranks' comparisons with the reference say rank 0.
    The pair check points to them, and the run names rank 0."""
    agree = [obs("agree[tp2]", tp=2, rank=1, mode=m, check="agree", ok=m != "decode") for m in ("prefill", "decode")]
    run = failing(plain_run(), lambda o: o.rank == 0 and o.mode == "decode") + agree
    diag = diagnose_run(run)
    assert diag.tag == "rank-mode" and diag.headline.startswith("[rank-mode] rank 0 only, decode only"), diag.lines()
    assert diag.evidence[-1] == ("  also: 1 comparison(s) of the TP ranks with each other disagree (agree[tp2]): a "
                                 "pair check cannot say which rank is wrong; the ranks' comparisons with the "
                                 "reference above do")
    # Alone (no comparison with the reference failed), the disagreement is the evidence.
    alone = diagnose_run(plain_run() + agree)
    assert alone.tag != "clean" and not any("a pair check cannot say" in line for line in alone.evidence)


def test_the_embedding_checks_right_rows_do_not_hide_a_fault_in_the_layers_slots() -> None:
    """Measured on the real engine (a partial sum on rank 0's decode forwards at TP 2):
    the embedding check's decode rows on rank 0 are right, but it examines the embedding
    slot only, and the wrong comparisons got the layers' snapshots wrong: no evidence
    either way.  Counted, they made the run ``[mixed]``."""
    run = failing(plain_run(), lambda o: o.rank == 0 and o.mode == "decode", wrong_snapshots=(3, 5))
    run += [obs("embedding[tp2]", tp=2, mode=m, rank=r, check="ranks", snapshots=(0,))
            for r in (0, 1) for m in ("prefill", "decode")]
    diag = diagnose_run(run)
    assert diag.headline.startswith("[rank-mode] rank 0 only, decode only"), diag.lines()
    # A fault in the embedding slot: the same rows are evidence.
    emb = failing(run, lambda o: o.rank == 0 and o.mode == "decode" and o.snapshots is None, wrong_snapshots=(0,))
    assert not diagnose_run(emb).headline.startswith("[rank-mode]"), diagnose_run(emb).lines()


# --- exact separations (a named cause never holds a right comparison) ---------------


def test_a_rank_fault_seen_only_on_a_later_send_is_the_rank_not_stale_state() -> None:
    """Rank 1 wrong in prefill and decode (recorded on the second send), the API's rows
    (rank 0, first send) and rank 0's recorded rows right: the rank, not the send order."""
    run = [obs("paths[v]", tp=2, path="v", mode=m, order=0, engine="e") for m in ("prefill", "decode")]
    run += [obs("paths[v]", tp=2, path="v", mode=m, order=1, engine="e", rank=r, check="ranks", ok=r == 0)
            for r in (0, 1) for m in ("prefill", "decode")]
    diag = diagnose_run(run)
    assert diag.tag == "rank" and diag.headline.startswith("[rank] TP rank 1 only: every comparison of TP rank 1 "
                                                           "is wrong (2) and every other rank's right (2)"), diag.lines()


def test_a_mode_with_a_right_comparison_is_not_named_the_cause() -> None:
    """A batch-only decode fault in ``-k "tp1-batch or tp1-decode"``: decode is right on the
    decode path, so "wrong only on decode" would hold a right comparison; the exact cause is
    the batch path's decode rows."""
    run = [obs("paths[batch]", path="batch", mode="prefill", order=0, engine="e"),
           obs("paths[batch]", path="batch", mode="decode", order=0, engine="e", ok=False),
           obs("paths[decode]", path="decode", mode="prefill", order=1, engine="e"),
           obs("paths[decode]", path="decode", mode="decode", order=1, engine="e")]
    diag = diagnose_run(run)
    assert diag.tag == "confined", diag.lines()
    assert diag.headline.startswith("[confined] wrong exactly where forward mode decode and path batch: all 1 "
                                    "comparisons there are wrong, the 3 elsewhere right"), diag.headline


def test_stale_state_needs_every_later_comparison_wrong() -> None:
    run = [obs("a", mode="prefill", order=0, engine="e"), obs("b", mode="prefill", order=1, engine="e", ok=False),
           obs("c", path="decode", mode="decode", order=2, engine="e", ok=False),
           obs("d", path="batch", mode="prefill", order=3, engine="e")]  # right after the first wrong one
    assert diagnose_run(run).tag != "stale-state"


def test_no_separation_prints_the_table_and_names_nothing() -> None:
    run = [obs("a", mode="prefill", order=0, engine="e", ok=False), obs("a", mode="decode", order=0, engine="e"),
           obs("b", mode="prefill", order=1, engine="e"), obs("b", mode="decode", order=1, engine="e", ok=False)]
    diag = diagnose_run(run)
    assert diag.tag == "mixed", diag.lines()
    assert "  separating table (value: wrong / right comparisons):" in diag.evidence
    assert "  forward mode: prefill: 1 / 1, decode: 1 / 1" in diag.evidence
    assert "  send on its engine: 1 on e: 1 / 1, 2 on e: 1 / 1" in diag.evidence


def test_separation_is_exact_on_random_runs() -> None:
    """Every named separation holds every wrong comparison and no right one (hypothesis:
    random runs, random faults confined to a random conjunction)."""
    import hypothesis
    st = hypothesis.strategies
    from pytest_eagle3.verdicts.separation import TABLE_ATTRIBUTES, separation

    @hypothesis.given(st.lists(st.tuples(st.sampled_from([1, 2]), st.sampled_from([None, 0, 1]),
                                         st.sampled_from(["prefill", "decode", "later-chunk"]),
                                         st.sampled_from(["plain", "batch"]), st.integers(0, 3), st.booleans()),
                               min_size=1, max_size=30))
    @hypothesis.settings(max_examples=200, deadline=None)
    def check(rows):
        run = [obs("t", tp=tp, rank=rank, mode=mode, path=path, order=order, engine="e", ok=ok)
               for tp, rank, mode, path, order, ok in rows]
        reads = dict(TABLE_ATTRIBUTES)
        for rule in separation(run):
            chosen = [o for o in run if all(reads[name](o) in values for name, values in rule)]
            assert all(not o.ok for o in chosen) and all(o.ok for o in run if o not in chosen)

    check()


def test_sampled_faults_are_named_exactly_or_by_an_equivalent_cause_never_wrongly() -> None:
    """The fault grammar's simulator (verdicts/grammar.py): faults confined to 1, 2 and 3
    attributes on a default run's observations; a named cause never holds a right
    comparison or misses a wrong one."""
    from pytest_eagle3.verdicts.grammar import simulate

    for size in (1, 2, 3):
        counts = simulate(300, size, seed=7)
        assert counts["wrong"] == 0, (size, counts)
        assert counts["exact"] + counts["coarser"] == 300, (size, counts)


def test_grammar_property_on_random_seeds() -> None:
    import hypothesis
    from hypothesis import strategies as st

    from pytest_eagle3.verdicts.grammar import EFFECTS, classify, default_run, sample_confinement

    run = default_run()

    @hypothesis.given(st.integers(0, 10**6), st.integers(1, 4), st.sampled_from(EFFECTS))
    @hypothesis.settings(max_examples=300, deadline=None)
    def check(seed, size, effect):
        import random

        conj = sample_confinement(random.Random(seed), run, size)
        assert classify(run, conj, effect)[0] != "wrong"

    check()


def test_a_first_chunk_fault_is_seen_chunk_by_chunk_on_every_rank() -> None:
    """A chunked prompt's wrong prefill rows on a rank are judged per chunk, each with its
    forward mode: a fault on first chunks only fails the ``prefill`` outcomes and
    passes the ``later-chunk`` ones (before, the whole prompt was one wrong
    ``later-chunk`` outcome, and the run said ``[mixed]``)."""
    import torch

    from pytest_eagle3.engine.recordings import Record, prefill_records
    from pytest_eagle3.plugin.diagnosis import observations_of
    from pytest_eagle3.verdicts.rankcheck import check_rank_slots

    L, H, T = 4, 8, 6
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(L + 2, T, H, generator=g)
    expected = [0, 2, 3]
    aux = torch.cat([ref[i] for i in expected], dim=1)
    bad = aux.clone()
    bad[:4, H:2 * H] = ref[1][:4]  # the first chunk (rows 0..3) captures the wrong snapshot

    def forwards(rows):
        pos = torch.arange(T)
        return [Record(0, n, "EXTEND", rows[a:b], torch.zeros(b - a, dtype=torch.long), pos[a:b], None,
                       ("r0",), (b - a,)) for n, (a, b) in enumerate(((0, 4), (4, 6)))]

    joined = prefill_records({0: forwards(bad), 1: forwards(aux)}, ["r0"])
    assert joined[0][0].chunks == (4, 2)
    report = check_rank_slots(joined, [ref], expected=expected, num_layers=L, hidden_size=H, tol=1e-4)
    assert not report.ok
    got = [(o["rank"], o["mode"], o["ok"]) for o in observations_of(
        report, {"check": "ranks", "ids": [0, 2, 3], "modes": ["later-chunk"]})]
    # Every rank split by chunk (rank 1's right chunks too: a right chunk is evidence of its chunk).
    assert got == [(0, "prefill", False), (0, "later-chunk", True), (1, "prefill", True), (1, "later-chunk", True)]
    # The worded report names the rows and the boundary they share.
    assert "rows: 4 of 6 wrong (0..3), 2 right (4..5): exactly chunk 1 (rows 0..3)" in report.message()


def test_the_embedding_check_judges_a_chunked_prompt_chunk_by_chunk() -> None:
    """The per-rank embedding check splits a wrong chunked prompt by chunk too: a
    fault on first chunks fails its ``prefill`` outcome only (measured before: a
    fault on rank 1's first chunks left one wrong ``later-chunk`` embedding outcome
    beside ``prefill`` ones, and the run judged it off its confinement)."""
    import torch

    from pytest_eagle3.engine.recordings import Record, prefill_records
    from pytest_eagle3.plugin.diagnosis import observations_of
    from pytest_eagle3.verdicts.rankcheck import check_rank_embeddings

    L, H, T, V = 4, 8, 6, 32
    g = torch.Generator().manual_seed(2)
    ref = torch.randn(L + 2, T, H, generator=g)
    aux = torch.cat([ref[0], ref[2]], dim=1)
    bad = aux.clone()
    bad[:4, :H] *= 1.5  # the first chunk's embedding rows are off

    def forwards(rows):
        pos = torch.arange(T)
        ids = torch.arange(T)
        return [Record(0, n, "EXTEND", rows[a:b], ids[a:b], pos[a:b], None, ("r0",), (b - a,))
                for n, (a, b) in enumerate(((0, 4), (4, 6)))]

    joined = prefill_records({0: forwards(aux), 1: forwards(bad)}, ["r0"])
    report = check_rank_embeddings(joined, [ref], slot=0, hidden_size=H, vocab_size=V, tol=1e-4)
    assert not report.ok
    got = [(o["rank"], o["mode"], o["ok"]) for o in observations_of(
        report, {"check": "ranks", "ids": [0, 2], "modes": ["later-chunk"]})]
    assert got == [(0, "prefill", True), (0, "later-chunk", True), (1, "prefill", False), (1, "later-chunk", True)]


def test_a_chunked_prompt_wrong_as_a_whole_stays_one_wrong_outcome() -> None:
    """Rows missing against the reference (the record holds 6 of the prompt's 8) fail
    the request while each chunk's own rows match: the outcome stays one wrong
    request, never chunks that are all right."""
    import torch

    from pytest_eagle3.engine.recordings import Record, prefill_records
    from pytest_eagle3.verdicts.rankcheck import check_rank_embeddings

    L, H, T, V = 4, 8, 8, 32
    ref = torch.randn(L + 2, T, H, generator=torch.Generator().manual_seed(2))
    aux = torch.cat([ref[0], ref[2]], dim=1)[:6]
    pos, ids = torch.arange(6), torch.arange(6)
    recs = [Record(0, n, "EXTEND", aux[a:b], ids[a:b], pos[a:b], None, ("r0",), (b - a,))
            for n, (a, b) in enumerate(((0, 4), (4, 6)))]
    report = check_rank_embeddings(prefill_records({0: recs}, ["r0"]), [ref], slot=0, hidden_size=H,
                                   vocab_size=V, tol=1e-4)
    assert not report.ok and [o[2] for o in report.outcomes] == [False]
