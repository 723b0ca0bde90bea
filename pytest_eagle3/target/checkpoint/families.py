"""The model families a target preset can have besides DeepSeek-V3, as plain data.

Each :class:`Family` says, for one Hugging Face ``model_type``, where the
distinguishable-layers init of docs/design.md,
"Reduced-layer targets that can tell layers apart", finds what it needs in the
transformers model of that family (read from transformers 5.19's
``models/<family>/modeling_*.py``):

* ``mid_norm``: the norm whose input is the residual stream between the
  attention and the MLP branch (the calibration reads it with a pre-hook);
* ``post_norms``: the branch outputs pass through a norm before the residual
  add (Gemma 3: ``post_attention_layernorm``, ``post_feedforward_layernorm``),
  so a branch is scaled through that norm's weight, not ``o_proj``/``down_proj``;
* ``norm_offset``: the norm multiplies by ``offset + weight`` (Gemma 3: 1;
  Gemma 4's ``Gemma4RMSNorm`` multiplies by ``weight``: 0);
* ``experts_in_first``: fused expert tensors are stored ``[E, in, out]``
  (gpt-oss) rather than ``[E, out, in]`` (Qwen3-MoE, GLM-4.7-Flash), which
  decides each expert matrix's fan-in;
* ``router``: how routing is pinned so float noise cannot flip top-k:
  ``"correction_bias"`` (sigmoid scores plus ``e_score_correction_bias``, as
  DeepSeek; the bias lives on the router, ``mlp.gate``, or on the MoE block
  itself, ``mlp``, as in MiniMax-M2), ``"logit_bias"`` (softmax over router logits that have a bias:
  gpt-oss; the router matrix is drawn ``router_gain`` times smaller so the
  bias decides), or ``""`` (no bias to pin with: Qwen3-MoE routes on its
  logits alone, which fp32 on both sides reproduces);
* ``plain_norms``: names of norms inside a branch that multiply by ``weight``
  where the family's layer norms multiply by ``offset + weight`` (Qwen3-Next's
  gated delta-net output norm ``linear_attn.norm``, ``Qwen3NextRMSNormGated``);
* ``sglang_file``: the installed SGLang model file that serves the architecture
  (``srt/models/<file>``), for messages;
* ``transformers_dir``: the family's folder under ``transformers/models/``
  (its absence means the installed transformers cannot build or check it);
* ``processor``: a multimodal wrapper's checkpoint also carries the
  processor SGLang loads at start even for text-only requests
  (``srt/managers/tokenizer_manager.py``, ``init_tokenizer_and_processor``:
  ``AutoProcessor.from_pretrained`` on the model path whenever the config is
  multimodal); :class:`Processor` says which transformers classes and which
  special tokens, at the ids the config declares;
* ``weight_renames``: ``(prefix transformers writes, prefix SGLang loads)``
  pairs where the installed transformers' ``save_pretrained`` writes a name the
  published checkpoints (and SGLang's loader) spell otherwise (Gemma 3's
  SigLIP tower: ``vision_tower.vision_model.`` in ``srt/models/gemma3_mm.py``,
  ``load_weights``; transformers 5.19 writes ``vision_tower.``);
* ``sinks_bf16``: SGLang keeps the attention-sink logits in bfloat16 whatever
  ``--dtype`` is (``srt/models/gpt_oss.py``, ``GptOssAttention.__init__``), so
  the builder draws sinks that bfloat16 represents exactly.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The DeepSeek-V3 layout, built by :mod:`pytest_eagle3.target.checkpoint.init`.
DEEPSEEK_ARCHITECTURES = frozenset({"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"})


@dataclass(frozen=True)
class Processor:
    """The processor a multimodal wrapper's checkpoint directory holds, as transformers names it.

    Attributes:
        cls: the processor class (``Gemma3Processor``).
        image_processor: its image processor class (``Gemma3ImageProcessor``).
        video_processor: its video processor class, where the processor takes one.
        feature_extractor: its audio feature extractor class, where it takes one.
        tokens: ``(tokenizer attribute, token text, config key of its id)`` for each
            special token the processor and SGLang's multimodal processor look up
            (``srt/multimodal/processors/<family>.py``); the builder's tokenizer
            holds each text at the id the config declares.
        image_processor_kwargs: literal keyword arguments of the image processor.
        kwargs: ``{processor keyword: config key}``, read from the config.
    """

    cls: str
    image_processor: str
    video_processor: str = ""
    feature_extractor: str = ""
    tokens: tuple[tuple[str, str, str], ...] = ()
    image_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, str] = field(default_factory=dict)


_GEMMA3_PROCESSOR = Processor(
    "Gemma3Processor", "Gemma3ImageProcessor",
    tokens=(("boi_token", "<start_of_image>", "boi_token_index"),
            ("eoi_token", "<end_of_image>", "eoi_token_index"),
            ("image_token", "<image_soft_token>", "image_token_index")),
    image_processor_kwargs={"size": {"height": 28, "width": 28}},
    kwargs={"image_seq_length": "mm_tokens_per_image"})
_QWEN_VL_TOKENS = (("image_token", "<|image_pad|>", "image_token_id"),
                   ("video_token", "<|video_pad|>", "video_token_id"),
                   ("vision_start_token", "<|vision_start|>", "vision_start_token_id"),
                   ("vision_end_token", "<|vision_end|>", "vision_end_token_id"))


@dataclass(frozen=True)
class Family:
    """How one model family's transformers class is initialised and calibrated."""

    model_type: str
    architecture: str
    sglang_file: str
    mid_norm: str = "post_attention_layernorm"
    post_norms: tuple[str, str] | None = None
    norm_offset: float = 0.0
    plain_norms: tuple[str, ...] = ()
    experts_in_first: bool = False
    router: str = ""
    router_gain: float = 1.0
    sinks_bf16: bool = False
    transformers_dir: str = ""
    processor: Processor | None = None
    weight_renames: tuple[tuple[str, str], ...] = ()

    @property
    def transformers_folder(self) -> str:
        return self.transformers_dir or self.model_type


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "LlamaForCausalLM", "llama.py"),
        Family("qwen3", "Qwen3ForCausalLM", "qwen3.py"),
        Family("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe.py"),
        Family("gpt_oss", "GptOssForCausalLM", "gpt_oss.py", experts_in_first=True,
               router="logit_bias", router_gain=0.01, sinks_bf16=True),
        Family("gemma3_text", "Gemma3ForCausalLM", "gemma3_causal.py", mid_norm="pre_feedforward_layernorm",
               post_norms=("post_attention_layernorm", "post_feedforward_layernorm"), norm_offset=1.0,
               transformers_dir="gemma3"),
        Family("gemma4_text", "Gemma4ForCausalLM", "gemma4_causal.py", mid_norm="pre_feedforward_layernorm",
               post_norms=("post_attention_layernorm", "post_feedforward_layernorm"), transformers_dir="gemma4"),
        Family("glm4_moe_lite", "Glm4MoeLiteForCausalLM", "glm4_moe_lite.py", router="correction_bias"),
        Family("qwen2", "Qwen2ForCausalLM", "qwen2.py"),
        Family("qwen2_moe", "Qwen2MoeForCausalLM", "qwen2_moe.py"),
        Family("glm4_moe", "Glm4MoeForCausalLM", "glm4_moe.py", router="correction_bias"),
        Family("minimax_m2", "MiniMaxM2ForCausalLM", "minimax_m2.py", router="correction_bias"),
        Family("apertus", "ApertusForCausalLM", "apertus.py", mid_norm="feedforward_layernorm"),
        Family("exaone_moe", "ExaoneMoeForCausalLM", "exaone_moe.py", router="correction_bias"),
        Family("qwen3_next", "Qwen3NextForCausalLM", "qwen3_next.py", norm_offset=1.0,
               plain_norms=(".linear_attn.norm.",)),
        Family("qwen3_5_text", "Qwen3_5ForCausalLM", "qwen3_5_text.py", norm_offset=1.0,
               plain_norms=(".linear_attn.norm.",), transformers_dir="qwen3_5"),
        # Multimodal wrappers: the language model of the text family, a vision tower beside it.
        Family("gemma3", "Gemma3ForConditionalGeneration", "gemma3_mm.py", mid_norm="pre_feedforward_layernorm",
               post_norms=("post_attention_layernorm", "post_feedforward_layernorm"), norm_offset=1.0,
               processor=_GEMMA3_PROCESSOR, weight_renames=(("vision_tower.", "vision_tower.vision_model."),)),
        Family("gemma4", "Gemma4ForConditionalGeneration", "gemma4_mm.py", mid_norm="pre_feedforward_layernorm",
               post_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
               processor=Processor("Gemma4Processor", "Gemma4ImageProcessor", "Gemma4VideoProcessor",
                                   "Gemma4AudioFeatureExtractor",
                                   tokens=(("boi_token", "<|image>", "boi_token_id"),
                                           ("eoi_token", "<image|>", "eoi_token_id"),
                                           ("image_token", "<|image|>", "image_token_id"),
                                           ("video_token", "<|video|>", "video_token_id"),
                                           ("boa_token", "<|audio>", "boa_token_id"),
                                           ("eoa_token", "<audio|>", "eoa_token_index"),
                                           ("audio_token", "<|audio|>", "audio_token_id")))),
        Family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl.py",
               processor=Processor("Qwen2_5_VLProcessor", "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor",
                                   tokens=_QWEN_VL_TOKENS)),
        Family("qwen3_vl", "Qwen3VLForConditionalGeneration", "qwen3_vl.py",
               processor=Processor("Qwen3VLProcessor", "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor",
                                   tokens=_QWEN_VL_TOKENS)),
        Family("qwen3_5", "Qwen3_5ForConditionalGeneration", "qwen3_5.py", norm_offset=1.0,
               plain_norms=(".linear_attn.norm.",),
               processor=Processor("Qwen3VLProcessor", "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor",
                                   tokens=_QWEN_VL_TOKENS)),
    )
}

