"""The reduce-scatter route proof without an engine: the worker's observer and log
line (worker/reduce_scatter_proof.py), the test process's reading of them
(engine/route_proof.py), the engine env that switches them on, the CPU tier's
input-scattered device condition and the input-scattered capture fix.

On the real engine (sglang 0.5.23, TP 2): ``tests/e2e/test_reduce_scatter_routes.py``.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from pytest_eagle3.engine.route_proof import forwards, proof_lines, route_not_off, route_not_proven, route_note
from pytest_eagle3.worker import reduce_scatter_proof as proof

DP = ("DECODE", "dp_reduce_scatter")


def line(rank: int, seq: int, mode: str, captured: bool = True, routes: str = "none", tokens: int = 4,
         padding: str = "MAX_LEN", global_tokens: str = "4,4") -> str:
    return "[2026-12-06 TP%d] " % rank + proof.PROOF_LINE.format(
        rank=rank, seq=seq, mode=mode, tokens=tokens, padding=padding, global_tokens=global_tokens,
        rows=tokens if captured else 0, routes=routes, pid=100 + rank)


RS = "dp_reduce_scatter (srt/layers/layer_boundary/ops.py:318) in layers 2,3,4,5,6,7"


def test_lines_parse_back() -> None:
    text = "\n".join([line(0, 1, "EXTEND"), line(0, 2, "DECODE", routes=RS),
                      line(1, 2, "IDLE", captured=False)])
    got = forwards(text)
    assert [(f.rank, f.seq, f.mode, f.captured) for f in got] == [
        (0, 1, "EXTEND", True), (0, 2, "DECODE", True), (1, 2, "IDLE", False)]
    assert got[1].routes == {"dp_reduce_scatter": ("srt/layers/layer_boundary/ops.py:318", (2, 3, 4, 5, 6, 7))}
    assert got[0].routes == {}
    assert (got[0].padding, got[0].global_tokens) == ("MAX_LEN", (4, 4))
    plain = forwards(line(0, 1, "EXTEND", padding="-", global_tokens="-"))[0]
    assert (plain.padding, plain.global_tokens) == ("-", ())


def test_proven_when_every_rank_ran_it_in_every_captured_forward_of_its_mode() -> None:
    text = "\n".join([line(r, s, m, routes=RS if m == "DECODE" else "none")
                      for r in (0, 1) for s, m in ((1, "EXTEND"), (2, "DECODE"), (3, "DECODE"))]
                     + [line(1, 4, "IDLE", captured=False)])
    assert route_not_proven(text, variant="dp-attention", mode=DP[0], function=DP[1], tp=2,
                            every_forward=True) is None
    assert proof_lines(text, *DP, 2) == [
        f"TP rank {r}: dp_reduce_scatter (srt/layers/layer_boundary/ops.py:318) in layers 2-7 of 2 of 2 "
        "DECODE forwards that returned captures" for r in (0, 1)]


def test_a_rank_that_never_ran_it_fails_naming_the_rank() -> None:
    text = "\n".join([line(0, 2, "DECODE", routes=RS), line(1, 2, "DECODE")])
    why = route_not_proven(text, variant="dp-attention", mode=DP[0], function=DP[1], tp=2, every_forward=False,
                           log="/l.log")
    assert why is not None and why.startswith(
        "dp-attention: the reduce-scatter route did not run: no DECODE forward on TP rank 1 that returned "
        "captures called dp_reduce_scatter (1 such forward(s), 1 padded for it; reduce-scatters it ran: none)")
    assert route_not_proven("", variant="v", mode=DP[0], function=DP[1], tp=1, every_forward=True) is not None


def test_a_captured_forward_without_it_fails_on_cpu() -> None:
    text = "\n".join([line(r, 2, "DECODE", routes=RS) for r in (0, 1)] + [line(0, 3, "DECODE", tokens=2)])
    kw = dict(variant="dp-attention", mode=DP[0], function=DP[1], tp=2, log="/l.log")
    assert route_not_proven(text, every_forward=True, **kw) == (
        "dp-attention: TP rank 0 forward 3 (DECODE, 2 token(s), DP padding MAX_LEN) returned captures without "
        "dp_reduce_scatter (it ran: no reduce-scatter); the route this variant proves was not taken there "
        "(log: /l.log)")
    assert route_not_proven(text, every_forward=False, **kw) is None
    # A forward that returned no captures is not judged.
    quiet = "\n".join([line(r, 2, "DECODE", routes=RS) for r in (0, 1)] + [line(0, 3, "DECODE", captured=False)])
    assert route_not_proven(quiet, every_forward=True, **kw) is None


def test_a_sum_len_padded_decode_owes_no_dp_reduce_scatter() -> None:
    """SGLang takes dp_reduce_scatter only in a MAX_LEN-padded batch (exit.py
    _select_dp_reduce_scatter); a decode step where the other DP rank extends is
    SUM_LEN-padded and scatters instead: not a miss, and said in the proof line.
    A rank whose every decode was SUM_LEN-padded did not prove the route."""
    kw = dict(variant="dp-attention", mode=DP[0], function=DP[1], tp=2, log="/l.log")
    text = "\n".join([line(r, 2, "DECODE", routes=RS) for r in (0, 1)]
                     + [line(1, 3, "DECODE", tokens=3, padding="SUM_LEN", global_tokens="5,3")])
    assert route_not_proven(text, every_forward=True, **kw) is None
    assert proof_lines(text, *DP, 2)[1] == (
        "TP rank 1: dp_reduce_scatter (srt/layers/layer_boundary/ops.py:318) in layers 2-7 of 1 of 2 DECODE "
        "forwards that returned captures; 1 of them SUM_LEN-padded (DP ranks' tokens [5,3]), where SGLang "
        "takes no dp_reduce_scatter")
    only_sum = "\n".join([line(0, 2, "DECODE", routes=RS), line(1, 3, "DECODE", padding="SUM_LEN", global_tokens="4,48")])
    why = route_not_proven(only_sum, every_forward=True, **kw)
    assert why is not None and "no DECODE forward on TP rank 1" in why and "1 such forward(s), 0 padded for it" in why
    # The input-scattered route has no padding rule: every captured extend owes it.
    assert forwards(line(0, 1, "EXTEND", padding="-"))[0].due("tp_reduce_scatter")


def test_the_pair_without_the_route_must_show_none_where_it_was_due() -> None:
    """dp-attention's pair (--boundary-reduction ar) is a contrast only if every rank
    returned captures in MAX_LEN-padded decode forwards, none with dp_reduce_scatter."""
    kw = dict(variant="dp-attention-all-reduce", mode=DP[0], function=DP[1], tp=2, log="/p.log")
    off = "\n".join(line(r, 2, "DECODE") for r in (0, 1))
    assert route_not_off(off, **kw) is None
    ran = "\n".join([line(0, 2, "DECODE"), line(1, 2, "DECODE", routes=RS)])
    assert route_not_off(ran, **kw) == (
        "dp-attention-all-reduce: the engine without the route is no contrast: TP rank 1 forward 2 (DECODE) "
        "called dp_reduce_scatter all the same (log: /p.log)")
    sum_only = "\n".join([line(0, 2, "DECODE"), line(1, 2, "DECODE", padding="SUM_LEN")])
    why = route_not_off(sum_only, **kw)
    assert why is not None and "TP rank 1 returned captures in no DECODE forward padded for dp_reduce_scatter" in why


def test_the_route_note_follows_the_tag_the_failure_names() -> None:
    text = "\n".join(line(r, 2, "DECODE", routes=RS) for r in (0, 1))
    partial = route_note(text, *DP, 2, "slot 1 [partial-sum]: ...")
    assert partial.startswith("[partial-sum] on the dp_reduce_scatter route: in the DECODE forwards of TP ranks 0, 1")
    rows = route_note(text, *DP, 2, "slot 1 [wrong-request-rows]: request 1's hs[3]")
    assert rows.startswith("[wrong-request-rows] on the dp_reduce_scatter route") and "layers 2-7" in rows
    assert route_note(text, *DP, 2, "[no-residual] ...") == "" and route_note("", *DP, 2, "[partial-sum]") == ""
    assert "padded" not in partial


def test_the_route_note_says_which_forwards_skipped_the_route() -> None:
    """A decode step beside another DP rank's extend is SUM_LEN-padded and takes no
    dp_reduce_scatter: a capture read before it is wrong on the other steps only."""
    text = "\n".join([line(0, 2, "DECODE", routes=RS), line(1, 2, "DECODE", routes=RS),
                      line(1, 3, "DECODE", padding="SUM_LEN", global_tokens="4,48")])
    note = route_note(text, *DP, 2, "slot 1 [partial-sum]: ...")
    assert note.startswith("[partial-sum] on the dp_reduce_scatter route: in the DECODE forwards of TP ranks 0, 1")
    assert note.endswith("; 1 DECODE forward(s) that returned captures were SUM_LEN-padded (e.g. TP rank 1 forward 3: "
                         "DP ranks' tokens [4,48]), where SGLang takes no dp_reduce_scatter: their rows hold the "
                         "right values even with the bug")
    # A SUM_LEN forward that ran the route all the same is not listed as skipping it.
    ran = "\n".join([line(0, 2, "DECODE", routes=RS), line(1, 3, "DECODE", routes=RS, padding="SUM_LEN")])
    assert "padded" not in route_note(ran, *DP, 2, "slot 1 [partial-sum]: ...")


def test_the_observer_names_the_asking_function_and_the_layers(caplog: pytest.LogCaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    calls = []

    class GroupCoordinator:
        def reduce_scatter_tensor(self, output, input):
            calls.append(input.shape[0])
            output.copy_(input[: output.shape[0]])

    module = SimpleNamespace(GroupCoordinator=GroupCoordinator)
    proof.wrap_coordinator(module)
    proof.wrap_coordinator(module)  # once only
    group = GroupCoordinator()

    def dp_reduce_scatter(out, x):  # the SGLang step that asks for it
        group.reduce_scatter_tensor(out, x)

    class Layer(torch.nn.Module):
        def __init__(self, layer_id, scatter):
            super().__init__()
            self.layer_id, self.scatter = layer_id, scatter

        def forward(self, x):
            if self.scatter:
                out = x.new_empty((x.shape[0] // 2, x.shape[1]))
                dp_reduce_scatter(out, x)
            return x

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([Layer(0, False), Layer(1, True), Layer(2, True)])
    batch = SimpleNamespace(forward_mode=SimpleNamespace(name="DECODE"),
                            dp_padding_mode=SimpleNamespace(name="MAX_LEN"), global_num_tokens_cpu=[4, 4])
    ids = torch.zeros(4, dtype=torch.long)
    with caplog.at_level(logging.WARNING, logger="pytest_eagle3.reduce_scatter_proof"):
        proof.before_forward(model, ids, None, batch)
        x = torch.ones(4, 3)
        for layer in model.layers:
            x = layer(x)
        proof.after_forward((x, torch.ones(4, 9)), model, ids, None, batch)
        proof.before_forward(model, ids, None, SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND")))
        proof.after_forward(x, model, ids, None, SimpleNamespace(forward_mode=SimpleNamespace(name="EXTEND")))
    assert calls == [4, 4]
    got = forwards("\n".join(r.getMessage() for r in caplog.records))
    assert [(f.mode, f.captured, f.tokens, f.padding, f.global_tokens) for f in got] == [
        ("DECODE", True, 4, "MAX_LEN", (4, 4)), ("EXTEND", False, 4, "-", ())]
    where, layers = got[0].routes["dp_reduce_scatter"]
    assert layers == (1, 2) and where.endswith(f"test_route_proof.py:{dp_reduce_scatter.__code__.co_firstlineno}")
    assert got[1].routes == {}
    # Outside a bracketed forward the observer only calls through.
    group.reduce_scatter_tensor(torch.empty(1, 3), torch.ones(2, 3))
    assert calls == [4, 4, 2]


def test_engine_env_switches_the_proof_and_the_cpu_condition_on() -> None:
    from pytest_eagle3.engine.config import build_engine_config
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.worker.env import INPUT_SCATTERED_ENV, ROUTE_PROOF_ENV

    from tests.unit.test_variants import FLAGS_0523

    inst = SGLangInstall(version="0.5.23", location="", flags=FLAGS_0523, python="python")
    env = lambda **args: build_engine_config(inst, model_path="/m", tp=2, device="cpu", test_args=args).env_dict()
    assert ROUTE_PROOF_ENV not in env() and INPUT_SCATTERED_ENV not in env()
    assert env(attn_dp_size=2)[ROUTE_PROOF_ENV] == "1" and INPUT_SCATTERED_ENV not in env(attn_dp_size=2)
    scattered = env(enable_attn_tp_input_scattered=True)
    assert scattered[ROUTE_PROOF_ENV] == "1" and scattered[INPUT_SCATTERED_ENV] == "1"


def test_cpu_input_scattered_condition_answers_only_the_device(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("torch")
    from pytest_eagle3.worker.cpu import patches

    module = SimpleNamespace(_is_cuda=False, _is_npu=False, AttnTpContext=object)
    patches.input_scattered_platform(module)
    assert module._is_cuda is True and module._is_npu is False
    other = SimpleNamespace(_is_cuda=False)  # not the attention adapter module: untouched
    patches.input_scattered_platform(other)
    assert other._is_cuda is False


def test_input_scattered_fix_gathers_the_captured_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("sglang.srt.layers.layer_boundary.adapters.attention")
    from sglang.srt.layers.layer_boundary.adapters import attention

    from pytest_eagle3.worker import upstream_fixes

    stored = []
    collector = SimpleNamespace(capture=lambda value, owned=False: stored.append((value, owned)))
    gather = lambda value, batch: torch.cat([value, value + 10])  # two ranks' slices
    monkeypatch.setattr(attention, "tp_gather", gather)
    batch = SimpleNamespace()

    def prepare(boundary, hidden, stream, forward_batch, capture_gathered=None):
        capture_gathered.capture(torch.ones(2, 3))
        return hidden, stream

    for scattered, rows in ((False, 2), (True, 4)):
        monkeypatch.setattr(type(attention.get_attn_tp_context()), "input_scattered", property(lambda s: scattered))
        upstream_fixes._around_prepare_attention(prepare, None, "h", "s", batch, capture_gathered=collector)
        assert stored[-1][0].shape[0] == rows


def test_rank_rows_by_position_judges_each_rank_at_its_rows_positions() -> None:
    """Each rank's rows of each request against the reference at their own positions
    (prefill and decode apart); a wrong rank is named; a request no rank recorded fails."""
    torch = pytest.importorskip("torch")
    from pytest_eagle3.engine.recordings import Record
    from pytest_eagle3.verdicts.rankcheck import rank_rows_by_position

    L, H, N = 4, 8, 6
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(L + 2, N, H, generator=g)
    expected = [0, 2, 3]

    def rec(rank, mode, rid, pos, *, wrong=False):
        pos = torch.tensor(pos)
        aux = torch.cat([ref[i][pos] for i in expected], dim=1)
        if wrong:
            aux[:, H:2 * H] = ref[1][pos]  # slot 1 holds the wrong snapshot
        return Record(rank, 1, mode, aux, torch.zeros(len(pos), dtype=torch.long), pos, None, (rid,), (len(pos),))

    kw = dict(expected=expected, num_layers=L, hidden_size=H, tol=1e-4)
    # Attention DP: request a on rank 0, b on rank 1 (prefill 0..3, decode 4, 5).
    fwd = {0: [rec(0, "EXTEND", "a", [0, 1, 2, 3]), rec(0, "DECODE", "a", [4]), rec(0, "DECODE", "a", [5])],
           1: [rec(1, "EXTEND", "b", [0, 1, 2]), rec(1, "IDLE", "b", [3]), rec(1, "DECODE", "b", [3], wrong=True)]}
    got = rank_rows_by_position(fwd, ["a", "b"], [ref, ref], every_rank=False, **kw)
    assert [(r, i, m, rep.ok) for rep, r, i, m in got] == [
        (0, 0, "decode", True), (0, 0, "prefill", True), (1, 1, "decode", False), (1, 1, "prefill", True)]
    bad = next(rep for rep, r, i, m in got if not rep.ok)
    assert bad.text.startswith("TP rank 1, request 1 (decode rows at positions 3..3): aux hidden states: 1 of 3 "
                               "slots wrong\nslot 1: holds hs[1]"), bad.text
    # Without DP every rank must hold every request: b missing on rank 0 fails.
    missing = rank_rows_by_position(fwd, ["a", "b"], [ref, ref], every_rank=True, **kw)
    assert any(m == "prefill" and r == -1 and not rep.ok and "no TP rank recorded rows of request 0" in rep.text
               for rep, r, i, m in missing)


def test_rank_rows_by_position_names_the_bug_from_the_evidence_at_those_positions() -> None:
    """A rank's decode rows holding its unreduced MLP share (a read before attention DP's
    reduce-scatter) are named ``[partial-sum]`` from the request's evidence taken at the
    rows' positions, not at rows 0.."""
    torch = pytest.importorskip("torch")
    from pytest_eagle3.engine.recordings import Record
    from pytest_eagle3.verdicts.evidence import Evidence
    from pytest_eagle3.verdicts.rankcheck import rank_rows_by_position

    L, H, N = 4, 8, 6
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(L + 2, N, H, generator=g)
    post, partial = torch.randn(L, N, H, generator=g), torch.randn(2, L, N, H, generator=g)
    expected = [0, 2, 3]
    pos = torch.tensor([4, 5])
    aux = torch.cat([ref[i][pos] for i in expected], dim=1)
    aux[:, H:2 * H] = (post[1] + partial[1, 1])[pos]  # hs[2] read before layer 1's reduce-scatter, rank 1's share
    fwd = {1: [Record(1, 1, "DECODE", aux, torch.zeros(2, dtype=torch.long), pos, None, ("b",), (2,))]}
    kw = dict(expected=expected, num_layers=L, hidden_size=H, tol=1e-4, every_rank=False)
    ev = Evidence(post_attention=post, partial=partial, tp=2)
    (bad, rank, i, mode), = rank_rows_by_position(fwd, ["b"], [ref], evidence=[lambda: ev], **kw)
    assert (rank, i, mode, bad.ok) == (1, 0, "decode", False)
    assert "slot 1 holds layer 1's post-attention residual + rank 1's MLP share (rel.err" in bad.text, bad.text
    assert "[partial-sum]" in bad.text
    (plain, *_), = rank_rows_by_position(fwd, ["b"], [ref], **kw)
    assert "[partial-sum]" not in plain.text


def test_dp_route_reads_the_pending_reduce_scatter_and_the_rank_rows() -> None:
    torch = pytest.importorskip("torch")
    from functools import partial

    from pytest_eagle3.worker import dp_route

    def dp_reduce_scatter(out, x, batch):  # SGLang's step, by name
        pass

    def to_dp_local(step, batch, x):
        pass

    assert dp_route.owed_to_dp_reduce_scatter(SimpleNamespace(reduce_to_dp_local=partial(to_dp_local,
                                                                                           dp_reduce_scatter, None)))
    assert not dp_route.owed_to_dp_reduce_scatter(SimpleNamespace(reduce_to_dp_local=None))
    assert not dp_route.owed_to_dp_reduce_scatter(None)
    gathered = torch.arange(8.0).reshape(8, 1)  # 2 DP ranks, max_len 4
    assert dp_route.own_rows(gathered, 3, 1, 2).flatten().tolist() == [4.0, 5.0, 6.0]
