"""What an engine that died under two-batch overlap (TBO) means: ``[tbo-no-a2a]`` and
``[tbo-uncaptured]``.

``[tbo-no-a2a]``: ``--enable-two-batch-overlap`` with DP attention and no EP
all-to-all backend (``moe_a2a_backend`` ``none``) passes SGLang's startup check on
DeepSeek-V3, and the server takes the TBO path at its first forward.  Measured on
0.5.23 at TP 2 on CPU: every DP rank splits its batch into two micro-batches (the
worker's proof line, :mod:`pytest_eagle3.worker.tbo_proof`) and dies in the first
micro-batch's DP gather, ``TypeError: object of type 'NoneType' has no len()``
(``srt/layers/dp_attention.py:92``), because the micro-batches carry no per-rank
token counts and DeepSeek's TBO operations are written for an EP all-to-all
backend (:mod:`pytest_eagle3.sglang_source.tbo_code`).

``[tbo-uncaptured]``: with an EP all-to-all backend (DeepEP; on CPU its stand-in,
:mod:`pytest_eagle3.worker.cpu.deepep`) the TBO forward runs through, and the
layers from ``first_k_dense_replace`` on are never captured: measured on 0.5.23,
the packer raises ``RuntimeError: captured 1 of 3 aux hidden states``
(``srt/layers/aux_hidden_states.py:87``) at the first TBO forward, prefill or
decode, and the engine dies.

:func:`explain_start` turns either death into one message: what it is, the TBO
path that ran, what it died of, and the installed lines that make it so.
Nothing here imports torch or sglang.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pytest_eagle3.sglang_source.tbo_code import CAPTURE_PR, read_tbo_code
from pytest_eagle3.worker.tbo_proof import PROOF

if TYPE_CHECKING:
    from pytest_eagle3.engine.config import EngineConfig

#: The frame every TBO forward of DeepSeek's layers passes (0.5.23 ``two_batch_overlap.py``).
TBO_FRAME = "model_forward_stages"
#: That frame in a Python traceback (not the proof line, which names the function too).
_TBO_FRAME_LINE = re.compile(r'File "[^"]*two_batch_overlap\.py", line \d+, in ' + TBO_FRAME + r"\b")

#: The cause a failed start under TBO is grouped by (the same for every engine it stops).
TBO_NO_A2A_CAUSE = ("[tbo-no-a2a] two-batch overlap without an EP all-to-all backend dies in its "
                    "micro-batches' DP gather ({counts})")
TBO_NO_A2A = (
    "[tbo-no-a2a] two-batch overlap with DP attention and no EP all-to-all backend (moe_a2a_backend "
    "none) cannot run on this SGLang: its engine died at its first TBO forward. This is a limit of "
    "SGLang's TBO path, not a capture defect; the captures under TBO were never reached.\n"
    "  proof: {ran}\n"
    "  what it died of: {cause}\n"
    "  why (read from the installed files): the micro-batches carry no per-rank token counts ({counts}) "
    "that DP attention's gather reads, and DeepseekV2MoE's TBO operations dispatch only through an EP "
    "all-to-all backend ({ep}; {gate}); SGLang's startup check accepts this configuration ({check})\n"
    "  to run TBO: DeepSeek-V3 runs it with --moe-a2a-backend deepep (or mooncake, nixl, mori), as the "
    "two-batch-overlap path variant does: --eagle3-sglang-arg moe_a2a_backend=deepep --eagle3-sglang-arg "
    "deepep_dispatcher_output_dtype=bf16 (on cpu through pytest-eagle3's DeepEP stand-in){gap}"
)

#: The capture gap behind the crash, read from the installed file.
GAP = ("\n  behind it (read, not run): {stages} hands the layers from first_k_dense_replace on to "
       "two-batch overlap without the capture argument{packer}, so those layers would not be captured ({pr})")
GAP_PACKER = " and the micro-batches get no packer ({where})"


#: The cause a death under TBO with an all-to-all backend is grouped by.
TBO_UNCAPTURED_CAUSE = ("[tbo-uncaptured] under two-batch overlap the layers from first_k_dense_replace on are "
                        "never captured ({stages})")
TBO_UNCAPTURED = (
    "[tbo-uncaptured] under two-batch overlap, layers from first_k_dense_replace={first} on run in "
    "model_forward_stages without the capture argument ({stages}){packer}: {ids_text}, so {outcome} at the "
    "first TBO forward; the engine died and no capture under TBO was returned. This is SGLang's capture gap "
    "({pr}), not the draft's or the reference's.\n"
    "  proof: {ran}\n"
    "  what it died of: {cause}\n"
    "  the fix: PYTEST_EAGLE3_UPSTREAM_FIX=tbo-capture-per-microbatch (each micro-batch captures its own "
    "token rows, merged in token order) turns this path green (docs/checks.md#two-batch-and-single-batch-overlap)"
)
_SHORT = re.compile(r"captured (?P<got>\d+) of (?P<want>\d+) aux hidden states")
#: No capture at all: the model returns its hidden states alone, which the caller unpacks as a pair.
_UNPACKED = re.compile(r"(not enough|too many) values to unpack .*deepseek_v2\.py")
SHORT_OUTCOME = "SGLang's packer got {got} of {want} captures and raised"
EMPTY_OUTCOME = ("SGLang's packer got none, DeepseekV2Model.forward returned its hidden states without aux "
                 "hidden states, and DeepseekV2ForCausalLM.forward failed to unpack them as a pair")


def _first_split_layer(log_text: str) -> int | None:
    firsts = {int(m["first"]) for m in PROOF.finditer(log_text)}
    return min(firsts) if firsts else None


def explain_uncaptured(config: "EngineConfig", cause: str, log_text: str,
                       sglang_location: str) -> tuple[str, str] | None:
    """``(cause, line)`` for an engine with two-batch overlap and an EP all-to-all backend whose
    packer came up short (``RuntimeError: captured 1 of 3 aux hidden states``,
    ``srt/layers/aux_hidden_states.py``) or empty (the caller's unpacking of the model's
    output fails in ``deepseek_v2.py``) after a forward the workers proved took TBO: the
    ``[tbo-uncaptured]`` line; ``None`` otherwise (no proof line, another cause, an SGLang
    whose ``model_forward_stages`` call passes a capture argument).

    Measured on 0.5.23 at TP 2 on CPU through the DeepEP stand-in
    (:mod:`pytest_eagle3.worker.cpu.deepep`), ``first_k_dense_replace`` 1: ids ``[0, 3, 5]``
    give "captured 1 of 3" at the first TBO forward; SGLang's default ids (none before
    layer 1) give ``ValueError: not enough values to unpack (expected 2, got 1)``
    (``deepseek_v2.py:3419``)."""
    short, empty = _SHORT.search(cause), _UNPACKED.search(cause)
    first = _first_split_layer(log_text)
    if (short is None and empty is None) or first is None:
        return None
    code = read_tbo_code(sglang_location)
    if code.stages_capture is not False or code.stages_call is None:
        return None
    ids = list(dict(config.server_args).get("return_aux_hidden_state_layer_ids") or ())
    split = [i for i in ids if i >= first]
    named = " and ".join(map(str, split)) if len(split) < 3 else ", ".join(map(str, split))
    if split:
        ids_text = (f"id{'s' if len(split) > 1 else ''} {named} of {ids} lie{'' if len(split) > 1 else 's'} at "
                    f"or after layer {first}")
    elif short is not None:
        ids_text = f"{int(short['want']) - int(short['got'])} of the asked-for layers lie at or after it"
    else:
        ids_text = f"every asked-for layer lies at or after layer {first}"
    outcome = SHORT_OUTCOME.format(**short.groupdict()) if short is not None else EMPTY_OUTCOME
    packer = (" and the micro-batches get no packer " f"({code.children_packer})") if code.children_packer else ""
    line = TBO_UNCAPTURED.format(first=first, stages=code.stages_call, packer=packer, ids_text=ids_text,
                                 outcome=outcome, pr=CAPTURE_PR, ran=proof_text(log_text), cause=cause)
    return TBO_UNCAPTURED_CAUSE.format(stages=code.stages_call), line


def proof_text(log_text: str) -> str:
    """``"the TBO path ran: EXTEND 12 tokens -> 6 + 6 (layers 1-5); IDLE ..."`` from the
    workers' proof lines, or ``"the TBO path ran (model_forward_stages in the traceback)"``."""
    seen: dict[tuple[str, str, str], None] = {}
    for m in PROOF.finditer(log_text):
        seen.setdefault((m["mode"], f"{m['tokens']} token{'' if m['tokens'] == '1' else 's'} -> "
                         f"{m['a']} + {m['b']}",
                         f"layers {m['first']}-{m['last']}"), None)
    if not seen:
        return f"the TBO path ran ({TBO_FRAME} in the traceback)"
    parts = [f"{mode} {split}" for mode, split, _ in seen]
    layers = sorted({layers for _, _, layers in seen})
    return f"the TBO path ran ({'; '.join(parts)}; {', '.join(layers)} in {TBO_FRAME})"


