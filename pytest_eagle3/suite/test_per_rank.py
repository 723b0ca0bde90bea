"""Every TP rank captures the same, complete, fully reduced hidden states.

SGLang's public API returns rank 0's captures only.  The per-rank recorder
(``worker/recorder_hook.py``, loaded into each TP worker through SGLang's
``sglang.srt.plugins`` entry point) records what every rank captured in every
forward; these tests compare all of them with the reference:

* the embedding slot is complete on every rank (VocabParallelEmbedding's
  all-reduce reached each rank);
* all ranks hold identical captures (bitwise in fp32 on CPU);
* every rank's slots hold the expected snapshots, and a slot that equals k/tp
  of its snapshot is named as a partial sum on that rank.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.planning import cases
from pytest_eagle3.planning.declare import case_needs
from pytest_eagle3.suite.outcome import fail_if_bad
from pytest_eagle3.suite.support import evidence, tolerance
from pytest_eagle3.verdicts.rankcheck import check_rank_embeddings, check_rank_slots, check_ranks_agree

WIDE = case_needs([cases.WIDE_CASE])
WIDE_EMBEDDING = case_needs([cases.WIDE_CASE], needs_embedding=True)


@pytest.fixture
def rank_captures(eagle3_capture, eagle3_engine_request):
    """``(request, captures, records)`` of the wide case, with the recorder on."""
    req = eagle3_engine_request
    captures, records = eagle3_capture.with_ranks(req.ids, draft=req.draft, extra_args=req.extra_args)
    return req, captures, records


@pytest.mark.gpu
@pytest.mark.tp(2, 4, 8)
@pytest.mark.eagle3_engines(*WIDE_EMBEDDING)
def test_every_rank_embedding_complete(rank_captures, eagle3_reference, eagle3_model_config, eagle3_settings,
                                       pytestconfig):
    req, _, records = rank_captures
    facts = eagle3_model_config
    report = check_rank_embeddings(records, eagle3_reference, slot=req.predicted.index(0),
                                   hidden_size=facts.hidden_size, vocab_size=facts.vocab_size,
                                   tol=tolerance(eagle3_settings))
    fail_if_bad(report, config=pytestconfig)


@pytest.mark.gpu
@pytest.mark.tp(2, 4, 8)
@pytest.mark.eagle3_engines(*WIDE)
def test_ranks_hold_identical_captures(rank_captures, eagle3_model_config, eagle3_settings, pytestconfig):
    _, captures, records = rank_captures
    report = check_ranks_agree(records, hidden_size=eagle3_model_config.hidden_size,
                               exact=eagle3_settings.device == "cpu", tol=tolerance(eagle3_settings))
    fail_if_bad(report, config=pytestconfig)


@pytest.mark.gpu
@pytest.mark.tp(2, 4, 8)
@pytest.mark.eagle3_engines(*WIDE)
@pytest.mark.eagle3_catches("partial-sum", "before-fused-allreduce", need=cases.WIDE_CASE)
def test_every_rank_fully_reduced(rank_captures, eagle3_reference, eagle3_model_config, eagle3_settings,
                                  eagle3_checkpoint, eagle3_capture, eagle3_tp, pytestconfig):
    req, _, records = rank_captures
    facts = eagle3_model_config
    report = check_rank_slots(records, eagle3_reference, expected=list(req.predicted),
                              num_layers=facts.num_layers, hidden_size=facts.hidden_size,
                              tol=tolerance(eagle3_settings),
                              evidence=evidence(eagle3_checkpoint, eagle3_capture.prompts, facts, eagle3_tp,
                                                fused_allreduce=eagle3_capture.fused_allreduce))
    fail_if_bad(report, config=pytestconfig)
