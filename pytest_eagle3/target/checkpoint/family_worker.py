"""Subprocess entry point that draws a non-DeepSeek target's weights with transformers.

Usage::

    python -m pytest_eagle3.target.checkpoint.family_worker --spec SPEC.json --out DIR

``SPEC.json`` is a target spec (:class:`~pytest_eagle3.target.spec.TargetSpec`
fields).  The worker instantiates the family's transformers class from the
spec's ``config`` (``AutoModelForCausalLM.from_config``, or
``AutoModelForImageTextToText`` for a multimodal wrapper transformers maps to no
causal LM: :func:`model_class`; float32, eager attention), applies the distinguishable-layers init of docs/design.md,
"Reduced-layer targets that can tell layers apart", parameter by parameter in
the model's own order from one ``torch.Generator`` seeded with ``spec.seed``:

* embedding N(0, ``embedding_std``^2); every other matrix (and each expert's
  matrix of a fused expert tensor) N(0, ``matrix_gain`` / fan_in);
* every norm weight lognormal(0, ``norm_lognormal_sigma``), stored as
  ``value - norm_offset`` where the norm multiplies by ``offset + weight``;
* a trainable activation's parameters (Apertus' xIELU ``alpha_p``,
  ``alpha_n``) keep transformers' own init;
* biases 0, attention sinks N(0, 1) (rounded to bfloat16 where SGLang keeps
  them in bfloat16), routing pinned as :class:`~.families.Family` says;

then calibrates layer by layer with forward hooks on the transformers model
itself: each attention and MLP branch is scaled so its output RMS is
``sqrt(branch_variance_ratio)`` times the RMS of the stream it reads, the
scale rounded to ``scale_mantissa_bits`` bits and folded into the tensors the
branch is linear in (``o_proj``/``down_proj`` weights and biases, or the
post-branch norm's weight).  The weights are written through transformers'
``save_pretrained`` (which restores the checkpoint names SGLang loads, e.g.
per-expert ``experts.E.down_proj.weight``) and rewritten as ``DIR/model.safetensors``
with :func:`~.builder.write_weights` (deterministic bytes); ``DIR/scales.json``
holds the calibration record.  A multimodal wrapper (a :class:`~.families.Family`
with a ``processor``) is calibrated on its language model (:func:`decoder_of`),
its other parameters drawn from the same generator, and its directory also holds
the processor SGLang loads at start (:func:`write_processor`).

Exit status 0 on success; on failure a traceback on stderr and status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any
from pytest_eagle3.target.checkpoint.builder import write_weights
from pytest_eagle3.target.checkpoint.families import FAMILIES, Processor, language_config
from pytest_eagle3.target.checkpoint.init import _round_scale


def decoder_of(model: Any) -> tuple[str, Any]:
    """``(name, module)`` of the language model's decoder: the first module with
    both ``embed_tokens`` and ``layers`` (``model`` of a causal LM,
    ``model.language_model`` of a multimodal wrapper; ``""`` for a bare decoder).

    Raises:
        RuntimeError: no module has both.
    """
    for name, module in model.named_modules():
        if hasattr(module, "embed_tokens") and hasattr(module, "layers"):
            return name, module
    raise RuntimeError(f"{type(model).__name__} has no module with embed_tokens and layers")


def mlp_of(layer: Any) -> Any:
    """A decoder layer's MLP branch: ``layer.mlp``, or ``layer.feed_forward``
    (transformers' Llama 4, dense or MoE).

    Raises:
        AttributeError: the layer has neither.
    """
    mlp = getattr(layer, "mlp", None)
    return mlp if mlp is not None else layer.feed_forward


def attention_output_of(layer: Any) -> Any:
    """The projection that ends a decoder layer's attention branch: ``self_attn.o_proj``,
    or ``linear_attn.out_proj`` on a gated delta-net layer (Qwen3-Next).

    Raises:
        AttributeError: the layer has neither.
    """
    attn = getattr(layer, "self_attn", None)
    return attn.o_proj if attn is not None else layer.linear_attn.out_proj


def _draw_outside(name: str, shape: tuple, gain: float, gen: Any) -> Any:
    """A parameter outside the language model (a vision tower, a projector):
    matrices and kernels N(0, gain / fan_in), norm weights 1, other vectors 0.
    Text-only prompts never read them; they are drawn from the spec's generator, so the bytes are reproducible."""
    import torch

    if len(shape) >= 2:
        return torch.randn(shape, generator=gen) * math.sqrt(gain / math.prod(shape[1:]))
    if "norm" in name and name.endswith("weight"):
        return torch.ones(shape)
    return torch.zeros(shape)


def _draw(model: Any, family: Any, init: dict, gen: Any) -> None:
    import torch

    sigma = float(init["norm_lognormal_sigma"])
    gain = float(init["matrix_gain"])
    name = decoder_of(model)[0]
    prefix = f"{name}." if name else ""
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        leaf = name.rsplit(".", 1)[-1]
        if not name.startswith(prefix) and not name.startswith("lm_head."):
            value = _draw_outside(name, shape, gain, gen)
        elif name.endswith("embed_tokens.weight"):
            value = torch.randn(shape, generator=gen) * float(init["embedding_std"])
        elif "norm" in name and len(shape) == 1:
            offset = 0.0 if any(n in name for n in family.plain_norms) else family.norm_offset
            value = torch.exp(torch.randn(shape, generator=gen) * sigma) - offset
        elif leaf == "A_log":  # a delta-net head's log decay rate: log(A), A ~ U(1, 16)
            value = torch.log(1.0 + 15.0 * torch.rand(shape, generator=gen))
        elif ".act_fn." in name:  # a trainable activation's own parameters (Apertus' xIELU): its init
            continue
        elif leaf == "sinks":
            value = torch.randn(shape, generator=gen)
            if family.sinks_bf16:
                value = value.to(torch.bfloat16).float()
        elif leaf == "e_score_correction_bias" or (leaf == "bias" and ".router." in name):
            value = torch.zeros(shape)
        elif leaf.endswith("bias"):
            value = torch.zeros(shape)
        elif len(shape) == 3:  # fused experts [E, out, in] or [E, in, out]
            fan_in = shape[1] if family.experts_in_first else shape[2]
            value = torch.randn(shape, generator=gen) * math.sqrt(gain / fan_in)
        elif len(shape) == 2:
            value = torch.randn(shape, generator=gen) * math.sqrt(gain / shape[1])
            if ".router." in name:
                value = value * family.router_gain
        else:
            raise RuntimeError(f"no init rule for parameter {name} of shape {shape}")
        with torch.no_grad():
            p.copy_(value)


def _pin_routing(model: Any, family: Any, init: dict) -> None:
    import torch

    pins, bias = int(init["pinned_experts"]), float(init["router_bias"])
    moe_index = 0
    for layer in decoder_of(model)[1].layers:
        target = None
        if family.router == "correction_bias":
            target = getattr(getattr(mlp_of(layer), "gate", None), "e_score_correction_bias", None)
            if target is None:  # MiniMax-M2 keeps it on the MoE block
                target = getattr(mlp_of(layer), "e_score_correction_bias", None)
        elif family.router == "logit_bias":
            target = getattr(getattr(mlp_of(layer), "router", None), "bias", None)
        if target is None:
            continue
        with torch.no_grad():
            target.zero_()
            for t in range(pins):
                target[(moe_index * pins + t) % target.numel()] = bias
        moe_index += 1


def _calibrate(model: Any, family: Any, init: dict, tokens: Any) -> list[dict]:
    import torch

    ratio = math.sqrt(float(init["branch_variance_ratio"]))
    bits = int(init["scale_mantissa_bits"])
    records = []

    def rms(t: Any) -> float:
        return float(t.float().pow(2).mean().sqrt())

    layers = decoder_of(model)[1].layers

    def streams(i: int) -> tuple[Any, Any, Any]:
        layer = layers[i]
        seen: dict[str, Any] = {}

        def pre(_m, args, kwargs):
            seen["in"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

        def mid(_m, args):
            seen["mid"] = args[0].detach().clone()

        def out(_m, _args, output):
            seen["out"] = (output[0] if isinstance(output, tuple) else output).detach().clone()

        hs = [layer.register_forward_pre_hook(pre, with_kwargs=True),
              getattr(layer, family.mid_norm).register_forward_pre_hook(mid),
              layer.register_forward_hook(out)]
        try:
            model(input_ids=tokens, use_cache=False)
        finally:
            for h in hs:
                h.remove()
        return seen["in"], seen["mid"], seen["out"]

    def fold(layer: Any, branch: int, s: float) -> None:
        with torch.no_grad():
            if family.post_norms is not None:
                w = getattr(layer, family.post_norms[branch]).weight
                w.copy_((w + family.norm_offset) * s - family.norm_offset)
                return
            module = attention_output_of(layer) if branch == 0 else mlp_of(layer)
            for name, p in module.named_parameters():
                if branch == 0 or "down_proj" in name:
                    p.mul_(s)

    for i, layer in enumerate(layers):
        x_in, x_mid, _ = streams(i)
        s_attn = _round_scale(ratio * rms(x_in) / max(rms(x_mid - x_in), 1e-30), bits)
        fold(layer, 0, s_attn)
        _, x_mid, x_out = streams(i)
        s_mlp = _round_scale(ratio * rms(x_mid) / max(rms(x_out - x_mid), 1e-30), bits)
        fold(layer, 1, s_mlp)
        records.append({"layer": i, "stream_rms_in": rms(x_in), "attn_scale": s_attn, "mlp_scale": s_mlp})
    return records


def model_class(config: Any) -> Any:
    """The transformers class that builds ``config``: the causal-LM auto class
    where transformers maps the type to one, else the image-text-to-text auto
    class (Qwen2.5-VL, Qwen3-VL have no causal-LM mapping); the class the first
    ``architectures`` entry names instead where the mapping would build another
    one (``llama4`` maps to the text-only ``Llama4ForCausalLM``).  An auto class
    has ``from_config``; a named class is instantiated directly."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    causal = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    mapping = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if causal else MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    arch = (getattr(config, "architectures", None) or [""])[0] or ""
    named = getattr(transformers, arch, None) if arch else None
    if isinstance(named, type) and mapping.get(config.model_type) != arch:
        return named
    return AutoModelForCausalLM if causal else AutoModelForImageTextToText


def write_processor(processor: Processor, config: dict, out_dir: Path) -> None:
    """Write ``processor``'s files into ``out_dir``: a word-level tokenizer over
    the language model's vocabulary (token ``i`` is ``<t{i}>``, each special
    token's text at the id the config declares) and the processor classes
    transformers names, as ``save_pretrained`` writes them.

    Raises:
        ValueError: a special token's id is missing from the config, outside the
            vocabulary, or shared with another special token.
    """
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    size = int(language_config(config)["vocab_size"])
    vocab = {f"<t{i}>": i for i in range(size)}
    by_id = {i: t for t, i in vocab.items()}
    ids = [config.get(key) for _attr, _token, key in processor.tokens]
    if any(not isinstance(i, int) or not 0 <= i < size for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"{processor.cls}: special token ids {dict(zip((k for *_, k in processor.tokens), ids))} "
                         f"must be distinct integers below the vocabulary size {size}")
    extra = {}
    for attr, token, key in processor.tokens:
        i = int(config[key])
        del vocab[by_id[i]]
        vocab[token] = i
        extra[attr] = token
    core = Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core, extra_special_tokens=extra)
    parts: dict[str, Any] = {
        "image_processor": getattr(transformers, processor.image_processor)(**processor.image_processor_kwargs),
        "tokenizer": tokenizer,
    }
    if processor.video_processor:
        parts["video_processor"] = getattr(transformers, processor.video_processor)()
    if processor.feature_extractor:
        parts["feature_extractor"] = getattr(transformers, processor.feature_extractor)()
    kwargs = {k: config[key] for k, key in processor.kwargs.items()}
    getattr(transformers, processor.cls)(**parts, **kwargs).save_pretrained(str(out_dir))


def build(spec: dict, out_dir: Path) -> list[dict]:
    """Draw, calibrate and write ``spec``'s weights into ``out_dir``; returns the scales."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = dict(spec["config"])
    family = FAMILIES[config["model_type"]]
    init = spec["init"]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config), encoding="ascii")
        cfg = AutoConfig.from_pretrained(tmp)
        cfg._attn_implementation = "eager"
        cls = model_class(cfg)
        model = (cls.from_config(cfg, dtype=torch.float32) if hasattr(cls, "from_config")
                 else cls(cfg).to(torch.float32)).eval()
        gen = torch.Generator().manual_seed(int(spec["seed"]))
        with torch.no_grad():
            _draw(model, family, init, gen)
            _pin_routing(model, family, init)
            tokens = torch.randint(0, int(language_config(config)["vocab_size"]),
                                   (int(init["calibration_sequences"]), int(init["calibration_tokens"])),
                                   generator=gen)
            scales = _calibrate(model, family, init, tokens)
        saved = Path(tmp) / "saved"
        model.save_pretrained(saved)
        weights: dict[str, Any] = {}
        for f in sorted(saved.glob("*.safetensors")):
            weights.update(load_file(str(f)))
    out_dir.mkdir(parents=True, exist_ok=True)
    for old, new in family.weight_renames:
        weights = {(new + k[len(old):] if k.startswith(old) and not k.startswith(new) else k): v
                   for k, v in weights.items()}
    write_weights({k: weights[k] for k in sorted(weights)}, out_dir,
                  dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"))
    if family.processor is not None:
        write_processor(family.processor, config, out_dir)
    return scales


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pytest_eagle3.target.checkpoint.family_worker")
    ap.add_argument("--spec", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    scales = build(spec, args.out)
    (args.out / "scales.json").write_text(json.dumps(scales, indent=2), encoding="ascii")
    return 0


if __name__ == "__main__":
    sys.exit(main())
