"""Check that an EAGLE-3 draft directory can serve a target, before any engine starts.

Reads ``config.json`` and the safetensors headers only (no torch, no weights), and
applies the rules of SGLang 0.5.23's ``LlamaForCausalLMEagle3``
(``sglang/srt/models/llama_eagle3.py``) and its worker
(``sglang/srt/speculative/eagle_worker_v2.py::init_lm_head``):

* ``fc.weight`` is ``[hidden_size, K * target_hidden_size]`` with ``K`` from
  ``num_aux_hidden_states`` or the ``eagle_config`` ids (default 3); a checkpoint
  whose ``fc`` disagrees fails to load (``default_weight_loader`` asserts shapes);
* ``target_hidden_size`` (default ``hidden_size``) must be the target's hidden size:
  it is the width of each captured aux slot;
* ``hidden_size != target_hidden_size`` means SGLang does not share the target
  embedding (``sglang/srt/models/llama.py::LlamaForCausalLM.set_embed`` returns
  early): the draft must carry ``embed_tokens.weight``;
* ``draft_vocab_size`` unset: SGLang binds the target's ``lm_head``
  (``load_lm_head_from_target``), none needed; set: the draft's ``lm_head.weight``
  ``[draft_vocab_size, hidden_size]`` is required, and a draft vocabulary smaller
  than the target's needs ``d2t`` ``[draft_vocab_size]`` (``hot_token_id = d2t + arange``,
  the target id of each draft id);
* the decoder layer's tensors must have the shapes the config implies
  (``q/k/v_proj`` read ``2 * hidden_size``).

Names are matched as SGLang's ``load_weights`` matches them: ``midlayer`` = ``layers.0``,
an optional ``model.`` prefix.

The MLA draft (``Eagle3DeepseekV2ForCausalLM``, ``sglang/srt/models/kimi_k25_eagle3.py``)
is checked the same way against its own layout (:meth:`DraftConfig.shapes`): its
``fc_norm.{k}.weight`` when the config sets ``fc_norm``, its MLA tensors, and its
MLA widths against the target's (``kv_lora_rank``, ``qk_rope_head_dim``: the layout
shares the target's MLA so its KV cache has the target's shape, the file's docstring).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pytest_eagle3.contracts.draft import BAD_CONFIG_MSG, NO_DIR_MSG, read_draft_config
from pytest_eagle3.contracts.fc_weight import read_safetensors_header
from pytest_eagle3.draft.config import ARCHITECTURE, ARCHITECTURES, FC, LM_HEAD, MLA_ARCHITECTURE, DraftConfig
from pytest_eagle3.sglang_source.id_keys import DRAFT_FILES, EAGLE_FLAGS, flags_read
from pytest_eagle3.errors import Eagle3ContractError


class Eagle3DraftError(Eagle3ContractError):
    """An EAGLE-3 draft directory cannot serve the target: its config and weights
    disagree, it was made for another hidden size or vocabulary, or a tensor
    SGLang needs is missing. The message is one line naming the file and the fix."""


NOT_EAGLE3_MSG = (
    "draft config {path} has architectures {arch}; SGLang loads an EAGLE-3 draft as "
    "['" + ARCHITECTURE + "'] or ['" + MLA_ARCHITECTURE + "']"
)
SPECULATORS_FORMAT_MSG = (
    "draft config {path} is in speculators format (architectures {arch}, speculators_config): SGLang cannot "
    "load it (no model class for it); convert it: architectures ['" + ARCHITECTURE + "'], the "
    "transformer_layer_config fields ({fields}) at the top level, draft_vocab_size {dv}, target_hidden_size "
    "{th}, and its ids {ids} under eagle_config.eagle_aux_hidden_state_layer_ids, the key SGLang reads "
    "(speculators trained id v as hs[v]; pytest-eagle3 inspect --draft on the converted directory checks it)"
)
MLA_WIDTH_MSG = (
    "MLA draft {path}: config.json {key} = {draft}, but the target's {key} is {target}; "
    "the MLA draft shares the target's MLA layout: rebuild it with the target's widths"
)
MLA_FIELD_MSG = "MLA draft {path}: config.json lacks {key} (an integer width of its MLA attention)"
FLAG_IGNORED_MSG = (
    "draft config {path} sets {flag}, which {arch} in this SGLang never reads ({file}): it would serve the "
    "draft without it, unlike its training; serve it where {flag} is implemented or retrain without it"
)
FC_NORM_WHY = "config.json sets fc_norm, so SGLang builds one RMSNorm per aux slot before fc"
NO_WEIGHTS_MSG = "draft directory {path} has no *.safetensors weights"
MISSING_MSG = "draft {path} lacks {name}: {why}"
SHAPE_MSG = "draft {path}: {name} has shape {shape}, but config.json implies {expected} ({why})"
HIDDEN_MSG = (
    "draft {path} was made for target hidden size {draft} (its target_hidden_size), "
    "but the target has hidden size {target}: it needs a draft trained on this target"
)
VOCAB_MSG = (
    "draft {path} predicts {draft} tokens without a d2t map, but the target vocabulary has "
    "{target}: add d2t [draft_vocab_size] (draft id -> target id offset) or use the target vocabulary"
)
BIG_VOCAB_MSG = "draft {path}: draft_vocab_size {draft} exceeds the target vocabulary {target}"


def normalise(name: str) -> str:
    """A weight name as this package writes it: ``model.`` dropped, ``layers.0`` -> ``midlayer``."""
    if name.startswith("model."):
        name = name[len("model."):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every tensor in the directory's safetensors files (names normalised).

    Raises:
        Eagle3DraftError: no safetensors file.
        Eagle3ContractError: an unreadable safetensors header.
    """
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise Eagle3DraftError(NO_WEIGHTS_MSG.format(path=path))
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        for name, info in read_safetensors_header(file).items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            shapes[normalise(name)] = tuple(int(d) for d in info.get("shape", ()))
    return shapes


