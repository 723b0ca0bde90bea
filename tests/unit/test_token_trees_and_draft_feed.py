"""Token trees, the draft's inputs and the overlap pair without an engine.

The real-engine side: ``pytest_eagle3/suite/test_speculative_shapes.py`` under
``--eagle3-slow`` (``tests/e2e/test_speculative_shapes.py``), where the
``tree-order-aux`` and ``chunk-seam-prediction`` faults are caught inside SGLang.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_eagle3.engine.draft_inputs import AFTER_VERIFY, PREFILL, DraftFeed, fed_rows  # noqa: E402
from pytest_eagle3.engine.recordings import Record, tree_parents  # noqa: E402
from pytest_eagle3.engine.spec_shapes import CHAIN, CPU_SPEC_OVERLAP, OTHER_SCHEDULE, TREE, get_shape  # noqa: E402
from pytest_eagle3.engine.verify_tree import node_groups, root_path, tree_summary, verify_node_records  # noqa: E402
from pytest_eagle3.verdicts.draft_feed import check_draft_feed  # noqa: E402
from pytest_eagle3.verdicts.schedules import NO_OVERLAP, OVERLAP, check_schedules, keyed, schedule_of  # noqa: E402

H = 4
#: A request's final tokens: prompt [10, 11, 12], then 13, 14, 15, 16.
SEQ = [10, 11, 12, 13, 14, 15, 16]


def _stack(seq, k=1):
    """A fake reference ``[3, len, H]`` whose rows encode (token history) so another root path differs."""
    out = torch.zeros(3, len(seq), H)
    for p in range(len(seq)):
        out[:, p] = torch.tensor([float(sum(seq[: p + 1])), float(seq[p]), float(p + 1), 1.0])
    return out


def _verify(parents, tokens, positions, rid="r"):
    n = len(tokens)
    first = [-1] * n
    sibling = [-1] * n
    for child in range(n - 1, 0, -1):  # links as SGLang's build_tree writes them: latest inserted first
        p = parents[child]
        sibling[child], first[p] = first[p], child
    got = tuple(tree_parents(first, sibling))
    assert got == tuple(parents)
    aux = torch.stack([_stack(SEQ[: positions[0]] + [tokens[i] for i in root_path(list(parents), i)])[1, -1]
                       for i in range(n)])
    return Record(0, 1, "TARGET_VERIFY", aux, torch.tensor(tokens), torch.tensor(positions), None, (rid,), (n,),
                  parents=got)


def test_tree_links_give_parents_and_unreached_nodes() -> None:
    # Root 0 with children 1 and 2; node 3 under 2; node 4 never linked.
    assert tree_parents([1, -1, 3, -1, -1], [-1, 2, -1, -1, -1]) == [-1, 0, 0, 2, -2]
    assert root_path([-1, 0, 0, 2, -2], 3) == [0, 2, 3] and root_path([-1, 0, 0, 2, -2], 4) is None


def test_each_tree_node_is_referenced_on_its_own_root_path() -> None:
    """Root 13 at position 3 (committed 10 11 12); accepted 14, 15; a sibling 99 of 14 and 98 under 99."""
    rec = _verify(parents=(-1, 0, 0, 1, 2), tokens=[13, 14, 99, 15, 98], positions=[3, 4, 4, 5, 5])
    groups = node_groups(rec, SEQ)
    assert groups == [([0, 1, 3], ()), ([2, 4], (10, 11, 12, 13, 99, 98))]
    out = verify_node_records({0: [rec]}, {"r": SEQ})[0]
    assert [r.reference for r in out] == [(), (10, 11, 12, 13, 99, 98)]
    assert [r.positions.tolist() for r in out] == [[3, 4, 5], [4, 5]]
    assert tree_summary(out, {"r": SEQ}) == "verify compared 5 tree nodes of 1 forwards (2 off the accepted path)"
    # Without off-path nodes only the verified chain is kept (the DP check compares with the final sequence).
    assert [r.positions.tolist() for r in verify_node_records({0: [rec]}, {"r": SEQ}, off_path=False)[0]] == [[3, 4]]


def _feed(kind, positions, ids, aux, chunk_end=-1, rid="r", rank=0):
    return DraftFeed(rank, 1, rid, kind, aux, torch.tensor(ids), torch.tensor(positions), chunk_end)


def _right(positions):
    ref = _stack(SEQ)
    return torch.stack([ref[1, p] for p in positions])


def test_fed_rows_reads_the_accepted_rows_and_marks_chunk_ends() -> None:
    ref = _stack(SEQ)
    prefill = {"mode": "EXTEND", "seq": 1, "rids": ["r"], "lens": [2], "aux": ref[1, :2],
               "input_ids": torch.tensor([11, 12]), "positions": torch.tensor([0, 1])}
    after = {"mode": "DRAFT_EXTEND_V2", "seq": 2, "rids": ["r"], "lens": [4], "aux": ref[1, 3:7],
             "input_ids": torch.tensor([14, 15, 0, 0]), "positions": torch.tensor([3, 4, 5, 6]),
             "accept": torch.tensor([2])}
    feeds = fed_rows({0: [prefill, after]}, {"r": SEQ[:3]}, {"r": SEQ})[0]
    assert [(f.kind, f.positions.tolist(), f.chunk_end) for f in feeds] == [(PREFILL, [0, 1], 1),
                                                                          (AFTER_VERIFY, [3, 4], -1)]


def test_draft_feed_passes_right_rows_and_names_a_chunk_seam() -> None:
    refs = {"r": _stack(SEQ)}
    right = {0: [_feed(PREFILL, [0, 1], [11, 12], _right([0, 1]), chunk_end=1),
                 _feed(AFTER_VERIFY, [3, 4], [14, 15], _right([3, 4]))]}
    assert check_draft_feed(right, {"r": SEQ}, refs, expected=[1], num_layers=1, tol=1e-6, draft="d").ok
    seam = {0: [_feed(PREFILL, [0, 1], [11, 77], _right([0, 1]), chunk_end=1),
                _feed(AFTER_VERIFY, [3, 4], [14, 15], _right([3, 4]))]}
    verdict = check_draft_feed(seam, {"r": SEQ}, refs, expected=[1], num_layers=1, tol=1e-6, draft="d")
    assert not verdict.ok and "[chunk-seam]" in verdict.text and "read 77 where the next prompt token is 12" in verdict.text
    nothing = check_draft_feed({0: right[0][:1]}, {"r": SEQ}, refs, expected=[1], num_layers=1, tol=1e-6, draft="d")
    assert not nothing.ok and "no after-verify draft extend" in nothing.text


def test_draft_feed_names_states_left_in_tree_order() -> None:
    """The verify's nodes 0..2 in tree order are 13, 99 (a sibling), 14: the draft's rows after it
    must be the accepted 13, 14, not node 1 (99)."""
    rec = _verify(parents=(-1, 0, 0), tokens=[13, 99, 14], positions=[3, 4, 4])
    refs = {"r": _stack(SEQ)}
    wrong = {0: [_feed(PREFILL, [0, 1], [11, 12], _right([0, 1]), chunk_end=-1),
                 _feed(AFTER_VERIFY, [3, 4], [14, 15], rec.aux[:2])]}
    verdict = check_draft_feed(wrong, {"r": SEQ}, refs, expected=[1], num_layers=1, tol=1e-6, draft="d",
                               verify={0: [rec]})
    assert not verdict.ok and "[tree-order] after 1 of 1 verifies" in verdict.text
    assert "holds tree node 1's capture (token 99 at position 4, off the accepted path)" in verdict.text
    unnamed = check_draft_feed(wrong, {"r": SEQ}, refs, expected=[1], num_layers=1, tol=1e-6, draft="d")
    assert not unnamed.ok and "[tree-order]" not in unnamed.text and "position 4" in unnamed.text


def test_shapes_and_their_server_args() -> None:
    assert CHAIN.server_args("cpu") == {"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                        "speculative_num_draft_tokens": 4}
    assert TREE.tree and TREE.server_args("cuda")["chunked_prefill_size"] == 16
    assert OTHER_SCHEDULE.server_args("cpu")[CPU_SPEC_OVERLAP] is True
    assert OTHER_SCHEDULE.server_args("cuda")["disable_overlap_schedule"] is True
    assert get_shape("tree") is TREE
    with pytest.raises(KeyError, match="known: chain, tree, other-schedule"):
        get_shape("bush")


def test_the_overlap_pair() -> None:
    assert schedule_of({"disable_overlap_schedule": True}) == NO_OVERLAP
    assert schedule_of({"disable_overlap_schedule": False}) == OVERLAP
    a = _verify(parents=(-1, 0), tokens=[13, 14], positions=[3, 4], rid="a")
    b = _verify(parents=(-1, 0), tokens=[13, 14], positions=[3, 4], rid="b")
    extra = Record(0, 2, "TARGET_VERIFY", a.aux, torch.tensor([16, 1]), torch.tensor([6, 7]), None, ("b",), (2,))
    common = dict(names=("chain", "other"), outputs=([[1, 2]], [[1, 2]]), accept_lengths=(2.0, 2.0), ends=[7],
                  tol=1e-6, overlap_log=None, tp=1, log="l")
    ok = check_schedules(schedules=(NO_OVERLAP, OVERLAP), verify=(keyed([a], ["a"]), keyed([b, extra], ["b"])),
                         **common)
    assert ok.ok and "1 verify row groups equal; other verified 1 more group(s) at the requests' ends" in ok.text
    same = check_schedules(schedules=(OVERLAP, OVERLAP), verify=(keyed([a], ["a"]), keyed([b], ["b"])), **common)
    assert not same.ok and "compares nothing" in same.text
    moved = Record(0, 1, "TARGET_VERIFY", a.aux * 2, b.input_ids, b.positions, None, ("b",), (2,))
    bad = check_schedules(schedules=(NO_OVERLAP, OVERLAP), verify=(keyed([a], ["a"]), keyed([moved], ["b"])),
                          **common)
    assert not bad.ok and "verify at position 3: aux rel.err" in bad.text


def test_the_overlap_stand_in_gathers_rows_as_the_triton_kernel_does() -> None:
    from pytest_eagle3.worker.cpu.spec_overlap import gather_spec_extras

    p, i, t, h = torch.rand(5, 4), torch.arange(20).view(5, 4), torch.arange(5), torch.rand(5, 3, 2)
    got = gather_spec_extras(torch.tensor([3, 0, 3]), p, i, t, h)
    assert [g.tolist() for g in got] == [p[[3, 0, 3]].tolist(), i[[3, 0, 3]].tolist(), [3, 0, 3],
                                         h[[3, 0, 3]].tolist()]
    assert got[0].data_ptr() != p.data_ptr() and gather_spec_extras(torch.tensor([1]), p, i, t, None)[3] is None


def test_shape_engines_are_slow_on_cpu_and_need_the_tree_mask(tmp_path) -> None:
    from pytest_eagle3.planning.collect import SHAPE_SLOW, collect_reason
    from pytest_eagle3.planning.declare import NeedContext, acceptance_need
    from pytest_eagle3.settings import Settings
    from pytest_eagle3.sglang_source.install import SGLangInstall

    flags = frozenset({"speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens",
                       "chunked-prefill-size", "disable-overlap-schedule"})
    no_mask = SGLangInstall("0.5.12", str(tmp_path), flags, "python")
    assert "hands no tree mask" in TREE.requirement(no_mask, "cpu")
    assert TREE.requirement(no_mask, "cuda") is None and OTHER_SCHEDULE.requirement(no_mask, "cpu") is None
    ctx = NeedContext(Settings(), tp=1, install=None)
    assert collect_reason(acceptance_need(shape=TREE), ctx) == SHAPE_SLOW.format(shape="tree")
    assert acceptance_need(shape=OTHER_SCHEDULE).every_tp is False and acceptance_need(shape=TREE).every_tp


def test_the_plan_says_which_engines_draft_trees() -> None:
    from pytest_eagle3.engine.config import EngineConfig
    from pytest_eagle3.plugin.plan import _drafts_line
    from pytest_eagle3.worker.cpu.spec_overlap import OVERLAP_ENV

    def config(topk, env=()):
        args = {"speculative_draft_model_path": "/d", "speculative_num_steps": 5 if topk > 1 else 3,
                "speculative_eagle_topk": topk, "speculative_num_draft_tokens": 8 if topk > 1 else 4}
        return EngineConfig("/m", 1, "cpu", tuple(sorted(args.items())), tuple(env))

    assert _drafts_line(config(4)) == "  drafts: a token tree, 5 steps, top-k 4, 8 verified per request; no overlap schedule"
    assert _drafts_line(config(1, [(OVERLAP_ENV, "1")])).endswith("a chain, 3 steps, top-k 1, 4 verified per request; "
                                                                 "SGLang's overlap schedule")
    assert _drafts_line(EngineConfig("/m", 1, "cpu", (), ())) is None
