"""compare.py on synthetic tensors: right slots pass, each known fault gets its diagnosis."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from pytest_eagle3.suite.outcome import fail_if_bad  # noqa: E402
from pytest_eagle3.verdicts.compare import (  # noqa: E402
    HOLDS,
    NO_MATCH,
    SLOT_PRESENT,
    SLOT_WRONG,
    SLOTS_BAD,
    SLOTS_OK,
    compare_slots,
)
from pytest_eagle3.verdicts.embedding import (  # noqa: E402
    EMB_ALLREDUCE,
    EMB_BAD,
    EMB_OFF_ROW,
    EMB_ZERO_ROW,
    check_embedding_complete,
)
from pytest_eagle3.verdicts.shards import vocab_shard, vocab_shard_ranges  # noqa: E402
from pytest_eagle3.verdicts.snapshots import fmt_err  # noqa: E402

L, H, T = 6, 64, 5
EXPECTED = (0, 3, 5)  # e.g. [embedding, layer-3 input, layer-5 input]


def make_reference(num_layers: int = L, hidden: int = H, tokens: int = T, seed: int = 0) -> torch.Tensor:
    """A residual stream like the DESIGN init: each layer adds a delta of RMS
    sqrt(0.6) of the stream it reads; hs[L] is RMS-normed with lognormal weights."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    stream = [x]
    for _ in range(num_layers):
        delta = torch.randn(tokens, hidden, generator=g)
        delta *= math.sqrt(0.6) * x.pow(2).mean().sqrt() / delta.pow(2).mean().sqrt()
        x = x + delta
        stream.append(x)
    prenorm = stream.pop()  # output of the last layer, before the final norm
    weight = torch.exp(0.6 * torch.randn(hidden, generator=g))
    final = prenorm * torch.rsqrt(prenorm.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    return torch.stack([*stream, final, prenorm])  # [L+2, T, H]


def capture(ref: torch.Tensor, indices) -> torch.Tensor:
    return torch.cat([ref[i] for i in indices], dim=-1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def ranking(slot: torch.Tensor, ref: torch.Tensor) -> list[tuple[float, int]]:
    return sorted((rel(slot, ref[r]), r) for r in range(ref.shape[0]))


def test_correct_slots_pass() -> None:
    ref = make_reference()
    report = compare_slots(capture(ref, EXPECTED), ref, expected=EXPECTED, num_layers=L, hidden_size=H)
    assert report.ok
    assert [v.best for v in report.slots] == list(EXPECTED)
    assert report.message() == SLOTS_OK.format(k=3, worst=fmt_err(0.0))
    fail_if_bad(report)  # does not raise


def test_bf16_capture_passes_at_a_bf16_tolerance() -> None:
    ref = make_reference()
    cap = capture(ref, EXPECTED).to(torch.bfloat16)
    assert not compare_slots(cap, ref, expected=EXPECTED, num_layers=L, hidden_size=H).ok
    report = compare_slots(cap, ref, expected=EXPECTED, num_layers=L, hidden_size=H, tol=0.02)
    assert report.ok, report.message(verbose=True)


def test_exact_diagnosis_line() -> None:
    # Orthonormal directions u_r; the captured slot is 1.004 u3, hs[3] = u3,
    # hs[0] and hs[2] lie 0.612 / 0.608 away from it, every other snapshot farther.
    R = L + 2
    u = torch.eye(H)[:R].unsqueeze(1).double()  # [R, 1, H]
    u3 = u[3]

    def at(err: float, r: int) -> torch.Tensor:  # u3 + x u_r with ||1.004 u3 - b|| / ||b|| = err
        x = math.sqrt((err**2 - 0.004**2) / (1 - err**2))
        return u3 + x * u[r]

    ref = torch.stack([at(0.9, r) for r in range(R)])
    ref[3], ref[0], ref[2] = u3, at(0.612, 0), at(0.608, 2)
    cap = torch.cat([1.004 * u3, ref[3], ref[5]], dim=-1).reshape(1, 3 * H)
    report = compare_slots(cap, ref, expected=EXPECTED, num_layers=L, hidden_size=H)
    assert not report.ok
    assert report.message() == (
        "aux hidden states: 1 of 3 slots wrong\n"
        "slot 0: holds hs[3] (input of layer 3, rel.err 0.004); expected hs[0] (embedding, rel.err 0.61); "
        "next best hs[2] at 0.61"
    )


def test_capture_from_the_wrong_layer_is_diagnosed() -> None:
    # SGLang before PR #25454 applied +1 to every id: [0, 3, 5] became hs[1], hs[4], hs[6].
    ref = make_reference()
    captured = (1, 4, 6)
    report = compare_slots(capture(ref, captured), ref, expected=EXPECTED, num_layers=L, hidden_size=H)
    assert not report.ok
    assert [v.best for v in report.slots] == list(captured)
    meanings = {1: "input of layer 1", 4: "input of layer 4", 6: "final norm output"}
    exp_meanings = {0: "embedding", 3: "input of layer 3", 5: "input of layer 5"}
    lines = [SLOTS_BAD.format(wrong=3, k=3)]
    for s, (got, want) in enumerate(zip(captured, EXPECTED)):
        rank = ranking(ref[got], ref)
        assert rank[0] == (0.0, got)
        label_of = "hs[{}]".format
        lines.append(
            SLOT_WRONG.format(
                slot=s,
                holding=HOLDS.format(label=label_of(got), meaning=meanings[got], err="0"),
                expected_label=label_of(want), expected_meaning=exp_meanings[want],
                expected_err=fmt_err(rel(ref[got], ref[want])),
                next_label=label_of(rank[1][1]) if rank[1][1] <= L else "final_prenorm",
                next_err=fmt_err(rank[1][0]),
            )
        )
    lines.append(
        "diagnosis [offset-twice]: every slot holds the snapshot one layer after the expected one "
        "(hs[1] for hs[0], hs[4] for hs[3], hs[6] for hs[5]): SGLang added 1 to the ids where the expectation "
        "did not (set_eagle3_layers_to_capture, in the target's model file; PR #25454 changed when "
        "upstream DeepSeek adds it)"
    )
    assert report.message() == "\n".join(lines)
    assert report.kinds == ("offset-twice",)
    assert report.message().splitlines()[2].startswith(
        "slot 1: holds hs[4] (input of layer 4, rel.err 0); expected hs[3] (input of layer 3, rel.err 0."
    )
    with pytest.raises(pytest.fail.Exception) as info:
        fail_if_bad(report)
    assert str(info.value) == report.message()


def test_final_prenorm_is_named() -> None:
    ref = make_reference()
    expected = (2, L + 1)
    report = compare_slots(capture(ref, (2, L)), ref, expected=expected, num_layers=L, hidden_size=H)
    (line,) = report.message().splitlines()[1:]
    assert line.startswith(
        "slot 1: holds hs[6] (final norm output, rel.err 0); "
        "expected final_prenorm (output of layer 5 before the final norm, rel.err "
    )


def test_swapped_order() -> None:
    ref = make_reference()
    report = compare_slots(capture(ref, (3, 0, 5)), ref, expected=EXPECTED, num_layers=L, hidden_size=H)
    lines = report.message().splitlines()
    assert lines[0] == "aux hidden states: 2 of 3 slots wrong"
    assert lines[1].startswith("slot 0: holds hs[3] (input of layer 3, rel.err 0); expected hs[0] (embedding")
    assert lines[2].startswith("slot 1: holds hs[0] (embedding, rel.err 0); expected hs[3] (input of layer 3")
    assert lines[3] == (
        "diagnosis [permuted-order]: the slots hold the expected snapshots in another order "
        "([hs[3], hs[0], hs[5]]): the captures were concatenated out of order"
    )
    assert len(lines) == 4


def test_partial_sum_matches_no_snapshot() -> None:
    # Half of the stream, e.g. one of two TP ranks' share before the all-reduce.
    ref = make_reference()
    cap = capture(ref, EXPECTED)
    cap[:, H : 2 * H] /= 2
    report = compare_slots(cap, ref, expected=EXPECTED, num_layers=L, hidden_size=H)
    lines = report.message().splitlines()
    assert lines[0] == "aux hidden states: 1 of 3 slots wrong"
    holding = NO_MATCH.format(label="hs[3]", err="0.5")
    assert lines[1].startswith(f"slot 1: {holding}; expected hs[3] (input of layer 3, rel.err 0.5); next best ")
    assert holding == "matches no snapshot (best hs[3] at 0.5)"


@pytest.mark.parametrize(
    ("hidden", "width", "message"),
    [
        (256, 512, "aux hidden states: captured width 512 = 2 slots of hidden 256; expected 3 slots"),
        (256, 256, "aux hidden states: captured width 256 = 1 slot of hidden 256; expected 3 slots"),
        (256, 1024, "aux hidden states: captured width 1024 = 4 slots of hidden 256; expected 3 slots"),
        (256, 700, "aux hidden states: captured width 700 is not a multiple of hidden 256; expected 3 slots = 768"),
    ],
)
def test_width_mismatch(hidden: int, width: int, message: str) -> None:
    ref = make_reference(hidden=hidden)
    cap = torch.cat([ref[2], ref[3], ref[3], ref[5]], dim=-1)[:, :width]
    report = compare_slots(cap, ref, expected=EXPECTED, num_layers=L, hidden_size=hidden)
    assert not report.ok
    lines = report.message().splitlines()
    assert lines[0] == message
    # whole slots that are present are still named
    assert len(lines) == 1 + width // hidden
    if width == 512:
        assert lines[1] == SLOT_PRESENT.format(
            slot=0, holding=HOLDS.format(label="hs[2]", meaning="input of layer 2", err="0")
        )
    report.message(verbose=True)  # the table copes with extra slots


def test_token_count_mismatch() -> None:
    ref = make_reference()
    cap = capture(ref, EXPECTED)[:3]
    report = compare_slots(cap, ref, expected=EXPECTED, num_layers=L, hidden_size=H, side_names=("fork", "HF"))
    assert report.message() == "aux hidden states: fork captured 3 tokens; the HF has 5"


def test_verbose_table() -> None:
    ref = make_reference()
    report = compare_slots(capture(ref, (1, 3, 5)), ref, expected=EXPECTED, num_layers=L, hidden_size=H)
    short, full = report.message(), report.message(verbose=True)
    assert "rel.err of each" not in short
    assert full.startswith(short + "\n\n")
    table = full.splitlines()
    assert table[3].split() == ["slot", "expected", "err", "best", "err", "next", "best", "err", "ok"]
    assert "rel.err of each SGLang slot against every reference snapshot:" in table
    assert any(line.split()[:2] == ["slot", "hs[0]"] and line.endswith("final_prenorm") for line in table)


def test_caller_errors_raise() -> None:
    ref = make_reference()
    with pytest.raises(ValueError, match=r"expected \[8, tokens, 64\]"):
        compare_slots(capture(ref, EXPECTED), ref[:-1], expected=EXPECTED, num_layers=L, hidden_size=H)
    with pytest.raises(ValueError, match="outside 0..7"):
        compare_slots(capture(ref, EXPECTED), ref, expected=(0, 9, 5), num_layers=L, hidden_size=H)


def test_fail_if_bad_hides_the_traceback(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch
        from pytest_eagle3.suite.outcome import fail_if_bad
        from pytest_eagle3.verdicts.compare import compare_slots

        def test_slots(pytestconfig):
            ref = torch.randn(8, 4, 16, dtype=torch.float64)
            cap = torch.cat([ref[1], ref[3], ref[5]], dim=-1)
            fail_if_bad(compare_slots(cap, ref, expected=(0, 3, 5), num_layers=6, hidden_size=16),
                        config=pytestconfig)
        """
    )
    result = pytester.runpytest("-v")
    result.assert_outcomes(failed=1)
    lines = result.stdout.lines
    start = lines.index("aux hidden states: 1 of 3 slots wrong")
    assert lines[start + 1].startswith(
        "slot 0: holds hs[1] (input of layer 1, rel.err 0); expected hs[0] (embedding, rel.err "
    )
    assert "rel.err of each SGLang slot against every reference snapshot:" in lines[start:]  # -v: tables
    assert "def test_slots" not in result.stdout.str()


# --- embedding completeness ---


def test_vocab_shards_follow_sglang_padding() -> None:
    assert vocab_shard_ranges(1000, 1) == [(0, 1000)]
    assert vocab_shard_ranges(1000, 4) == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    assert vocab_shard_ranges(100, 8)[-2:] == [(96, 100), (100, 100)]
    assert vocab_shard_ranges(129280, 8)[1] == (16160, 32320)  # DeepSeek-V3 vocabulary
    assert vocab_shard_ranges(100, 3) == [(0, 64), (64, 100), (100, 100)]  # padding becomes 64 * tp
    assert vocab_shard(300, 1000, 4) == 1
    assert vocab_shard(1000, 1000, 4) is None


@pytest.mark.parametrize(("vocab", "tp"), [(1000, 2), (1000, 8), (129280, 8), (32000, 4), (100, 8)])
def test_vocab_shards_match_installed_sglang(vocab: int, tp: int) -> None:
    vpe = pytest.importorskip(
        "sglang.srt.layers.vocab_parallel_embedding", exc_type=ImportError,
        reason="SGLang's vocab_parallel_embedding is not importable here",
    )
    padding = vpe.DEFAULT_VOCAB_PADDING_SIZE
    if vpe.pad_vocab_size(vocab, padding) % tp:
        padding *= tp
    padded = vpe.pad_vocab_size(vocab, padding)
    theirs = [
        (i.org_vocab_start_index, i.org_vocab_end_index)
        for i in (vpe.VocabParallelEmbedding._get_indices(padded, padded, vocab, vocab, r, tp) for r in range(tp))
    ]
    assert vocab_shard_ranges(vocab, tp) == theirs


def embedding_case(tp: int = 4, vocab: int = 1000):
    g = torch.Generator().manual_seed(1)
    ids = [5, 300, 600, 900, 10, 700, 255, 256]
    ref = torch.randn(len(ids), H, generator=g)
    return ids, ref, vocab, tp


def test_embedding_complete() -> None:
    ids, ref, vocab, tp = embedding_case()
    report = check_embedding_complete(ref.clone(), ref, ids, vocab_size=vocab, tp=tp)
    assert report.ok
    assert report.message() == "embedding: all 8 rows match the reference embedding (worst rel.err 0)"


def test_missing_embedding_allreduce_names_the_shards() -> None:
    ids, ref, vocab, tp = embedding_case()
    cap = ref.clone()
    for row, token in enumerate(ids):
        if vocab_shard(token, vocab, tp) != 0:
            cap[row] = 0  # rank 0's view before the all-reduce
    report = check_embedding_complete(cap, ref, ids, vocab_size=vocab, tp=tp)
    assert not report.ok
    assert report.partial_rank() == 0
    lines = report.message().splitlines()
    assert lines[0] == EMB_BAD.format(zero=5, tokens=8, off=0, reference_side="reference", tol=0.001)
    assert lines[1] == EMB_ALLREDUCE.format(shard=0, tp=4)
    assert lines[1] == (
        "only tokens of vocab shard 0 of 4 are right and every other row is zero: "
        "this is TP rank 0's partial embedding, before the all-reduce across TP ranks [unreduced-embedding]"
    )
    assert lines[2] == "row 1: token id 300 (vocab shard 1 of 4, ids 256..511): exact zero row"
    assert lines[2] == EMB_ZERO_ROW.format(row=1, token=300, shard=1, tp=4, start=256, end=511)
    assert lines[-1] == "row 7: token id 256 (vocab shard 1 of 4, ids 256..511): exact zero row"
    assert len(lines) == 2 + 5


def test_embedding_rows_off_the_reference() -> None:
    ids, ref, vocab, tp = embedding_case(tp=2)
    cap = ref.clone()
    cap[3] *= 2
    cap[6] = 0
    report = check_embedding_complete(cap, ref, ids, vocab_size=vocab, tp=tp, side_names=("SGLang", "HF"))
    assert report.partial_rank() is None
    lines = report.message().splitlines()
    assert lines[0] == "embedding: 1 of 8 rows are exact zeros, 1 off the HF (rel.err > 0.001)"
    assert lines[1] == EMB_OFF_ROW.format(
        row=3, token=900, shard=1, tp=2, start=512, end=999, err="1", reference_side="HF"
    )
    assert lines[2] == "row 6: token id 255 (vocab shard 0 of 2, ids 0..511): exact zero row"
    assert "rel.err" in report.message(verbose=True).splitlines()[4]


def test_embedding_shape_problem() -> None:
    ids, ref, vocab, tp = embedding_case()
    report = check_embedding_complete(ref[:, :10], ref, ids, vocab_size=vocab, tp=tp)
    assert report.message() == "embedding: SGLang slot has shape [8, 10]; the reference has [8, 64]"


# --- diagnoses: each bug class named with its [kind] (verdicts/diagnose.py) ---

from pytest_eagle3.verdicts.diagnose import rms_norm  # noqa: E402
from pytest_eagle3.verdicts.evidence import Evidence  # noqa: E402
from pytest_eagle3.verdicts.patterns import default_layers  # noqa: E402


def diagnose(cap: torch.Tensor, ref: torch.Tensor, expected=EXPECTED, **kwargs):
    report = compare_slots(cap, ref, expected=expected, num_layers=L, hidden_size=H, **kwargs)
    assert not report.ok
    return report, report.message().splitlines()


def test_offset_missing_is_named() -> None:
    ref = make_reference()
    report, lines = diagnose(capture(ref, (0, 2, 4)), ref, expected=(1, 3, 5))
    assert report.kinds == ("offset-missing",)
    assert lines[-1] == (
        "diagnosis [offset-missing]: every slot holds the snapshot one layer before the expected one "
        "(hs[0] for hs[1], hs[2] for hs[3], hs[4] for hs[5]): SGLang did not add 1 to the ids where the "
        "expectation did (set_eagle3_layers_to_capture, in the target's model file; PR #25454 changed when "
        "upstream DeepSeek adds it)"
    )


def test_default_ids_instead_of_configured_ones_are_named() -> None:
    ref = make_reference(num_layers=8)
    assert default_layers(8) == [2, 4, 5]
    report = compare_slots(capture(ref, (2, 4, 5)), ref, expected=(0, 3, 5), num_layers=8, hidden_size=H)
    assert report.kinds == ("ids-ignored",)
    assert report.message().splitlines()[-1] == (
        "diagnosis [ids-ignored]: the slots hold SGLang's default layers [2, L//2, L-3] = [hs[2], hs[4], hs[5]], "
        "not the configured ones ([hs[0], hs[3], hs[5]]): the configured ids were ignored "
        "(SGLang PR #22836, vLLM PR #50170)"
    )


def test_reversed_slots_are_named() -> None:
    ref = make_reference()
    report, lines = diagnose(capture(ref, (5, 3, 0)), ref)
    assert report.kinds == ("reversed-order",)
    assert lines[0] == "aux hidden states: 2 of 3 slots wrong"
    assert lines[-1] == (
        "diagnosis [reversed-order]: the slots hold the expected snapshots in reverse order "
        "([hs[5], hs[3], hs[0]]): the captures were concatenated in reverse"
    )


def norms(seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.exp(0.6 * torch.randn(L, H, generator=g))


def test_normalized_layer_input_is_named() -> None:
    ref, w = make_reference(), norms()
    cap = capture(ref, EXPECTED)
    cap[:, H:2 * H] = rms_norm(ref[3], w[3], 1e-6).float()
    report, lines = diagnose(cap, ref, evidence=Evidence(norms=w, norm_eps=1e-6))
    assert report.kinds == ("normalized-input",)
    assert lines[1].startswith("slot 1: matches no snapshot")
    assert lines[2].startswith("slot 1 holds input_layernorm(hs[3]) (rel.err ")
    assert lines[2].endswith(
        "): the normalized attention input of layer 3, not the residual stream [normalized-input]"
    )


def test_no_evidence_no_normalized_diagnosis() -> None:
    ref, w = make_reference(), norms()
    cap = capture(ref, EXPECTED)
    cap[:, H:2 * H] = rms_norm(ref[3], w[3], 1e-6).float()
    report, lines = diagnose(cap, ref)
    assert report.kinds == ()
    assert len(lines) == 2


def inside(seed: int = 5, tp: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic post-attention residuals, per-rank MLP shares and their sums."""
    g = torch.Generator().manual_seed(seed)
    post = torch.randn(L, T, H, generator=g)
    partial = torch.randn(tp, L, T, H, generator=g) * 0.5
    return post, partial, partial.sum(0)


def test_mlp_output_without_residual_is_named() -> None:
    ref = make_reference()
    post, partial, mlp = inside()
    cap = capture(ref, EXPECTED)
    cap[:, H:2 * H] = mlp[2]
    report, lines = diagnose(cap, ref, evidence=Evidence(post_attention=post, mlp=mlp, partial=partial, tp=2))
    assert report.kinds == ("no-residual",)
    assert lines[-1].startswith("slot 1 holds the MLP output of layer 2 (rel.err ")
    assert lines[-1].endswith(
        "the MLP output of layer 2 without the residual (hs[3] minus layer 2's post-attention residual; "
        "vLLM PR #14464) [no-residual]"
    )


def test_layer_delta_without_residual_needs_no_evidence() -> None:
    ref = make_reference()
    cap = capture(ref, EXPECTED)
    cap[:, 2 * H:] = ref[5] - ref[4]
    report, lines = diagnose(cap, ref)
    assert report.kinds == ("no-residual",)
    assert lines[-1].startswith("slot 2 holds hs[5] - hs[4] (rel.err ")
    assert lines[-1].endswith("layer 4's attention + MLP output without the residual (hs[5] - hs[4]; "
                              "vLLM PR #14464) [no-residual]")


def test_partial_sum_before_the_mlp_all_reduce_names_the_rank() -> None:
    ref = make_reference()
    post, partial, mlp = inside()
    cap = capture(ref, EXPECTED)
    cap[:, H:2 * H] = post[2] + partial[1, 2]
    report, lines = diagnose(cap, ref, evidence=lambda: Evidence(post_attention=post, mlp=mlp, partial=partial,
                                                                  tp=2))
    assert report.kinds == ("partial-sum",)
    assert lines[-1].startswith("slot 1 holds layer 2's post-attention residual + rank 1's MLP share (rel.err ")
    assert lines[-1].endswith(
        "hs[3] read before the MLP all-reduce: layer 2's post-attention residual plus TP rank 1's unreduced "
        "MLP share (SGLang PR #28343) [partial-sum]"
    )


def test_a_partial_sum_on_some_rows_only_is_named_on_those_rows() -> None:
    """Attention DP routes a decode step through its reduce-scatter only when every DP rank
    decodes the same number of tokens: a read before it is wrong on those steps' rows only,
    and the other rows hold the right snapshot (the rows the whole-slot fit cannot match)."""
    ref = make_reference()
    post, partial, mlp = inside()
    cap = capture(ref, EXPECTED)
    for slot, layer in ((1, 2), (2, 4)):
        cap[3:, slot * H:(slot + 1) * H] = (post[layer] + partial[0, layer])[3:]
    report, lines = diagnose(cap, ref, evidence=lambda: Evidence(post_attention=post, mlp=mlp, partial=partial,
                                                                  tp=2), first_row=10)
    assert report.kinds == ("partial-sum",)
    assert report.wrong_rows == (3, 4)
    assert "rows: 2 of 5 wrong (13..14), 3 right (10..12)" in lines
    assert lines[-2].startswith("slot 1 holds layer 2's post-attention residual + rank 0's MLP share on its "
                                "2 wrong rows of 5 (rel.err ")
    assert lines[-1].startswith("slot 2 holds layer 4's post-attention residual + rank 0's MLP share on its "
                                "2 wrong rows of 5 (rel.err ")
    # The same rows of another rank's share fit nothing: the fit is on the rows, not any tensor.
    cap[3:, H:2 * H] = (post[2] + 0.5 * partial[1, 2])[3:]
    report, lines = diagnose(cap, ref, evidence=Evidence(post_attention=post, mlp=mlp, partial=partial, tp=2))
    assert not any(line.startswith("slot 1 holds") for line in lines)


def test_each_slot_is_fitted_on_its_own_wrong_rows() -> None:
    ref = make_reference()
    post, partial, mlp = inside()
    cap = capture(ref, EXPECTED)
    cap[3:, H:2 * H] = (post[2] + partial[0, 2])[3:]  # slot 1 wrong on rows 3..4
    cap[:2, 2 * H:] = (post[4] + partial[1, 4])[:2]  # slot 2 wrong on rows 0..1
    report, lines = diagnose(cap, ref, evidence=Evidence(post_attention=post, mlp=mlp, partial=partial, tp=2))
    assert report.kinds == ("partial-sum",)
    assert lines[-2].startswith("slot 1 holds layer 2's post-attention residual + rank 0's MLP share on its 2 wrong "
                                "rows of 5")
    assert lines[-1].startswith("slot 2 holds layer 4's post-attention residual + rank 1's MLP share on its 2 wrong "
                                "rows of 5")


def test_a_slot_wrong_on_one_row_of_many_is_fitted_not_called_a_precision_loss() -> None:
    """One wrong row of 400 leaves the slot within the precision ceiling of its snapshot
    overall; the rows told apart say it is no precision loss, and the row is fitted."""
    tokens = 400
    ref = make_reference(tokens=tokens)
    g = torch.Generator().manual_seed(7)
    partial = torch.randn(2, L, tokens, H, generator=g) * 0.3
    post = ref[1:L + 1] - partial.sum(0)  # hs[l+1] = post-attention residual of layer l + its MLP output
    cap = capture(ref, EXPECTED)
    cap[17, H:2 * H] = (post[2] + partial[1, 2])[17]
    report = compare_slots(cap, ref, expected=EXPECTED, num_layers=L, hidden_size=H,
                           evidence=Evidence(post_attention=post, mlp=partial.sum(0), partial=partial, tp=2))
    assert report.slots[1].matched and not report.ok
    assert report.kinds == ("partial-sum",), report.message()
    assert "on its 1 wrong row of 400" in report.message()


def test_partial_sum_on_an_engine_that_fuses_the_all_reduce_names_the_fused_one() -> None:
    ref = make_reference()
    post, partial, mlp = inside()
    cap = capture(ref, EXPECTED)
    cap[:, H:2 * H] = post[2] + partial[0, 2]
    report, lines = diagnose(cap, ref, evidence=Evidence(post_attention=post, mlp=mlp, partial=partial, tp=2,
                                                         fused_allreduce=True))
    assert report.kinds == ("before-fused-allreduce",)
    assert lines[-1].endswith(
        "hs[3] read before the fused all-reduce: layer 2's post-attention residual plus TP rank 0's unreduced "
        "MLP share, whose all-reduce this engine fuses into layer 3's all-reduce + residual add + RMSNorm "
        "(SGLang PR #28343) [before-fused-allreduce]"
    )


def test_slots_aliased_to_the_last_residual_are_named() -> None:
    """Captures that kept the residual's storage all hold what the last in-place norm wrote."""
    ref = make_reference()
    report, lines = diagnose(capture(ref, (7, 7, 7)), ref)  # final_prenorm: the last fused add
    assert report.kinds == ("aliased-capture",)
    assert lines[-1].startswith("diagnosis [aliased-capture]: slots 0, 1, 2 all hold ")
    assert "in-place norms (fused_add_rmsnorm overwrites the residual) rewrote it (SGLang PR #39286" in lines[-1]


def test_two_slots_on_one_shallow_snapshot_are_not_aliasing() -> None:
    ref = make_reference()
    report, _ = diagnose(capture(ref, (3, 3, 5)), ref)
    assert "aliased-capture" not in report.kinds


def test_evidence_is_built_only_for_a_slot_matching_nothing() -> None:
    ref = make_reference()

    def boom() -> Evidence:
        raise AssertionError("evidence built for a clean or merely misplaced capture")

    assert compare_slots(capture(ref, EXPECTED), ref, expected=EXPECTED, num_layers=L, hidden_size=H,
                         evidence=boom).ok
    report = compare_slots(capture(ref, (1, 4, 6)), ref, expected=EXPECTED, num_layers=L, hidden_size=H,
                           evidence=boom)
    assert report.kinds == ("offset-twice",)


def test_scaled_by_the_attention_tp_size_is_named() -> None:
    ref = make_reference()
    cap = capture(ref, EXPECTED)
    cap[:, H:2 * H] *= 2
    report, lines = diagnose(cap, ref, evidence=Evidence(tp=2))
    assert report.kinds == ("dp-gather-scaled",)
    assert lines[-1].startswith("slot 1 holds 2 x hs[3] (rel.err ")
    assert lines[-1].endswith(
        "hs[3] (input of layer 3) scaled by the attention-TP size 2: rows summed over attention-TP ranks "
        "that all hold them, a gather done as an all-reduce (SGLang issue #31699) [dp-gather-scaled]"
    )
    # Without the TP size the factor is still named.
    report, lines = diagnose(cap, ref)
    assert report.kinds == ("scaled",)
    assert lines[-1].endswith("hs[3] (input of layer 3) times 2 [scaled]")


def test_embedding_slot_before_the_all_reduce_is_named() -> None:
    ids, emb, vocab, tp = embedding_case(tp=4)
    ref = make_reference(tokens=len(ids))
    ref[0] = emb
    cap = capture(ref, EXPECTED)
    for row, token in enumerate(ids):
        if vocab_shard(token, vocab, tp) != 1:
            cap[row, :H] = 0
    report, lines = diagnose(cap, ref, evidence=Evidence(token_ids=ids, vocab_size=vocab, tp=tp))
    assert report.kinds == ("unreduced-embedding",)
    assert lines[-1].startswith("slot 0 holds hs[0] with the rows of other vocab shards zeroed (rel.err 0): ")
    assert lines[-1].endswith(
        "TP rank 1's embedding before the all-reduce: right for the 2 tokens of vocab shard 1 of 4 "
        "(ids 256..511), exact zeros for the 6 others [unreduced-embedding]"
    )


def test_rows_of_another_request_are_named() -> None:
    ref, other = make_reference(seed=0), make_reference(seed=1)
    cap = capture(ref, EXPECTED)
    cap[3:] = capture(other, EXPECTED)[3:]
    report, lines = diagnose(cap, ref, evidence=Evidence(others={"request 1": other}))
    assert report.kinds == ("wrong-request-rows",)
    assert lines[-1] == (
        "slot 2 holds request 1's hs[5] in rows 3..4 of 5 (rel.err 0): another request's states, not this "
        "request's: the batch's rows were attributed to the wrong request (SGLang issue #26163) "
        "[wrong-request-rows]"
    )
    assert lines[4] == "rows: 2 of 5 wrong (3..4), 3 right (0..2)"  # before the diagnosis
    assert [line.split(" holds ")[0] for line in lines[5:]] == ["slot 0", "slot 1", "slot 2"]


def test_a_comparison_wrong_on_some_rows_names_them_and_their_boundary() -> None:
    """Rows, not only slots: a slot wrong on decode step 3 only says which rows and the
    segment they are exactly; a slot wrong everywhere, or off by a precision loss
    spread over its rows, says nothing of rows."""
    L, H, T = 4, 8, 5
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(L + 2, T, H, generator=g)
    expected = [0, 2, 3]
    aux = torch.cat([ref[i] for i in expected], dim=1)
    steps = [(f"decode step {j + 1}", j, j + 1) for j in range(T)]
    one = aux.clone()
    one[2, H:2 * H] = ref[1][2]  # step 3 holds the previous layer's state
    report = compare_slots(one, ref, expected=expected, num_layers=L, hidden_size=H, tol=1e-4, segments=steps,
                           first_row=40)
    assert not report.ok and report.wrong_rows == (2,)
    assert "rows: 1 of 5 wrong (42), 4 right (40..41, 43..44): exactly decode step 3 (rows 42)" in report.message()
    two = aux.clone()
    two[1:3, H:2 * H] = ref[1][1:3]
    half = compare_slots(two, ref, expected=expected, num_layers=L, hidden_size=H, tol=1e-4,
                         segments=[("chunk 1", 0, 2), ("chunk 2", 2, 5)])
    assert "rows: 2 of 5 wrong (1..2), 3 right (0, 3..4); no boundary of chunk separates them" in half.message()
    everywhere = aux.clone()
    everywhere[:, H:2 * H] = ref[1]
    assert compare_slots(everywhere, ref, expected=expected, num_layers=L, hidden_size=H, tol=1e-4).rows_line is None
    noisy = aux.clone()
    noisy[:, H:2 * H] = ref[2].bfloat16().float()  # a precision round trip: every row a little off
    report = compare_slots(noisy, ref, expected=expected, num_layers=L, hidden_size=H, tol=1e-4)
    assert not report.ok and report.rows_line is None and report.wrong_rows == ()
