"""The fault catalog: the faults pytest-eagle3 can inject into SGLang's own
capture path, each with the public report it reproduces, and how an engine's
environment names one.

Readable in the test process (the self-test plan, the report header, the
diagnosis) and inside SGLang's processes, where
:mod:`pytest_eagle3.worker.fault_injection` applies the fault
:data:`FAULT_ENV` names (``PYTEST_EAGLE3_FAULT='{"kind": "partial-sum"}'``).

Options besides ``kind`` (all optional):

* ``rank``: only this TP rank (or these, a list; ``"last"``: TP size - 1) writes
  the faulted capture (default: every rank, as the real bugs did).  Collectives a
  fault needs still run on every rank.
* ``tp``: only engines of this TP size (or these, a list) write it.
* ``slots``: the packed slots a layer fault writes (positions in the packed
  buffer, from 0; default all).
* ``when`` / ``after``: the forwards a layer fault runs in
  (:mod:`pytest_eagle3.worker.fault_when`; the confined kinds of :data:`CONFINED`).

Each kind is one :class:`FaultKind` record in :data:`KINDS`; :data:`CATALOG`,
:data:`CONFINED`, :data:`RUN_LEVEL`, :data:`TEST_TAGS` and the ``NEEDS_*`` tuples
are views of it.

Stdlib only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from pytest_eagle3.worker.env import FAULT_ENV
from pytest_eagle3.worker.fault_when import wanted_modes

#: The run's attributes and flags a kind needs to change anything (:attr:`FaultKind.needs`):
#: ``tp`` TP > 1; ``dp-route`` the ``dp-attention`` variant (TP >= 2, ``--eagle3-slow`` on
#: cpu); ``pp`` pipeline parallelism and the upstream fix that relays each stage's
#: captures; ``tbo`` two-batch overlap (TP >= 2) and the upstream fix that captures per
#: micro-batch, whose merge the kind corrupts; ``inplace-norm`` SGLang's norms in place
#: (the CPU tier's ``--eagle3-cpu-norm inplace``, every GPU and Xeon AMX server);
#: ``fused-allreduce`` the MLP all-reduce fused into the next norm (the CPU tier's
#: ``--eagle3-cpu-allreduce-fusion``, Hopper/Blackwell at TP > 1); ``tree`` the token-tree
#: speculative shape (``acceptance-tree``, ``--eagle3-slow`` on cpu; engine/spec_shapes.py).
NEEDS = ("tp", "dp-route", "pp", "tbo", "inplace-norm", "fused-allreduce", "tree")
#: :attr:`FaultKind.named` default: the kind's own name.
OWN_NAME = "<own name>"


@dataclass(frozen=True)
class FaultKind:
    """Everything the catalog knows about one fault kind, in one record.

    Attributes:
        name: the kind, as :data:`FAULT_ENV` names it.
        what: what SGLang then captures.
        source: the public report it reproduces (a PR or issue number where one exists).
        needs: what the run needs for the kind to change anything (:data:`NEEDS`).
        confined: ``(the kind whose computation it runs, its options)`` for a kind
            confined to some forwards: ``when`` ``cache-hit`` (an extend forward of a
            request whose first prefill reused a cached prefix), ``later-chunk`` (a
            request's second or later extend forward), ``decode-verify`` (decode and
            target-verify forwards); ``after`` N (forwards after the process's Nth);
            ``rank: "last"`` TP size - 1.
        run_level: the tag the run-level diagnosis must name
            (:mod:`pytest_eagle3.verdicts.run_cause`): its evidence lies across tests
            (which modes, ranks, requests or levels passed).
        named: the tag a failing test's own diagnosis names (``None``: no single test
            can; only the run-level diagnosis does).  Default: the kind's name.
    """

    name: str
    what: str
    source: str
    needs: frozenset[str] | set[str] = frozenset()
    confined: tuple[str, dict[str, Any]] | None = None
    run_level: str | None = None
    named: str | None = OWN_NAME

    @property
    def tag(self) -> str | None:
        """What a test's diagnosis names: a confined kind by the computation it runs."""
        if self.confined is not None:
            return self.confined[0]
        return self.name if self.named == OWN_NAME else self.named


