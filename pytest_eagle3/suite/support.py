"""Small helpers shared by the packaged suite's tests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from pytest_eagle3.draft.power import load_examples
from pytest_eagle3.settings import Settings
from pytest_eagle3.target.reference import ensure_reference
from pytest_eagle3.verdicts.evidence import checkpoint_evidence
from pytest_eagle3.verdicts.observation import LATER_CHUNK_UNNUMBERED

if TYPE_CHECKING:
    from pytest_eagle3.engine.recordings import Record
    from pytest_eagle3.target.spec import TargetFacts

#: Relative L2 tolerance for a slot to count as the expected snapshot.  CPU runs
#: in float32: fault-free captures are within 1e-5 of the reference (sglang
#: 0.5.23: at most 8e-6 in the main job; prefill and decode rows of a batched request at TP 2: 4.9e-6 / 5.6e-6),
#: so 1e-4 (over 10x the noise) leaves no room for a capture that is merely
#: close to the right snapshot; the diagnoses match their candidates within it too.  CUDA runs in bf16
#: (engine/cuda/recipe.py): ``benchmarks/bench_tolerance.py`` measured
#: transformers bf16 vs fp32 on tiny-dsv3 (gpu-dsv3 not measured yet; on a
#: GPU runner ``--target gpu-dsv3`` measures it): noise grows with depth from
#: 1.7e-3 (hs[0]) to 0.16 (final_prenorm), while the nearest wrong snapshot is
#: >= 0.71 away and a capture before the MLP all-reduce 0.43-0.46
#: (docs/design.md, "Reduced-layer targets").  0.3 sits between them with
#: about 2x margin on each side.
CPU_TOL = 1e-4
CUDA_TOL = 0.3

NO_CONTINUATIONS = "{draft} ships no continuations.json: replaying the suite prompts for {n} tokens each"
#: Tokens per prompt when the draft ships no continuations (a user's draft).
USER_TOKENS = 32


def acceptance_workload(draft_dir: Path, prompts: Sequence[Sequence[int]]) -> tuple[list, list, list, list | None]:
    """``(names, prompts, max_new_tokens, expected continuations or None)`` of the acceptance
    tests: the prompts the draft learnt (its ``continuations.json``) for exactly their trusted
    continuation lengths, else the suite prompts for :data:`USER_TOKENS` tokens each."""
    examples = load_examples(draft_dir)
    if examples:
        return ([e.name for e in examples], [list(e.prompt) for e in examples],
                [len(e.continuation) for e in examples], [list(e.continuation) for e in examples])
    return ([f"prompt_{i}" for i in range(len(prompts))], [list(p) for p in prompts],
            [USER_TOKENS] * len(prompts), None)


def tolerance(settings: Settings) -> float:
    return CPU_TOL if settings.device == "cpu" else CUDA_TOL


def evidence(checkpoint: Path, prompts: Sequence[Sequence[int]], facts: "TargetFacts", tp: int, *,
             attn_tp: int | None = None, fused_allreduce: bool = False,
             pp_stages: Sequence[tuple[int, int]] = (), tbo_split: int | None = None) -> list:
    """Per prompt, the lazy candidates that let a failing comparison name its bug
    (:func:`pytest_eagle3.verdicts.evidence.checkpoint_evidence`): nothing is
    read or computed unless a slot matches no snapshot.  ``fused_allreduce``:
    the engine fuses its MLP all-reduces into the next norm (``eagle3_capture.fused_allreduce``);
    ``pp_stages``: its pipeline stages' layers (``eagle3_capture.pp_stages``);
    ``tbo_split``: the first layer two-batch overlap splits (:func:`tbo_split`)."""

    return checkpoint_evidence(checkpoint, prompts, tp=tp, vocab_size=facts.vocab_size, attn_tp=attn_tp,
                               fused_allreduce=fused_allreduce, pp_stages=pp_stages, tbo_split=tbo_split)


def tbo_split(server_info: dict | None, facts: "TargetFacts") -> int | None:
    """The first layer a running engine splits into two micro-batches: ``first_k_dense_replace``
    where its server info says ``enable_two_batch_overlap`` (``DeepseekV2Model.forward``,
    0.5.23 ``srt/models/deepseek_v2.py:3166-3173``, which splits only from a
    ``first_k_dense_replace`` inside the layers at PP 1); ``None`` without two-batch
    overlap or without such a layer."""
    first = int(getattr(facts, "first_k_dense_replace", 0) or 0)
    if not (server_info or {}).get("enable_two_batch_overlap") or first <= 0:
        return None
    return first


def returned_rows(cap, ref, ev=None):
    """``(reference rows, evidence)`` at the prompt positions of ``cap.prefill``.

    SGLang returns the last rows of a prompt: all ``T`` of them, the last chunk
    under chunked prefill (the capture engine on cpu chunks the longer
    suite prompts), the uncached tail on a radix-cache hit
    (:mod:`pytest_eagle3.engine.variant_proof`).  ``ref``: ``[L+2, T, H]``;
    ``ev``: a lazy evidence callable or ``None``."""
    T, n = len(cap.prompt), int(cap.prefill.shape[0])
    if n >= T:
        return ref, ev
    return ref[:, T - n:T], (None if ev is None else (lambda: ev().rows(T - n, T)))


def first_position(cap) -> int:
    """The prompt position of ``cap.prefill``'s row 0 (SGLang returns a prompt's last rows)."""
    return max(0, len(cap.prompt) - int(cap.prefill.shape[0]))


def attention_tp(tp: int, server_args: dict | None) -> int:
    """The attention-TP size of an engine: ``tp / attn_dp_size`` under DP attention."""
    args = server_args or {}
    dp = args.get("attn_dp_size") or (args.get("dp_size") if args.get("enable_dp_attention") else None)
    try:
        dp = int(dp) if dp else 1
    except (TypeError, ValueError):
        dp = 1
    return max(1, tp // max(1, dp))


def write_draft_config(directory: Path, ids: Sequence[int] | None, hidden_size: int) -> Path:
    """Write the ``config.json`` a SpecForge/SGLang-style EAGLE-3 draft ships.

    Ids go under ``eagle_config.eagle_aux_hidden_state_layer_ids``, the only key
    SGLang 0.5.23 reads (``srt/model_executor/model_runner_components/
    spec_aux_hidden_state.py``); ``None`` leaves the key out, as a draft that
    declares no ids does.  No weights: the capture tests need none.
    """
    import json

    directory.mkdir(parents=True, exist_ok=True)
    eagle_config: dict = {"use_aux_hidden_state": True}
    if ids is not None:
        eagle_config["eagle_aux_hidden_state_layer_ids"] = list(ids)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "target_hidden_size": hidden_size,
        "num_hidden_layers": 1,
        "eagle_config": eagle_config,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def request_mode(cap, *, repeat: bool = False) -> str:
    """Forward mode of the prefill rows SGLang returned for ``cap``: ``prefill``
    (every row of the prompt, one forward), ``later-chunk`` (fewer rows from a
    fresh send: the last chunk of a chunked prefill), ``cache-hit`` (fewer rows
    from a repeat: the uncached tail after a radix-cache hit)."""
    if int(cap.prefill.shape[0]) >= len(cap.prompt):
        return "prefill"
    return "cache-hit" if repeat else "later-chunk"


def where(req, cap=None, *, path: str, mode: str | None = None, **more: Any) -> dict[str, Any]:
    """The context of a verdict for the run-level diagnosis
    (:class:`pytest_eagle3.verdicts.run_cause.Observation` fields): the path,
    the request's ids, and with ``cap`` its engine, its order there, the batch
    it was sent in, its forward mode (``mode`` overrides :func:`request_mode`) and
    its prefill chunk (``1``: a whole prompt in one forward; the last chunk, its
    number not known; ``0``: not prefill rows; a caller whose rows join a prompt's
    chunks passes ``chunk=CHUNKS_JOINED``; :class:`~pytest_eagle3.verdicts.observation.Observation`)."""
    out: dict[str, Any] = {"path": path, "ids": list(req.ids) if req.ids is not None else None}
    if cap is not None:
        out.update(order=cap.order, engine=cap.engine, mode=mode or request_mode(cap),
                   request=getattr(cap, "index", -1), batch=getattr(cap, "batch", 0))
        out["chunk"] = {"prefill": 1, "later-chunk": LATER_CHUNK_UNNUMBERED}.get(out["mode"], 0)
    elif mode is not None:
        out["mode"] = mode
    out.update(more)
    return out


def row_references(checkpoint: Path, records: "Sequence[Record]", sequences: "dict[str, Sequence[int]]") -> list:
    """Per record, the reference ``[num_hs, rows, H]`` at its positions: computed on
    its :attr:`~pytest_eagle3.engine.recordings.Record.reference` (a verify's tree
    nodes off the accepted path) or on its request's final sequence
    (``sequences``: rid -> tokens); each distinct sequence is computed once."""
    wanted = [tuple(r.reference) or tuple(int(t) for t in sequences[r.rids[0]]) for r in records]
    unique = list(dict.fromkeys(wanted))
    stacks = dict(zip(unique, ensure_reference(checkpoint, [list(u) for u in unique]))) if unique else {}
    return [stacks[w][:, r.positions] for w, r in zip(wanted, records)]
