"""EAGLE-3 as production serves it: token trees, the other overlap schedule, and
what the draft is fed after every prefill chunk and every verify.

The speculative shapes are :mod:`pytest_eagle3.engine.spec_shapes`: the
acceptance engines' chain (3 steps, top-k 1), a token tree (SGLang's Llama
default: 5 steps, top-k 4, 8 verified nodes, prefills chunked at 16 tokens) and
the chain under the other overlap schedule.  The tree and the other schedule
need engines of their own (``--eagle3-slow`` on cpu); the draft's inputs are
checked on the main job's chain engines too.

* ``test_tree_verify_nodes_hold_their_root_paths``: the target verifies every
  node of a token tree at once under a tree mask, so node ``i``'s aux hidden
  states are those of the committed prefix plus node ``i``'s own root path, on
  every TP rank; the output equals greedy decoding; SGLang's returned decode
  captures hold the accepted path.
* ``test_draft_reads_the_accepted_path``: every row the draft read, on every
  TP rank, after each prefill chunk and each verify, pairs the aux hidden states
  at ``p`` with the token at ``p + 1``: the accepted path in order after a tree
  verify (``[tree-order]`` otherwise), the next prompt token at a chunk seam
  (``[chunk-seam]`` otherwise).
* ``test_other_schedule_changes_nothing``: the acceptance engine and the same
  chain under the other overlap schedule return the same tokens, the same
  accept length and the same verify captures row for row; each engine's
  schedule is read from its ``/server_info``, and on cpu the overlap path must
  have run on every TP rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_eagle3.capture.spec_metrics import aggregate
from pytest_eagle3.engine.draft_inputs import fed_rows
from pytest_eagle3.engine.spec_shapes import OTHER_SCHEDULE, TREE
from pytest_eagle3.engine.variants import PAIR_MEMBER
from pytest_eagle3.engine.verify_tree import tree_summary, verify_node_records
from pytest_eagle3.planning.declare import MAIN, acceptance_need
from pytest_eagle3.suite.outcome import conclude, conclude_each, fail_if_bad
from pytest_eagle3.suite.support import acceptance_workload, row_references, tolerance, where
from pytest_eagle3.target.reference import ensure_reference
from pytest_eagle3.verdicts.acceptance import check_output
from pytest_eagle3.verdicts.compare import compare_slots
from pytest_eagle3.verdicts.draft_feed import check_draft_feed, feed_summary
from pytest_eagle3.verdicts.observation import SERVED
from pytest_eagle3.verdicts.rankcheck import check_rank_slots, check_ranks_agree, check_verify_recorded
from pytest_eagle3.verdicts.schedules import check_schedules, keyed, schedule_of

TREE_NEED = acceptance_need(shape=TREE)
OTHER_SCHEDULE_NEED = acceptance_need(shape=OTHER_SCHEDULE)
NO_TREE = ("the {name} engine verified no node off the accepted path in {n} verify forwards: it did not draft "
           "a token tree (speculative_eagle_topk {topk}), so nothing tree-specific was checked")


def _recorded(req, capture, prompts):
    """The acceptance workload of ``req``'s engine, recorded: names, the run, rid -> final tokens,
    rid -> prompt, and the expected continuations (None for a draft without them)."""
    names, prompts, lengths, expected = acceptance_workload(Path(req.draft), prompts)
    run = capture.speculate_recorded(req, prompts, lengths)
    rids = [str(r.captures.rid) for r in run.runs]  # SGLang's request ids, as the recorders saw them
    sequences = {rid: list(p) + list(r.output_ids) for rid, p, r in zip(rids, prompts, run.runs)}
    return names, run, sequences, dict(zip(rids, prompts)), expected


@pytest.mark.gpu
@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.eagle3_engines(TREE_NEED)
def test_tree_verify_nodes_hold_their_root_paths(eagle3_engine_request, eagle3_capture, eagle3_checkpoint,
                                                 eagle3_settings, eagle3_model_config, eagle3_prompts,
                                                 record_property, pytestconfig):
    req, facts, tol = eagle3_engine_request, eagle3_model_config, tolerance(eagle3_settings)
    names, run, sequences, _, expected = _recorded(req, eagle3_capture, eagle3_prompts)
    if expected is not None:
        conclude(check_output(names, [r.output_ids for r in run.runs], expected))
    fail_if_bad(check_ranks_agree(run.records, hidden_size=facts.hidden_size, exact=eagle3_settings.device == "cpu",
                                  tol=tol), config=pytestconfig)
    verify = verify_node_records(run.records, sequences)
    conclude(check_verify_recorded(len(verify[0]), draft=Path(req.draft).name))
    record_property("eagle3_tree", tree_summary(verify[0], sequences))
    if not any(rec.reference for rec in verify[0]):
        pytest.fail(NO_TREE.format(name=TREE_NEED.name, n=len(verify[0]),
                                   topk=req.extra_args.get("speculative_eagle_topk")), pytrace=False)
    references = row_references(eagle3_checkpoint, verify[0], sequences)
    fail_if_bad(check_rank_slots(verify, references, expected=list(req.predicted), num_layers=facts.num_layers,
                                 hidden_size=facts.hidden_size, tol=tol), config=pytestconfig,
                where=where(req, run.runs[0].captures, path="speculative", mode="verify", check="ranks"))
    # What SGLang returns (meta_info hidden_states): the accepted path, one row per generated token.
    stacks = ensure_reference(eagle3_checkpoint, list(sequences.values()))
    checks = []
    for r, stack, seq in zip(run.runs, stacks, sequences.values()):
        prompt_len = len(seq) - len(r.output_ids)
        rows = r.captures.decode
        if r.decode_note or rows.shape[0] == 0:
            continue
        ref = stack[:, prompt_len: prompt_len + rows.shape[0]]
        checks.append((compare_slots(rows, ref, expected=list(req.predicted), num_layers=facts.num_layers,
                                     hidden_size=facts.hidden_size, tol=tol, first_row=prompt_len),
                       where(req, r.captures, path="speculative", mode="decode")))
    conclude_each(checks, pytestconfig)


@pytest.mark.gpu
@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.eagle3_engines(acceptance_need(), TREE_NEED)
@pytest.mark.eagle3_catches("tree-order-aux", need="acceptance-tree", tp=1)
@pytest.mark.eagle3_catches("chunk-seam-prediction", need="acceptance-tree", tp=1)
def test_draft_reads_the_accepted_path(eagle3_engine_request, eagle3_capture, eagle3_checkpoint, eagle3_settings,
                                       eagle3_model_config, eagle3_prompts, record_property, pytestconfig):
    req, facts = eagle3_engine_request, eagle3_model_config
    _, run, sequences, prompts, _ = _recorded(req, eagle3_capture, eagle3_prompts)
    feeds = fed_rows(run.draft, prompts, sequences)
    references = dict(zip(sequences, ensure_reference(eagle3_checkpoint, list(sequences.values()))))
    record_property("eagle3_draft_feed", feed_summary(feeds))
    conclude(check_draft_feed(feeds, sequences, references, expected=list(req.predicted),
                              num_layers=facts.num_layers, tol=tolerance(eagle3_settings),
                              draft=Path(req.draft).name, verify=run.records), pytestconfig,
             # What the draft is fed: the serving side's consumer of right captures (level "served-draft").
             where(req, run.runs[0].captures if run.runs else None, path="speculative", mode="verify",
                   check="draft-feed", level=SERVED))


@pytest.mark.gpu
@pytest.mark.tp(1)
@pytest.mark.eagle3_engines(OTHER_SCHEDULE_NEED)
def test_other_schedule_changes_nothing(eagle3_engine_set, eagle3_capture, eagle3_settings, eagle3_model_config,
                                        eagle3_prompts, record_property):
    this, chain = eagle3_engine_set[MAIN], eagle3_engine_set[PAIR_MEMBER]
    runs = {}
    for label, req in (("chain", chain), (OTHER_SCHEDULE.name, this)):
        _, run, sequences, _, _ = _recorded(req, eagle3_capture, eagle3_prompts)
        runs[label] = (run, sequences, schedule_of(eagle3_capture.server_info(req)),
                       eagle3_capture.log_text(req))
    (a, seq_a, sched_a, _), (b, seq_b, sched_b, (log_b, path_b)) = runs["chain"], runs[OTHER_SCHEDULE.name]
    verdict = conclude(check_schedules(
        names=("chain", OTHER_SCHEDULE.name), schedules=(sched_a, sched_b),
        outputs=([r.output_ids for r in a.runs], [r.output_ids for r in b.runs]),
        accept_lengths=(aggregate([r.metrics for r in a.runs]).accept_length,
                        aggregate([r.metrics for r in b.runs]).accept_length),
        verify=(keyed(verify_node_records(a.records, seq_a)[0], list(seq_a)),
                keyed(verify_node_records(b.records, seq_b)[0], list(seq_b))),
        ends=[len(s) for s in seq_a.values()], tol=tolerance(eagle3_settings),
        overlap_log=log_b if eagle3_settings.device == "cpu" else None, tp=1, log=path_b))
    record_property("eagle3_schedules", verdict.text)