#: Every kind, in catalog order (:data:`CATALOG`; the self-test runs them sorted by name).
KINDS: tuple[FaultKind, ...] = (
    FaultKind(
        "offset-twice",
        "every captured layer one later: +1 applied again to layers_to_capture after "
        "DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",
        "SGLang PR #25454 (+1 offset applied twice / on the wrong id lists)",
    ),
    FaultKind(
        "offset-missing",
        "every captured layer one earlier: the +1 id offset not applied",
        "SGLang PR #25454 (+1 offset not applied)",
    ),
    FaultKind(
        "ids-ignored",
        "layers_to_capture reset to SGLang's default [2, L//2, L-3] whatever ids were configured",
        "SGLang PR #22836; vLLM PR #50170 (configured aux layer ids ignored)",
    ),
    FaultKind(
        "reversed-order",
        "the packer writes the K captures into the packed tensor in reverse slot order",
        "slots concatenated out of order / in reverse on one path",
    ),
    FaultKind(
        "normalized-input",
        "a slot holds input_layernorm of the captured layer's input (the normalized attention input) "
        "instead of the residual stream",
        "normalized layer input captured instead of the residual stream",
    ),
    FaultKind(
        "no-residual",
        "a slot holds the previous layer's MLP output without the residual (hidden_states of the split "
        "(hidden_states, residual) stream)",
        "vLLM PR #14464 (aux states captured without the residual)",
    ),
    FaultKind(
        "unreduced-embedding",
        "the embedding slot holds this rank's vocab shard of the embedding (rows of other shards zero): "
        "VocabParallelEmbedding's output before its all-reduce",
        "embedding captured from a rank's own vocab shard without the all-reduce",
        needs={"tp"},
    ),
    FaultKind(
        "partial-sum",
        "a slot holds the post-attention residual plus this rank's unreduced MLP output: the stream read "
        "before the MLP all-reduce completed",
        "SGLang PR #28343 (all-reduce fusion deferred the MLP all-reduce past the capture)",
        needs={"tp"},
    ),
    FaultKind(
        "dp-gather-scaled",
        "captured slots summed over the attention-TP group, whose ranks hold the same rows: each slot "
        "scaled by the attention-TP size",
        "SGLang issue #31699 (DP gather scaled states by the attention-TP size)",
        needs={"tp"},
    ),
    FaultKind(
        "aliased-capture",
        "each capture keeps the storage it was handed instead of a copy (AuxHiddenStatePacker.append / "
        "AuxHiddenStateList.capture as if owned=True): a slot holds whatever a later in-place norm wrote "
        "into the residual tensor by the end of the forward",
        "SGLang PR #39286 (Gemma 4 captures share storage with the next layer's in-place residual "
        "update); issue #27540",
        needs={"inplace-norm"},
    ),
    FaultKind(
        "before-fused-allreduce",
        "where SGLang's own gate (flashinfer_ar_fusion_applies) fuses the MLP all-reduce into the next "
        "layer's all-reduce + residual add + RMSNorm, a capturing layer reads the stream before that "
        "fused all-reduce: the post-attention residual plus this rank's unreduced MLP share",
        "SGLang PR #28343 (Kimi-K2.5 captures taken before the fused all-reduce)",
        needs={"tp", "fused-allreduce"},
    ),
    FaultKind(
        "partial-before-dp-reduce-scatter",
        "under attention DP, in a forward whose MoE output returns through dp_reduce_scatter (decode: "
        "max-len padding), a capturing layer reads the stream before that reduce-scatter completes: the "
        "post-attention residual plus this rank's unreduced MoE share on its own rows",
        "the bug class of SGLang PR #28343 (a capture read before its reduction completes) on attention "
        "DP's reduce-scatter route (layer_boundary/exit.py _select_dp_reduce_scatter)",
        needs={"tp", "dp-route"},
        named="partial-sum",
    ),
    FaultKind(
        "other-rank-slice-after-dp-reduce-scatter",
        "under attention DP, in a decode forward whose MoE output returns through dp_reduce_scatter with "
        "equal token counts on every DP rank, each capturing layer after the reduce-scatter holds the "
        "slice the next rank got: the complete states of another DP rank's requests",
        "the class of SGLang issue #26163 (a batch's hidden states attributed to the wrong request) on "
        "attention DP's reduce-scatter route (dp_attention.py dp_reduce_scatter_tensor: chunk r to rank r)",
        needs={"tp", "dp-route"},
        named="wrong-request-rows",
    ),
    FaultKind(
        "wrong-request-rows",
        "in a decode forward of >= 2 requests, request j's rows hold request j+1's (cyclic)",
        "SGLang issue #26163 (a batch's hidden states attributed to the wrong request)",
    ),
    FaultKind(
        "no-residual-on-cache-hit",
        "no-residual, only in prefill forwards that extend a prefix the radix cache held (the "
        "cached-prefix path captures without the residual; fresh prefills, later chunks and decode are "
        "right)",
        "a capture bug confined to radix-cache hits (the cached-prefix extend path)",
        confined=("no-residual", {"when": "cache-hit"}),
        run_level="path-only",
    ),
    FaultKind(
        "no-residual-on-later-chunk",
        "no-residual, only in the second and later chunks of a chunked prefill (the first chunk, "
        "unchunked prompts and decode are right)",
        "SGLang PR #26329 (a chunk-boundary capture bug)",
        confined=("no-residual", {"when": "later-chunk"}),
        run_level="path-only",
    ),
    FaultKind(
        "partial-sum-on-rank-decode",
        "partial-sum on the last TP rank only, only in decode and verify forwards (prefill and the other "
        "ranks are right)",
        "a capture bug confined to one TP rank's decode/verify path",
        needs={"tp"},
        confined=("partial-sum", {"when": "decode-verify", "rank": "last"}),
        run_level="rank-mode",
    ),
    FaultKind(
        "stale-no-residual",
        "no-residual, only after each SGLang process has run its first 14 model forwards (the first "
        "requests on an engine are right, every later one wrong)",
        "a capture bug that appears after an engine has served some forwards (state that goes stale)",
        confined=("no-residual", {"after": 14}),
        run_level="stale-state",
    ),
    FaultKind(
        "half-precision-copy",
        "the packed captures rounded through float16 and back (AuxHiddenStatePacker.finalize): every slot"
        " the right snapshot, off by a float16 round trip",
        "captures kept or sent in a lower precision than the target computes in",
        run_level="precision",
        named="precision",
    ),
    FaultKind(
        "draft-fc-reversed",
        "the served draft reads its aux hidden states in reverse slot order before its fc "
        "(llama_eagle3.LlamaModel.forward); the target's captures are right",
        "a draft-side consumer bug: the fc input concatenated in another order than the draft was trained"
        " on",
        run_level="draft-side",
        named=None,
    ),
    FaultKind(
        "tree-order-aux",
        "after a token-tree verify the accepted path's KV slots and predicted tokens move to the front of each "
        "request's block but its aux hidden states stay in tree order (eagle_worker_common."
        "_finalize_accept_tree_path leaves logits_output.hidden_states as verified): the draft reads tree nodes "
        "off the accepted path",
        "SGLang issue #37949 (capture output left in tree order); PR #15360 (the compaction a dense-prefix "
        "pipeline needs at top-k > 1)",
        needs={"tree"},
        named="tree-order",
    ),
    FaultKind(
        "chunk-seam-prediction",
        "at the end of a prefill chunk that is not the prompt's last the draft is fed the target's prediction "
        "instead of the next prompt token (eagle_worker_v2._eagle_prefill_tail_tokens as before PR #26800)",
        "SGLang issue #26329, fixed by PR #26800 (chunked-prefill chain consistency)",
        needs={"tree"},
        named="chunk-seam",
    ),
    FaultKind(
        "pp-earlier-stage-zeroed",
        "at pipeline parallelism, the captures an earlier stage relays to the next are sent as zeros "
        "(needs the pp-capture-relay upstream fix, which relays them; --eagle3-pp 2)",
        "SGLang issue #39634 (earlier pipeline stages' layers lost from the captures)",
        needs={"pp"},
        named="pp-earlier-stage",
    ),
    FaultKind(
        "tbo-microbatch-dropped",
        "under two-batch overlap, the second micro-batch's rows of every split layer's capture are left "
        "as zeros when the two are merged (needs the tbo-capture-per-microbatch upstream fix, which "
        "merges them)",
        "SGLang PR #32680 (per-micro-batch capture under TBO: a micro-batch lost from the merge)",
        needs={"tbo"},
    ),
    FaultKind(
        "tbo-microbatches-swapped",
        "under two-batch overlap, the micro-batches' captures are merged in the wrong order: the second "
        "micro-batch's rows first (needs the tbo-capture-per-microbatch upstream fix)",
        "SGLang PR #32680 (per-micro-batch capture under TBO: merged out of token order)",
        needs={"tbo"},
    ),
)
BY_NAME: dict[str, FaultKind] = {k.name: k for k in KINDS}

