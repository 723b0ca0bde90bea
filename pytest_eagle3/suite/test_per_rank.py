"""Every TP rank captures the same, complete, fully reduced hidden states.

SGLang's public API returns rank 0's captures only.  The per-rank recorder
(``engine/recorder_hook.py``, loaded into each TP worker through SGLang's
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

from pytest_eagle3.compare import fail_if_bad
from pytest_eagle3.conventions import predict
from pytest_eagle3.rankcheck import check_rank_embeddings, check_rank_slots, check_ranks_agree
from pytest_eagle3.suite import cases
from pytest_eagle3.suite.support import tolerance


@pytest.fixture
def rank_captures(eagle3_capture, eagle3_model_config, eagle3_sglang, eagle3_case):
    """``(prediction, captures, records)`` of the wide case, with the recorder on."""
    facts = eagle3_model_config
    case = cases.resolve(eagle3_case, facts.num_layers, facts.hidden_size, eagle3_sglang.version)
    ids = list(case.ids)
    prediction = predict(ids, facts.num_layers, eagle3_sglang.version)
    captures, records = eagle3_capture.with_ranks(ids)
    return prediction, captures, records


@pytest.mark.tp(2, 4, 8)
@pytest.mark.parametrize("eagle3_case", [cases.WIDE_CASE])
def test_every_rank_embedding_complete(rank_captures, eagle3_reference, eagle3_model_config, eagle3_settings):
    prediction, _, records = rank_captures
    if 0 not in prediction.snapshots:
        pytest.skip("this SGLang's id rule captures no embedding slot")
    facts = eagle3_model_config
    report = check_rank_embeddings(records, eagle3_reference, slot=prediction.snapshots.index(0),
                                   hidden_size=facts.hidden_size, vocab_size=facts.vocab_size,
                                   tol=tolerance(eagle3_settings))
    fail_if_bad(report)


@pytest.mark.tp(2, 4, 8)
@pytest.mark.parametrize("eagle3_case", [cases.WIDE_CASE])
def test_ranks_hold_identical_captures(rank_captures, eagle3_model_config, eagle3_settings):
    _, captures, records = rank_captures
    report = check_ranks_agree(records, hidden_size=eagle3_model_config.hidden_size,
                               exact=eagle3_settings.device == "cpu", tol=tolerance(eagle3_settings))
    fail_if_bad(report)


@pytest.mark.tp(2, 4, 8)
@pytest.mark.parametrize("eagle3_case", [cases.WIDE_CASE])
def test_every_rank_fully_reduced(rank_captures, eagle3_reference, eagle3_model_config, eagle3_settings):
    prediction, _, records = rank_captures
    facts = eagle3_model_config
    report = check_rank_slots(records, eagle3_reference, expected=list(prediction.snapshots),
                              num_layers=facts.num_layers, hidden_size=facts.hidden_size,
                              tol=tolerance(eagle3_settings))
    fail_if_bad(report)