#: ``{model_type}``, ``{known}``.
UNKNOWN_FAMILY_MSG = (
    "the checkpoint builder has no family {model_type!r} (known: deepseek_v3, {known}); "
    "add it to pytest_eagle3/target/checkpoint/families.py or pass a checkpoint directory"
)


#: ``{preset}``, ``{model_type}``, ``{folder}``, ``{where}``.
NO_TRANSFORMERS_CLASS_MSG = (
    "target {preset} ({model_type}) needs transformers' models/{folder}/, which the installed "
    "transformers ({where}) lacks: install a transformers release that has it "
    "(pytest-eagle3 is verified with 5.19), or pick another --eagle3-target"
)


def missing_transformers_class(family: Family) -> str | None:
    """Where the installed transformers is, when it lacks ``family``'s model
    folder; ``None`` when it has it.  Reads the file tree (``find_spec`` of the
    top-level package only): transformers is not imported."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return "not installed"
    root = Path(list(spec.submodule_search_locations)[0])
    return None if (root / "models" / family.transformers_folder).is_dir() else str(root)


def language_config(config: dict) -> dict:
    """The language model's fields of a ``config.json`` dict: a multimodal
    wrapper's ``text_config`` (Gemma 3, Qwen2.5-VL, Qwen3-VL: the layer count,
    widths and vocabulary live there), with the wrapper's ``architectures`` (the
    class SGLang serves) and its dtype where the text part has none; any other
    config as it is."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return config
    merged = dict(text)
    if config.get("architectures"):  # the class SGLang serves is the wrapper's
        merged["architectures"] = config["architectures"]
    for key in ("torch_dtype", "dtype"):
        if config.get(key) is not None and merged.get(key) is None:
            merged[key] = config[key]
    return merged


def family_of(config: dict) -> Family | None:
    """The :class:`Family` of a ``config.json`` dict; ``None`` for DeepSeek-V3 or an unknown type."""
    return FAMILIES.get(str(config.get("model_type") or ""))


def is_deepseek(config: dict) -> bool:
    """True when the DeepSeek-V3 builder (:mod:`.init`) builds this config."""
    archs = config.get("architectures") or []
    return (not archs) or archs[0] in DEEPSEEK_ARCHITECTURES or config.get("model_type") == "deepseek_v3"