def read_config(path: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a draft directory.

    Raises:
        Eagle3DraftError: missing, unreadable or not a JSON object.
    """
    return read_draft_config(path, Eagle3DraftError)


def speculators_format(cfg_file: Path, raw: dict[str, Any]) -> str:
    """The one-line conversion advice for a speculators-format config (speculators
    0.9.0 ``models/eagle3/config.py``: ``Eagle3SpeculatorConfig`` writes
    ``architectures ["Eagle3Speculator"]``, ``speculators_config``,
    ``transformer_layer_config`` and the ids at the top level; SGLang 0.5.23 has no
    model class for it)."""
    tlc = raw.get("transformer_layer_config") if isinstance(raw.get("transformer_layer_config"), dict) else {}
    keys = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                        "head_dim", "rms_norm_eps", "rope_theta", "vocab_size") if k in tlc]
    ids = raw.get("eagle_aux_hidden_state_layer_ids")
    return SPECULATORS_FORMAT_MSG.format(
        path=cfg_file, arch=raw.get("architectures"), fields=", ".join(keys) or "none given",
        dv=raw.get("draft_vocab_size"), th=raw.get("target_hidden_size") or tlc.get("hidden_size"),
        ids=list(ids) if isinstance(ids, list) else "(none: speculators' default [2, L//2, L-3])")


def validate_draft(path: str | Path, target_hidden_size: int, target_vocab_size: int, *,
                   target_mla: Mapping[str, int | None] | None = None,
                   sglang_location: str | Path | None = None) -> DraftConfig:
    """Check a draft directory against a target; return its :class:`DraftConfig`.

    Args:
        path: the draft directory (``config.json`` + ``*.safetensors``).
        target_hidden_size: the target's ``hidden_size``.
        target_vocab_size: the target's ``vocab_size``.
        target_mla: the target's MLA widths (``kv_lora_rank``, ``qk_rope_head_dim``;
            None values are not checked), compared with an MLA draft's.
        sglang_location: the installed ``sglang`` package: an EAGLE-3 flag the
            config sets (``norm_before_fc``, ``fc_norm``, ``norm_output``, ...)
            that its draft model file never reads is refused
            (:func:`pytest_eagle3.sglang_source.id_keys.flags_read`).

    Raises:
        Eagle3DraftError: (one line) not a directory, no/bad config, not an EAGLE-3
            architecture, another target hidden size, ``fc`` or a layer tensor whose
            shape disagrees with the config, ``lm_head`` or ``d2t`` or
            ``embed_tokens`` missing where SGLang needs it, a vocabulary that does
            not map onto the target's.
    """
    p = Path(path)
    if not p.is_dir():
        raise Eagle3DraftError(NO_DIR_MSG.format(path=p))
    raw = read_config(p)
    cfg_file = p / "config.json"
    arch = raw.get("architectures") or []
    if "speculators_config" in raw or "speculators_model_type" in raw:
        raise Eagle3DraftError(speculators_format(cfg_file, raw))
    if not any(a in ARCHITECTURES for a in arch):
        raise Eagle3DraftError(NOT_EAGLE3_MSG.format(path=cfg_file, arch=arch))
    if MLA_ARCHITECTURE in arch:
        for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = raw.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise Eagle3DraftError(MLA_FIELD_MSG.format(path=p, key=key))
        for key, target in (target_mla or {}).items():
            if target is not None and raw.get(key) != target:
                raise Eagle3DraftError(MLA_WIDTH_MSG.format(path=p, key=key, draft=raw.get(key), target=target))
    if sglang_location is not None:
        model = next(a for a in arch if a in ARCHITECTURES)
        read = flags_read(sglang_location, model)
        eagle = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
        for flag in EAGLE_FLAGS:
            if read is not None and flag not in read and (raw.get(flag) or eagle.get(flag)):
                raise Eagle3DraftError(FLAG_IGNORED_MSG.format(path=cfg_file, flag=flag, arch=model,
                                                               file=DRAFT_FILES[model]))
    try:
        cfg = DraftConfig.from_hf_config(raw)
    except (KeyError, TypeError, ValueError) as exc:
        error = f"missing or bad key {exc}"
        raise Eagle3DraftError(BAD_CONFIG_MSG.format(path=cfg_file, error=error)) from None
    if cfg.target_hidden_size != target_hidden_size:
        raise Eagle3DraftError(
            HIDDEN_MSG.format(path=p, draft=cfg.target_hidden_size, target=target_hidden_size)
        )
    shapes = tensor_shapes(p)

    def check(name: str, expected: tuple[int, ...], why: str) -> None:
        if name not in shapes:
            raise Eagle3DraftError(MISSING_MSG.format(path=p, name=name, why=why))
        if shapes[name] != tuple(expected):
            raise Eagle3DraftError(SHAPE_MSG.format(
                path=p, name=name, shape=list(shapes[name]), expected=list(expected), why=why))

    expected = {normalise(name): shape for name, shape in cfg.shapes().items()}
    check(FC, expected[FC], f"hidden_size {cfg.hidden_size} x {cfg.num_aux} aux slots of "
          f"target_hidden_size {cfg.target_hidden_size}")
    layer_why = (f"one decoder layer of hidden_size {cfg.hidden_size}, "
                 f"{cfg.num_attention_heads} heads of {cfg.head_dim}, MLP {cfg.intermediate_size}")
    for name, shape in expected.items():
        if name.startswith("fc_norm."):
            check(name, shape, FC_NORM_WHY)
        elif name not in (FC, LM_HEAD):
            check(name, shape, layer_why)
    if cfg.hidden_size != cfg.target_hidden_size:
        check("embed_tokens.weight", (target_vocab_size, cfg.hidden_size),
              "hidden_size != target_hidden_size, so SGLang does not share the target embedding")
    own_head = raw.get("draft_vocab_size") is not None and not raw.get("tie_word_embeddings", False)
    if not own_head:
        # SGLang binds the target's lm_head: the config's vocabulary must be the target's.
        if cfg.vocab_size != target_vocab_size:
            raise Eagle3DraftError(VOCAB_MSG.format(path=p, draft=cfg.vocab_size, target=target_vocab_size))
        return cfg
    dv = cfg.draft_vocab_size
    if dv > target_vocab_size:
        raise Eagle3DraftError(BIG_VOCAB_MSG.format(path=p, draft=dv, target=target_vocab_size))
    check(LM_HEAD, (dv, cfg.hidden_size),
          f"draft_vocab_size {dv} is set, so SGLang uses the draft's own lm_head")
    if dv < target_vocab_size:
        if "d2t" not in shapes:
            raise Eagle3DraftError(VOCAB_MSG.format(path=p, draft=dv, target=target_vocab_size))
        check("d2t", (dv,), "one target-id offset per draft id")
    return cfg
