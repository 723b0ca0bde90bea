"""Every TP rank captures the same, complete, fully reduced hidden states, in
every forward mode: prefill (every chunk: the capture engine prefills the
longer prompts in chunks on cpu) and decode.

SGLang's public API returns rank 0's captures only.  The per-rank recorder
(``worker/recorder_hook.py``, loaded into each TP worker through SGLang's
``sglang.srt.plugins`` entry point) records what every rank captured in every
forward; these tests compare all of them with the reference:

* the embedding slot is complete on every rank (VocabParallelEmbedding's
  all-reduce reached each rank), for prompt and decode tokens;
* all ranks hold identical captures, forward by forward (bitwise in fp32 on CPU);
* every rank's slots hold the expected snapshots in prefill and decode rows,
  and a slot that equals k/tp of its snapshot is named as a partial sum on that rank.

The embedding and reduction checks also run on attention DP's engine (the
``dp-attention`` path variant, ``--eagle3-slow`` on cpu), where each rank holds
the rows of the requests its DP rank served (:attr:`RankCaptures.served
<pytest_eagle3.capture.recorded.RankCaptures.served>`); the ranks' agreement needs
every rank to hold every request, so it runs without attention DP only.

Verify forwards (speculative decoding) are checked on every rank by
``test_acceptance.py::test_every_rank_agrees_in_verify``.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.planning import cases
from pytest_eagle3.engine.variants import get_variant
from pytest_eagle3.planning.declare import case_needs, variant_needs
from pytest_eagle3.suite.outcome import fail_if_bad
from pytest_eagle3.suite.support import attention_tp, evidence, request_mode, tolerance, where
from pytest_eagle3.target.reference import ensure_reference
from pytest_eagle3.verdicts.rankcheck import check_rank_embeddings, check_rank_slots, check_ranks_agree
from pytest_eagle3.verdicts.run_cause import forward_mode

WIDE = case_needs([cases.WIDE_CASE])
WIDE_EMBEDDING = case_needs([cases.WIDE_CASE], needs_embedding=True)
#: The dp-attention path variant's engine (test_paths.py's): each rank's rows of the
#: requests its DP rank served (``--eagle3-slow`` on cpu).
DP_ATTENTION = variant_needs([get_variant("dp-attention")])
#: Decode forwards per prompt the per-rank tests record.
DECODE_STEPS = 3


@pytest.fixture
def rank_captures(eagle3_capture, eagle3_engine_request):
    """``(request, RankCaptures)`` of the wide case with the recorder on: prefill
    and :data:`DECODE_STEPS` decode forwards per prompt."""
    req = eagle3_engine_request
    got = eagle3_capture.ranks(req.ids, draft=req.draft, extra_args=req.extra_args, decode_steps=DECODE_STEPS)
    return req, got


def rank_where(req, got, *, decode: bool = False):
    """The context of a per-rank verdict: each request's forward mode (its
    prefill rows span every chunk; ``later-chunk`` where the prompt was chunked)."""
    modes = ["decode"] * len(got.captures) if decode else [request_mode(c) for c in got.captures]
    return where(req, got.captures[0], path="plain", check="ranks", modes=modes)


def decode_references(checkpoint, got):
    """Per prompt, the reference ``[L+2, d, H]`` at the decode positions ``T .. T+d-1``
    of the prompt extended by its generated tokens."""
    seqs = [list(c.prompt) + list(c.output_ids[:-1]) for c in got.captures]
    refs = ensure_reference(checkpoint, seqs)
    return [ref[:, len(c.prompt):len(c.prompt) + DECODE_STEPS] for ref, c in zip(refs, got.captures)]


@pytest.mark.gpu
@pytest.mark.tp(2, 4, 8)
@pytest.mark.eagle3_engines(*WIDE_EMBEDDING, *DP_ATTENTION)
def test_every_rank_embedding_complete(rank_captures, eagle3_reference, eagle3_model_config, eagle3_settings,
                                       eagle3_checkpoint, pytestconfig):
    req, got = rank_captures
    facts = eagle3_model_config
    kwargs = dict(slot=req.predicted.index(0), hidden_size=facts.hidden_size, vocab_size=facts.vocab_size,
                  tol=tolerance(eagle3_settings), served=got.served)
    fail_if_bad(check_rank_embeddings(got.prefill, eagle3_reference, **kwargs), config=pytestconfig,
                where=rank_where(req, got))
    fail_if_bad(check_rank_embeddings(got.decode, decode_references(eagle3_checkpoint, got), **kwargs),
                config=pytestconfig, where=rank_where(req, got, decode=True))


@pytest.mark.gpu
@pytest.mark.tp(2, 4, 8)
@pytest.mark.eagle3_engines(*WIDE)
def test_ranks_hold_identical_captures(rank_captures, eagle3_model_config, eagle3_settings, pytestconfig):
    req, got = rank_captures
    report = check_ranks_agree(got.forwards, hidden_size=eagle3_model_config.hidden_size,
                               exact=eagle3_settings.device == "cpu", tol=tolerance(eagle3_settings))
    # Agreement is a pair (equally wrong ranks agree): only a disagreement is evidence.
    modes = [forward_mode(r.mode, int(r.positions[0]) if r.positions is not None and len(r.positions) else None)
             for r in got.forwards[0]]
    fail_if_bad(report, config=pytestconfig, where=where(req, got.captures[0], path="plain", check="agree",
                                                          modes=modes))


@pytest.mark.gpu
@pytest.mark.tp(2, 4, 8)
@pytest.mark.eagle3_engines(*WIDE, *DP_ATTENTION)
@pytest.mark.eagle3_catches("partial-sum", "before-fused-allreduce", "partial-sum-on-rank-decode",
                            need=cases.WIDE_CASE)
# A rank's partial sum on attention DP's reduce-scatter route, in its decode rows.
@pytest.mark.eagle3_catches("partial-before-dp-reduce-scatter", need="dp-attention", tp=2)
def test_every_rank_fully_reduced(rank_captures, eagle3_reference, eagle3_model_config, eagle3_settings,
                                  eagle3_checkpoint, eagle3_capture, eagle3_tp, pytestconfig):
    req, got = rank_captures
    facts = eagle3_model_config
    kwargs = dict(expected=list(req.predicted), num_layers=facts.num_layers, hidden_size=facts.hidden_size,
                  tol=tolerance(eagle3_settings), served=got.served)
    more = dict(attn_tp=attention_tp(eagle3_tp, req.extra_args), fused_allreduce=eagle3_capture.fused_allreduce,
                pp_stages=eagle3_capture.pp_stages)
    report = check_rank_slots(got.prefill, eagle3_reference, **kwargs,
                              evidence=evidence(eagle3_checkpoint, eagle3_capture.prompts, facts, eagle3_tp, **more))
    fail_if_bad(report, config=pytestconfig, where=rank_where(req, got))
    # Decode rows: candidates of the extended sequences at the decode positions.
    seqs = [list(c.prompt) + list(c.output_ids[:-1]) for c in got.captures]
    candidates = evidence(eagle3_checkpoint, seqs, facts, eagle3_tp, **more)
    decode_evidence = [lambda ev=ev, T=len(c.prompt): ev().rows(T, T + DECODE_STEPS)
                       for ev, c in zip(candidates, got.captures)]
    fail_if_bad(check_rank_slots(got.decode, decode_references(eagle3_checkpoint, got), **kwargs,
                                 evidence=decode_evidence), config=pytestconfig,
                where=rank_where(req, got, decode=True))