# Views of :data:`KINDS` (read by the self-test plan, the injection and the tests).
#: kind -> (what SGLang then captures, the public report it reproduces).
CATALOG: dict[str, tuple[str, str]] = {k.name: (k.what, k.source) for k in KINDS}
#: Kinds confined to some forwards: kind -> :attr:`FaultKind.confined`.
CONFINED: dict[str, tuple[str, dict[str, Any]]] = {k.name: k.confined for k in KINDS if k.confined}
#: Kinds the run-level diagnosis must name: kind -> its tag.
RUN_LEVEL: dict[str, str] = {k.name: k.run_level for k in KINDS if k.run_level}
#: Per-test tags of kinds that are not a diagnosis kind of their own.
TEST_TAGS: dict[str, str | None] = {k.name: k.named for k in KINDS if k.named != OWN_NAME}


def named_as(kind: str) -> str | None:
    """The tag a test's diagnosis names for ``kind`` (:attr:`FaultKind.tag`): a
    confined kind is named by the computation it runs (``no-residual``); which path
    it is confined to is what the run's evidence across paths shows
    (:data:`RUN_LEVEL`), not one test's captures.  ``None``: no test can name it
    alone (a draft-side fault)."""
    return BY_NAME[kind].tag if kind in BY_NAME else kind


