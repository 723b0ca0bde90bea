"""Captures are identical through every parallel/scheduling path SGLang offers here.

Each variant of :mod:`pytest_eagle3.engine.variants` is declared as an engine
need (:func:`pytest_eagle3.planning.declare.variant_needs`): the wide case's id
list (or the variant's own ids) with the variant's server arguments and request
shape.  Every returned row is compared with the reference row at its position:

* prefill: exactly the rows the engine's resolved settings make SGLang return
  (:func:`~pytest_eagle3.engine.variant_proof.prefill_rows` of ``/server_info``: all
  ``T`` normally, the last chunk under chunked prefill, the uncached tail on a
  radix-cache hit), positions ``T-n .. T-1``;
* decode: row ``j`` is position ``T+j`` of the prompt extended by the generated
  tokens, compared with the reference of that extended sequence.

Pairs that must agree are also compared with each other, at the positions both
returned (:func:`~pytest_eagle3.verdicts.paths.check_pair`): a radix-cache hit
with the fresh send of the same prompt, a batched request with the same prompt
sent alone, a variant with the engine of its :attr:`~pytest_eagle3.engine.variants.Variant.pair`
(all-reduce fusion on against off; CUDA graphs on against off; attention DP with
its decode reduce-scatter against the same settings with ``--boundary-reduction ar``,
whose workers must show no ``dp_reduce_scatter``: :func:`~pytest_eagle3.engine.route_proof.route_not_off`).  Chunked prefill and radix-cache hits run on the capture engine
every other capture test uses (on cpu), so the default run takes them.

Every path proves it was taken: each server arg the variant set must be in
effect in SGLang's ``/server_info`` (its resolved server args); a flag SGLang
resolved away, or a row-shaping path that changed no prompt's rows (every
prompt within one chunk or one KV page), skips the variant with that reason
instead of passing it.  A variant on a reduce-scatter route (attention DP's
``dp_reduce_scatter`` in decode, input-scattered attention's
``tp_reduce_scatter`` in prefill) fails unless every TP rank logged it in the
forwards that returned captures (:mod:`pytest_eagle3.engine.route_proof`; the
``eagle3_route_proof`` property holds each rank's line), and every rank's rows
of the prompts, sent again with the per-rank recorder on, are compared with the
reference at their positions, prefill and decode (under attention DP each DP
rank's rows of the requests it served).

Variants this machine or SGLang cannot run are left out at collection with the
precise reason (``--eagle3-list-variants`` prints the matrix); on cpu, variants
with an engine of their own run with ``--eagle3-slow``.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.planning.declare import MAIN, variant_needs
from pytest_eagle3.engine.route_proof import proof_lines, route_not_off, route_not_proven, route_note
from pytest_eagle3.engine.variant_proof import path_not_exercised, path_not_taken, prefill_rows
from pytest_eagle3.engine.variants import PAIR_MEMBER, VARIANTS
from pytest_eagle3.suite.outcome import conclude, conclude_each
from pytest_eagle3.suite.support import attention_tp, evidence, request_mode, tbo_split, tolerance, where
from pytest_eagle3.verdicts.compare import compare_slots
from pytest_eagle3.verdicts.observation import CHUNKS_JOINED
from pytest_eagle3.verdicts.rankcheck import rank_rows_by_position
from pytest_eagle3.verdicts.paths import check_pair, check_rows, compare_captures, row_settings
from pytest_eagle3.target.reference import ensure_reference


@pytest.mark.gpu
@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.eagle3_engines(*variant_needs(VARIANTS))
# Rows of one decode forward of several requests: the batched path variant.
@pytest.mark.eagle3_catches("wrong-request-rows", need="batch")
# Rows of a prompt's cached-prefix extend and of its later prefill chunks.
@pytest.mark.eagle3_catches("no-residual-on-cache-hit", need="radix-cache-hit")
@pytest.mark.eagle3_catches("no-residual-on-later-chunk", need="chunked-prefill")
@pytest.mark.eagle3_catches("stale-no-residual", need="decode")
# Rows of the two micro-batches of two-batch overlap, merged by the tbo-capture-per-microbatch fix.
@pytest.mark.eagle3_catches("tbo-microbatch-dropped", "tbo-microbatches-swapped", need="two-batch-overlap", tp=2)
# A capture read before attention DP's decode reduce-scatter completes.
@pytest.mark.eagle3_catches("partial-before-dp-reduce-scatter", "other-rank-slice-after-dp-reduce-scatter",
                            need="dp-attention", tp=2)
def test_captures_identical_through_path(eagle3_need, eagle3_engine_set, eagle3_capture, eagle3_reference,
                                         eagle3_checkpoint, eagle3_model_config, eagle3_settings, eagle3_tp,
                                         record_property, pytestconfig):
    req = eagle3_engine_set[MAIN]
    name = eagle3_need.variant.name
    L, H = eagle3_model_config.num_layers, eagle3_model_config.hidden_size
    record_property("eagle3_variant_args", req.extra_args)
    sends = eagle3_capture.sends(req)
    captures = sends[-1]
    info = eagle3_capture.server_info(req)
    off = path_not_taken(name, req.extra_args, info, eagle3_need.variant.engaged) or path_not_exercised(
        name, req.extra_args, req.repeat, [len(c.prompt) for c in captures], info)
    if off:
        pytest.skip(off)
    route = eagle3_need.variant.reduce_scatter
    if route is not None and eagle3_tp > 1:
        # The reduce-scatter route the variant proves, from every TP rank's log lines.
        text, log = eagle3_capture.log_text(req)
        record_property("eagle3_route_proof", proof_lines(text, *route, eagle3_tp))
        why = route_not_proven(text, variant=name, mode=route[0], function=route[1], tp=eagle3_tp,
                               every_forward=eagle3_settings.device == "cpu", log=log)
        if why:
            pytest.fail(why, pytrace=False)
    settings = row_settings(info)
    tol = tolerance(eagle3_settings)
    # A batch under chunked prefill shares each chunk's token budget among its
    # requests: which rows come back depends on the packing, any tail of the prompt.
    any_tail = req.batch and bool(info.get("chunked_prefill_size") or 0) > 0
    extended = extended_candidates = None
    attn_tp = attention_tp(eagle3_tp, req.extra_args)
    split = tbo_split(info, eagle3_model_config)
    candidates = evidence(eagle3_checkpoint, eagle3_capture.prompts, eagle3_model_config, eagle3_tp, attn_tp=attn_tp,
                          fused_allreduce=eagle3_capture.fused_allreduce, pp_stages=eagle3_capture.pp_stages,
                          tbo_split=split)
    if req.decode_steps:
        seqs = [list(c.prompt) + list(c.output_ids[:-1]) for c in captures]
        extended = ensure_reference(eagle3_checkpoint, seqs)
        extended_candidates = evidence(eagle3_checkpoint, seqs, eagle3_model_config, eagle3_tp, attn_tp=attn_tp,
                                       fused_allreduce=eagle3_capture.fused_allreduce, pp_stages=eagle3_capture.pp_stages,
                                       tbo_split=split)
    # Every request is judged before the test stops on the first wrong one: the
    # run-level diagnosis weighs which requests, modes and paths were right.
    checks = []
    for i, (cap, ref) in enumerate(zip(captures, eagle3_reference)):
        T, n, d = len(cap.prompt), cap.prefill.shape[0], cap.decode.shape[0]
        mode = request_mode(cap, repeat=len(sends) > 1)
        checks.append((check_rows(variant=name, i=i, tokens=T, prefill=n, decode=d, settings=settings,
                                  want_prefill=None if any_tail else prefill_rows(T, info, repeat=req.repeat),
                                  want_decode=req.decode_steps),
                       where(req, cap, path=name, mode=mode, check="rows")))
        report = compare_slots(cap.prefill, ref[:, T - n:T], expected=list(req.expected), num_layers=L,
                               hidden_size=H, tol=tol, first_row=T - n,
                               side_names=(f"SGLang ({name}, prefill rows {T - n}..{T - 1})", "reference"),
                               evidence=lambda i=i, T=T, n=n: _prefill_evidence(
                                   candidates, eagle3_reference, captures, i, T, n, split))
        checks.append((report, where(req, cap, path=name, mode=mode)))
        if d:
            assert extended is not None
            report = compare_slots(cap.decode, extended[i][:, T:T + d], expected=list(req.expected), num_layers=L,
                                   hidden_size=H, tol=tol, first_row=T,
                                   segments=[(f"decode step {j + 1}", j, j + 1) for j in range(d)],
                                   side_names=(f"SGLang ({name}, decode rows {T}..{T + d - 1})", "reference"),
                                   evidence=lambda i=i, T=T, d=d: _decode_evidence(
                                       extended_candidates, extended, captures, i, T, d))
            checks.append((report, where(req, cap, path=name, mode="decode")))
    if len(sends) > 1:
        # The fresh send of a repeated prompt, against the reference too: the
        # mode it took (a plain or chunked prefill) is the radix-cache hit's
        # contrast (judged after the hit, whose diagnosis speaks first).
        for cap, ref in zip(sends[0], eagle3_reference):
            T, n = len(cap.prompt), cap.prefill.shape[0]
            checks.append((compare_slots(cap.prefill, ref[:, T - n:T], expected=list(req.expected), num_layers=L,
                                         hidden_size=H, tol=tol, diagnose=False, first_row=T - n,
                                         side_names=(f"SGLang ({name}, fresh send, prefill rows {T - n}..{T - 1})",
                                                     "reference")),
                           where(req, cap, path=name)))
    if route is not None and eagle3_tp > 1:
        # The route's captures on every TP rank (the per-rank recorder; under attention DP
        # each DP rank holds the requests it served), row by row at their positions.
        recorded, by_rank = eagle3_capture.recorded(req)
        recorded_seqs = [list(c.prompt) + list(c.output_ids[:-1]) for c in recorded]
        refs = ensure_reference(eagle3_checkpoint, recorded_seqs)
        for report, rank, i, mode in rank_rows_by_position(
                by_rank, [c.rid for c in recorded], refs, expected=list(req.expected), num_layers=L, hidden_size=H,
                tol=tol, every_rank=attn_tp == eagle3_tp,
                evidence=evidence(eagle3_checkpoint, recorded_seqs, eagle3_model_config, eagle3_tp, attn_tp=attn_tp,
                                  fused_allreduce=eagle3_capture.fused_allreduce,
                                  pp_stages=eagle3_capture.pp_stages, tbo_split=split)):
            checks.append((report, where(req, recorded[i], path=name, mode=mode, check="ranks",
                                         chunk=CHUNKS_JOINED if mode == "prefill" else 0,
                                         **({"rank": rank} if rank >= 0 else {}))))
    try:
        conclude_each(checks, pytestconfig)
    except pytest.fail.Exception as exc:
        # A partial sum or another rank's rows on a reduce-scatter route: the route, from the workers' lines.
        note = route_note(eagle3_capture.log_text(req)[0], *route, eagle3_tp, str(exc.msg)) if route else ""
        if note:
            raise pytest.fail.Exception(f"{exc.msg}\n{note}", pytrace=False) from None
        raise
    if req.batch:
        # The pair that must agree: each request of the batch against the same
        # prompt sent alone to the same engine (same ids, decode steps), after the
        # reference comparison whose diagnosis names what the batch got wrong.
        alone = eagle3_capture(req.ids, decode_steps=req.decode_steps, extra_args=req.extra_args, draft=req.draft)
        conclude(check_pair((compare_captures(b, a) for b, a in zip(captures, alone)), what=name,
                            a_name="the batched request", b_name="the prompt sent alone", rel_tol=tol),
                 config=pytestconfig, where=where(req, captures[-1], path=name, check="pair"))
    if PAIR_MEMBER in eagle3_engine_set:
        # The on/off contrast (Variant.pair, e.g. all-reduce fusion on and off):
        # the same prompts on the pair's engine, row for row.
        other = eagle3_engine_set[PAIR_MEMBER]
        pair_name = eagle3_need.engine_set()[PAIR_MEMBER].name
        paired = eagle3_capture.run(other)
        if route is not None and eagle3_tp > 1:
            # The pair is the route's contrast only if it ran without the route where it was due.
            text, log = eagle3_capture.log_text(other)
            record_property("eagle3_pair_route_proof", proof_lines(text, *route, eagle3_tp))
            why = route_not_off(text, variant=pair_name, mode=route[0], function=route[1], tp=eagle3_tp, log=log)
            if why:
                pytest.fail(why, pytrace=False)
        conclude(check_pair((compare_captures(a, b) for a, b in zip(captures, paired)), what=name,
                            a_name=f"the {name} engine", b_name=f"the {pair_name} engine", rel_tol=tol),
                 config=pytestconfig, where=where(req, captures[-1], path=name, check="pair"))
    if len(sends) > 1:
        # The pair that must agree: each repeat (a radix-cache hit) against the
        # fresh send of the same prompt, at the positions both returned (after
        # the reference comparison, whose diagnosis names what a hit got wrong).
        for later in sends[1:]:
            conclude(check_pair((compare_captures(hit, fresh) for hit, fresh in zip(later, sends[0])),
                                what=name, a_name="the repeat (radix-cache hit)", b_name="the fresh send",
                                rel_tol=tol),
                     config=pytestconfig, where=where(req, later[-1], path=name, mode="cache-hit", check="pair"))


def _prefill_evidence(candidates, reference, captures, i, T, n, split):
    """Candidates for request ``i``'s prefill rows (``T - n .. T - 1``); on a two-batch
    overlap engine (``split``, :func:`~pytest_eagle3.suite.support.tbo_split`) with every
    other request's prefill rows too: a micro-batch's rows at another's place are named."""
    from dataclasses import replace

    ev = candidates[i]().rows(T - n, T)
    if split is None:
        return ev
    others = {f"request {j}": reference[j][:, len(c.prompt) - int(c.prefill.shape[0]):len(c.prompt)]
              for j, c in enumerate(captures) if j != i}
    return replace(ev, others=others)


def _decode_evidence(candidates, extended, captures, i, T, d):
    """Candidates for request ``i``'s decode rows (positions ``T .. T+d-1`` of its
    extended sequence), with every other request's decode rows: a batch whose
    rows went to the wrong request is named."""
    from dataclasses import replace

    others = {}
    for j, cap in enumerate(captures):
        Tj = len(cap.prompt)
        if j != i and extended[j].shape[1] >= Tj + 1:
            others[f"request {j}"] = extended[j][:, Tj:Tj + d]
    return replace(candidates[i]().rows(T, T + d), others=others)
