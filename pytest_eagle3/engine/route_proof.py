"""Proof, from an engine's log, that its captures passed one of SGLang's reduce-scatter routes.

Every TP worker of an engine on a reduce-scatter route logs one line per forward
of the capturing model (:mod:`pytest_eagle3.worker.reduce_scatter_proof`): its
order, mode, token count, whether it returned captures, and each reduce-scatter
SGLang called in it, with the asking function and the decoder layers.  A path
variant with a route (:attr:`pytest_eagle3.engine.variants.Variant.reduce_scatter`,
``(forward mode, SGLang function)``) passes only if:

* every TP rank ran the function in at least one forward of that mode that
  returned captures (else the route never ran there: :data:`NOT_RUN`);
* with ``every_forward`` (the CPU tier), no forward of that mode that SGLang's
  own rule sends down the route returned captures without it (:data:`MISSED`).
  For ``dp_reduce_scatter`` the rule is the batch's DP padding mode, which the
  worker logs: only a MAX_LEN-padded batch takes it (``exit.py``
  ``_select_dp_reduce_scatter``); a decode batch is SUM_LEN-padded when another
  DP rank extends in the same step (``is_extend_in_batch`` is global over the DP
  ranks), so which decode forwards take the route depends on how the scheduler
  interleaved the requests, not on the batch alone.

:func:`proof_lines` gives one line per rank for the report.  Measured on
sglang 0.5.23, CPU, TP 2, tiny-dsv3: attention DP takes ``dp_reduce_scatter``
(``srt/layers/layer_boundary/ops.py:318``) in the MoE layers 2-7 of every
MAX_LEN-padded decode forward and none in extend forwards (``DpPaddingMode`` picks
SUM_LEN for a step where a DP rank extends, MAX_LEN for a decode-only step:
``srt/layers/dp_attention.py:165-205``); TP rank 1 logged ``forward 6 DECODE of 4
token(s), DP padding SUM_LEN over 48,4`` without it while rank 0 extended 48 tokens;
input-scattered attention takes ``tp_reduce_scatter`` (``ops.py:69``) in all
eight layers of every extend forward, none in decode.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from pytest_eagle3.worker.reduce_scatter_proof import PROOF, ROUTE

NOT_RUN = ("{variant}: the reduce-scatter route did not run: no {mode} forward on TP rank {rank} that returned "
           "captures called {function} ({seen}); the captures did not pass it, so this test proves nothing "
           "about it (log: {log})")
MISSED = ("{variant}: TP rank {rank} forward {seq} ({mode}, {tokens} token(s), DP padding {padding}) returned "
          "captures without "
          "{function} (it ran: {routes}); the route this variant proves was not taken there (log: {log})")

NOT_OFF = ("{variant}: the engine without the route is no contrast: {why} (log: {log})")


#: The padding mode a reduce-scatter route needs: ``_select_dp_reduce_scatter``
#: (``srt/layers/layer_boundary/exit.py``, 0.5.23) takes ``dp_reduce_scatter`` only when
#: ``forward_batch.dp_padding_mode.is_max_len()``, else ``dp_scatter``.
PADDING_RULE = {"dp_reduce_scatter": "MAX_LEN"}


@dataclass(frozen=True)
class Forward:
    """One forward of the capturing model on one TP rank, as its worker logged it.

    Attributes:
        rank: TP rank.
        seq: the forward's order in that worker process (1-based).
        mode: SGLang's forward mode name (``EXTEND``, ``DECODE``, ``IDLE``, ...).
        tokens: rows in the forward's batch on this rank.
        rows: rows of the aux hidden states it returned (0: none).
        padding: the batch's attention-DP padding mode (``MAX_LEN``, ``SUM_LEN``; ``-`` without DP).
        global_tokens: the DP ranks' token counts the padding mode was chosen from (empty without DP).
        routes: function name -> (its ``srt/...:line``, the layers it ran in; ``None`` unknown).
    """

    rank: int
    seq: int
    mode: str
    tokens: int
    rows: int
    padding: str = "-"
    global_tokens: tuple[int, ...] = ()
    routes: dict[str, tuple[str, tuple[int | None, ...]]] = field(default_factory=dict)

    @property
    def captured(self) -> bool:
        """Whether the forward returned aux hidden states."""
        return self.rows > 0

    def due(self, function: str) -> bool:
        """Whether SGLang's own rule sends this forward down ``function``: a
        ``dp_reduce_scatter`` only in a MAX_LEN-padded batch (:data:`PADDING_RULE`)."""
        need = PADDING_RULE.get(function)
        return need is None or self.padding in (need, "-")


def forwards(log_text: str) -> list[Forward]:
    """Every forward line in ``log_text``, in log order."""
    out = []
    for m in PROOF.finditer(log_text):
        routes = {}
        if m.group("routes") != "none":
            for r in ROUTE.finditer(m.group("routes")):
                layers = tuple(None if x == "?" else int(x) for x in r.group("layers").split(","))
                routes[r.group("name")] = (r.group("where"), layers)
        counts = m.group("global")
        out.append(Forward(rank=int(m.group("rank")), seq=int(m.group("seq")), mode=m.group("mode"),
                           tokens=int(m.group("tokens")), rows=int(m.group("rows")), padding=m.group("padding"),
                           global_tokens=tuple(int(x) for x in counts.split(",")) if counts != "-" else (),
                           routes=routes))
    return out


def _layers(layers: Sequence[int | None]) -> str:
    known = sorted({x for x in layers if x is not None})
    if not known:
        return "?"
    if known == list(range(known[0], known[-1] + 1)) and len(known) > 2:
        return f"{known[0]}-{known[-1]}"
    return ",".join(map(str, known))


def proof_lines(log_text: str, mode: str, function: str, tp: int) -> list[str]:
    """One line per TP rank: in how many of its ``mode`` forwards that returned
    captures ``function`` ran, where SGLang defines it, and in which layers."""
    seen = forwards(log_text)
    lines = []
    for rank in range(tp):
        mine = [f for f in seen if f.rank == rank and f.mode == mode and f.captured]
        took = [f for f in mine if function in f.routes]
        if took:
            layers = _layers([x for f in took for x in f.routes[function][1]])
            line = (f"TP rank {rank}: {function} ({took[0].routes[function][0]}) in layers {layers} of {len(took)} "
                    f"of {len(mine)} {mode} forwards that returned captures")
        else:
            line = f"TP rank {rank}: {function} in none of {len(mine)} {mode} forwards that returned captures"
        other = [f for f in mine if not f.due(function)]
        if other:
            line += (f"; {len(other)} of them {other[0].padding}-padded (DP ranks' tokens "
                     f"{', '.join('[' + ','.join(map(str, f.global_tokens)) + ']' for f in other[:3])}"
                     f"{', ...' if len(other) > 3 else ''}), where SGLang takes no {function}")
        lines.append(line)
    return lines


def route_not_proven(log_text: str, *, variant: str, mode: str, function: str, tp: int, every_forward: bool,
                     log: str = "") -> str | None:
    """Why the engine's captures are not proven to have passed ``function`` in
    ``mode`` forwards (:data:`NOT_RUN`, :data:`MISSED`), or ``None``."""
    seen = forwards(log_text)
    for rank in range(tp):
        mine = [f for f in seen if f.rank == rank and f.mode == mode and f.captured]
        due = [f for f in mine if f.due(function)]
        if not any(function in f.routes for f in due):
            other = sorted({name for f in seen if f.rank == rank for name in f.routes})
            return NOT_RUN.format(variant=variant, mode=mode, rank=rank, function=function, log=log,
                                  seen=f"{len(mine)} such forward(s), {len(due)} padded for it; "
                                  "reduce-scatters it ran: "
                                  + (", ".join(other) or "none"))
        if every_forward:
            for f in due:
                if function not in f.routes:
                    return MISSED.format(variant=variant, rank=rank, seq=f.seq, mode=mode, tokens=f.tokens,
                                         padding=f.padding,
                                         function=function, routes=", ".join(f.routes) or "no reduce-scatter",
                                         log=log)
    return None


def route_not_off(log_text: str, *, variant: str, mode: str, function: str, tp: int, log: str = "") -> str | None:
    """Why the pair engine of a route's variant (its settings, the route switched off) is
    not proven to have run without it (:data:`NOT_OFF`), or ``None``: every TP rank must
    have ``mode`` forwards that returned captures under the padding the route needs
    (:meth:`Forward.due`) and no forward may have called ``function``."""
    seen = forwards(log_text)
    for rank in range(tp):
        mine = [f for f in seen if f.rank == rank]
        took = [f for f in mine if function in f.routes]
        if took:
            return NOT_OFF.format(variant=variant, log=log, why=f"TP rank {rank} forward {took[0].seq} "
                                  f"({took[0].mode}) called {function} all the same")
        if not any(f.mode == mode and f.captured and f.due(function) for f in mine):
            return NOT_OFF.format(variant=variant, log=log, why=f"TP rank {rank} returned captures in no "
                                  f"{mode} forward padded for {function} ({len(mine)} forward(s) logged)")
    return None


#: The cause key and line of an input-scattered engine that died because its capture kept only a slice.
SCATTERED_CAPTURE_CAUSE = ("[input-scattered-capture] under input-scattered attention the aux capture holds only "
                           "each TP rank's slice of the rows")
SCATTERED_CAPTURE = (
    "[input-scattered-capture] under input-scattered attention the aux capture holds only each TP rank's slice "
    "of the rows: TP rank {rank} forward {seq} ({mode}, {tokens} token(s)) ran {function} ({where}) in layers "
    "{layers} and returned captures of {rows} row(s), {tokens} / TP {tp}; the logits processor then indexed "
    "them with the batch's rows and the engine died of {cause}.  SGLang hands the capture the residual stream "
    "on the rank's slice (StageBoundary._prepare_attention, srt/layers/layer_boundary/stage.py: no gather for "
    "an input-scattered entry) while the final hidden states are gathered back; with "
    "PYTEST_EAGLE3_UPSTREAM_FIX=input-scattered-capture-gathered (the capture gathered over the TP group) the "
    "same test passes")
_INDEX_DEATH = ("IndexError", "logits_processor.py")


def explain_death(server_args: dict, cause: str | None, log_text: str, tp: int) -> tuple[str, str] | None:
    """``(cause key, line)`` for an input-scattered engine (``enable_attn_tp_input_scattered``)
    that died of an ``IndexError`` in the logits processor right after a forward whose
    workers logged captures of ``tokens / tp`` rows on the ``tp_reduce_scatter`` route;
    ``None`` otherwise.  Measured on sglang 0.5.23, CPU, TP 2, tiny-dsv3: a 138-token
    batch returned 69 captured rows per rank and died of ``IndexError: index 96 is out of
    bounds for dimension 0 with size 69`` (``logits_processor.py:728``)."""
    if not server_args.get("enable_attn_tp_input_scattered") or not cause or tp < 2:
        return None
    if not all(word in cause for word in _INDEX_DEATH):
        return None
    short = [f for f in forwards(log_text) if f.captured and "tp_reduce_scatter" in f.routes
             and f.rows * tp == f.tokens and f.tokens > f.rows]
    if not short:
        return None
    f = short[-1]
    where, layers = f.routes["tp_reduce_scatter"]
    return SCATTERED_CAPTURE_CAUSE, SCATTERED_CAPTURE.format(
        rank=f.rank, seq=f.seq, mode=f.mode, tokens=f.tokens, function="tp_reduce_scatter", where=where,
        layers=_layers(layers), rows=f.rows, tp=tp, cause=cause)


ROUTE_NOTES = {
    "[partial-sum]": (
        "[partial-sum] on the {function} route: in the {mode} forwards of TP ranks {ranks} that returned "
        "captures, {function} ({where}) completes the sum of layers {layers}; a slot that holds the residual "
        "plus one rank's unreduced share was read before that reduce-scatter ran"),
    "[wrong-request-rows]": (
        "[wrong-request-rows] on the {function} route: in the {mode} forwards of TP ranks {ranks} that returned "
        "captures, {function} ({where}) hands each rank its own chunk of the gathered rows in layers {layers}; "
        "rows of another request there are the slice another rank got"),
}


#: Appended to a route note when some forwards of the mode were padded so that SGLang
#: took no ``function`` there: a read on the route leaves their rows right.
ROUTE_SKIPPED = (
    "; {n} {mode} forward(s) that returned captures were {padding}-padded (e.g. TP rank {rank} forward {seq}: DP "
    "ranks' tokens {tokens}), where SGLang takes no {function}: their rows hold the right values even with the bug")


def route_note(log_text: str, mode: str, function: str, tp: int, failure: str) -> str:
    """The note of :data:`ROUTE_NOTES` whose tag ``failure`` names (a partial sum, or
    another request's rows) on an engine whose captures passed ``function``, with
    :data:`ROUTE_SKIPPED` where some of those forwards did not take it (a decode step
    beside another DP rank's extend is SUM_LEN-padded: the wrong rows are then some
    decode steps only); ``""`` when the failure names neither or no rank logged the route."""
    tag = next((t for t in ROUTE_NOTES if t in failure), None)
    seen = [f for f in forwards(log_text) if f.mode == mode and f.captured and 0 <= f.rank < tp]
    took = [f for f in seen if function in f.routes]
    if tag is None or not took:
        return ""
    ranks = ", ".join(str(r) for r in sorted({f.rank for f in took}))
    layers = _layers([x for f in took for x in f.routes[function][1]])
    note = ROUTE_NOTES[tag].format(function=function, mode=mode, ranks=ranks, where=took[0].routes[function][0],
                                   layers=layers)
    skipped = [f for f in seen if not f.due(function) and function not in f.routes]
    if skipped:
        f = skipped[0]  # the first, as an example
        note += ROUTE_SKIPPED.format(n=len(skipped), mode=mode, padding=f.padding, rank=f.rank, seq=f.seq,
                                     tokens="[" + ",".join(map(str, f.global_tokens)) + "]", function=function)
    return note