def _needing(need: str) -> tuple[str, ...]:
    return tuple(k.name for k in KINDS if need in k.needs)


NEEDS_TP = _needing("tp")
NEEDS_DP_ROUTE = _needing("dp-route")
NEEDS_PP = _needing("pp")
NEEDS_TBO = _needing("tbo")
NEEDS_INPLACE_NORM = _needing("inplace-norm")
NEEDS_FUSED_ALLREDUCE = _needing("fused-allreduce")
NEEDS_TREE = _needing("tree")


class FaultError(RuntimeError):
    """A fault that cannot be applied as asked (unknown kind, bad JSON)."""


def read_fault(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The fault :data:`FAULT_ENV` asks for, or ``None`` when unset or empty.

    Raises:
        FaultError: not JSON / not a known kind.
    """
    raw = (os.environ if env is None else env).get(FAULT_ENV, "").strip()
    if not raw:
        return None
    if raw.startswith("{"):
        try:
            fault = json.loads(raw)
        except ValueError as exc:
            raise FaultError(f"{FAULT_ENV}={raw!r} is not JSON: {exc}") from None
        if not isinstance(fault, dict):
            raise FaultError(f"{FAULT_ENV}={raw!r} must be a JSON object")
    else:
        fault = {"kind": raw}
    kind = fault.get("kind")
    if kind not in CATALOG:
        raise FaultError(f"{FAULT_ENV}: unknown fault kind {kind!r}; known: {', '.join(CATALOG)}")
    try:
        wanted_modes(fault)
    except ValueError as exc:
        raise FaultError(f"{FAULT_ENV}: {exc}") from None
    return fault


def describe(fault: dict[str, Any]) -> str:
    """One line for logs and report headers: ``partial-sum: ... [SGLang PR #28343 (...)]``."""
    what, source = CATALOG[fault["kind"]]
    extra = {k: v for k, v in fault.items() if k != "kind"}
    return f"{fault['kind']}{' ' + json.dumps(extra) if extra else ''}: {what} [{source}]"