def explain_start(config: "EngineConfig", cause: str | None, log_text: str,
                  sglang_location: str | None) -> tuple[str, str] | None:
    """``(cause, line)`` for an engine under two-batch overlap that died of ``cause`` (at start or
    under a request): the cause the run groups such deaths by and the message.

    With an EP all-to-all backend: :func:`explain_uncaptured` (``[tbo-uncaptured]``).  Without
    one, a traceback through :data:`TBO_FRAME` (a frame line, not the proof line) and a cause
    in ``dp_attention.py``: :data:`TBO_NO_A2A_CAUSE` and the ``[tbo-no-a2a]`` line.  ``None``
    otherwise (another configuration, another failure, an SGLang whose files read otherwise)."""
    args = dict(config.server_args)
    a2a = str(args.get("moe_a2a_backend") or "none").lower()
    if not args.get("enable_two_batch_overlap") or not cause or not sglang_location:
        return None
    if a2a != "none":
        return explain_uncaptured(config, cause, log_text, sglang_location)
    if not _TBO_FRAME_LINE.search(log_text) or "dp_attention.py" not in cause:
        return None
    try:
        code = read_tbo_code(sglang_location)
    except Exception:  # noqa: BLE001 - unreadable files: no explanation, the cause stands
        return None
    if not code.needs_a2a or code.children_counts is None:
        return None
    line = TBO_NO_A2A.format(ran=proof_text(log_text), cause=cause, counts=code.children_counts,
                             ep=code.ep_size_a2a, gate=f"{code.dispatch_gate}: {code.dispatch_gate.text}",
                             check=code.check or "check_two_batch_overlap",
                             gap=GAP.format(stages=code.stages_call, pr=CAPTURE_PR, packer=GAP_PACKER.format(
                                 where=code.children_packer) if code.children_packer else "")
                             if code.stages_capture is False else "")
    return TBO_NO_A2A_CAUSE.format(counts=code.children_counts), line
