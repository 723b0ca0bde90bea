"""Captures are identical through every parallel/scheduling path SGLang offers here.

Each variant of :mod:`pytest_eagle3.variants` runs the wide case's id list (or
the variant's own ids) with the variant's server arguments and request shape,
and every returned row is compared with the reference row at its position:

* prefill: ``n`` returned rows are positions ``T-n .. T-1`` (all ``T`` normally;
  the last chunk under chunked prefill; the uncached tail on a radix-cache hit);
* decode: row ``j`` is position ``T+j`` of the prompt extended by the generated
  tokens, compared with the reference of that extended sequence.

Variants that need hardware or flags this run lacks skip with the precise
reason; ``--eagle3-list-variants`` prints the matrix.  Variants that need an
engine of their own are marked ``slow`` (``--eagle3-slow`` runs them).
"""

from __future__ import annotations

import pytest

from pytest_eagle3.compare import compare_slots, fail_if_bad
from pytest_eagle3.conventions import predict
from pytest_eagle3.suite import cases
from pytest_eagle3.suite.support import tolerance
from pytest_eagle3.variants import VARIANTS, detect_gpu_arch

TP1_ON_CPU = "{variant}: on cpu its own engine runs at TP 1 only (engine starts dominate the run)"
ROWS_MISSING = "{variant}: prompt {i} ({T} tokens) returned {n} prefill rows and {d} decode rows; expected {want}"


def engine_for(variant, install, device, tp, num_layers, hidden_size, first_k_dense):
    """``(ids, server args)`` of the variant's engine, or why it does not run here."""
    arch = detect_gpu_arch() if device == "cuda" else None
    reason = variant.requirements(install, device, tp, arch)
    if reason:
        return reason
    own_engine = bool(variant.server_args) or variant.ids is not None
    if tp > 1 and own_engine and variant.needs.min_tp <= 1 and device == "cpu":
        return TP1_ON_CPU.format(variant=variant.name)
    if variant.ids is not None:
        ids = list(variant.ids(num_layers, first_k_dense))
    else:
        ids = list(cases.resolve(cases.WIDE_CASE, num_layers, hidden_size, install.version).ids)
    return ids, variant.args_for(install, tp)


def _param(variant):
    """Variants with server args or ids of their own need their own engine: ``slow``.
    ``eagle3_case`` names the engine group, so tests sharing an engine run together."""
    own_engine = bool(variant.server_args) or variant.ids is not None
    group = f"variant-{variant.name}" if own_engine else cases.WIDE_CASE
    return pytest.param(variant, group, id=variant.name, marks=[pytest.mark.slow] if own_engine else [])


@pytest.mark.tp(1, 2, 4, 8)
@pytest.mark.parametrize("variant, eagle3_case", [_param(v) for v in VARIANTS])
def test_captures_identical_through_path(variant, eagle3_case, eagle3_tp, eagle3_capture, eagle3_reference, eagle3_checkpoint,
                                         eagle3_model_config, eagle3_sglang, eagle3_settings, record_property):
    f = eagle3_model_config
    L, H = f.num_layers, f.hidden_size
    plan = engine_for(variant, eagle3_sglang, eagle3_settings.device, eagle3_tp, L, H, f.first_k_dense_replace)
    if isinstance(plan, str):
        pytest.skip(plan)
    ids, extra = plan
    expected = list(predict(ids, L, eagle3_sglang.version).snapshots)
    request = dict(variant.request)
    decode_steps = int(request.get("decode_steps", 0))
    record_property("eagle3_variant_args", extra)

    runs = [eagle3_capture(ids, decode_steps=decode_steps, extra_args=extra,
                           batch=bool(request.get("batch")))
            for _ in range(int(request.get("repeat", 1)))]
    captures = runs[-1]
    tol = tolerance(eagle3_settings)
    extended = None
    if decode_steps:
        from pytest_eagle3.reference import ensure_reference

        seqs = [list(c.prompt) + list(c.output_ids[:-1]) for c in captures]
        extended = ensure_reference(eagle3_checkpoint, seqs)
    for i, (cap, ref) in enumerate(zip(captures, eagle3_reference)):
        T, n, d = len(cap.prompt), cap.prefill.shape[0], cap.decode.shape[0]
        if not 1 <= n <= T or d != decode_steps:
            pytest.fail(ROWS_MISSING.format(variant=variant.name, i=i, T=T, n=n, d=d,
                                            want=f"1..{T} prefill rows and {decode_steps} decode rows"),
                        pytrace=False)
        report = compare_slots(cap.prefill, ref[:, T - n:T], expected=expected, num_layers=L, hidden_size=H,
                               tol=tol, side_names=(f"SGLang ({variant.name}, prefill rows {T - n}..{T - 1})",
                                                    "reference"))
        fail_if_bad(report, config=eagle3_capture.request.config)
        if d:
            assert extended is not None
            report = compare_slots(cap.decode, extended[i][:, T:T + d], expected=expected, num_layers=L,
                                   hidden_size=H, tol=tol,
                                   side_names=(f"SGLang ({variant.name}, decode rows {T}..{T + d - 1})",
                                               "reference"))
            fail_if_bad(report, config=eagle3_capture.request.config)


def eagle3_plan_engine(item, context):
    """``--eagle3-plan``: the engine a path test would start (see :mod:`pytest_eagle3.plan`)."""
    from pytest_eagle3.plan import EngineRequest

    plan = engine_for(item.callspec.params["variant"], context.install, context.settings.device, context.tp,
                      context.num_layers, context.hidden_size, context.first_k_dense_replace)
    return plan if isinstance(plan, str) else EngineRequest(*plan)
