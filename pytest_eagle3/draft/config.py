"""The EAGLE-3 draft's shape, ``config.json`` keys and weight names.

Everything here is what SGLang 0.5.23 reads (no torch needed):

* ``sglang/srt/models/llama_eagle3.py::LlamaModel.__init__``: ``fc`` is
  ``Linear(target_hidden_size * K, hidden_size, bias=config.bias or False)``
  where ``K`` = ``num_aux_hidden_states`` if set, else
  ``len(eagle_config.eagle_aux_hidden_state_layer_ids)``, else 3; ``target_hidden_size``
  defaults to ``hidden_size``. ``norm_before_fc`` / ``fc_norm`` / ``use_aux_norm``
  add norms before ``fc``: this draft sets none of them.
  ``num_hidden_layers`` decoder layers; layer 0 is the input layer whose
  ``qkv_proj`` reads ``2 * hidden_size`` (``LlamaDecoderLayer.__init__``).
* ``LlamaForCausalLMEagle3.__init__``: ``draft_vocab_size`` absent or null ->
  ``load_lm_head_from_target = True`` and the worker binds the *target's*
  lm_head (``sglang/srt/speculative/eagle_worker_v2.py::init_lm_head``); this draft
  sets ``draft_vocab_size = vocab_size`` so its own ``lm_head`` is used.
  ``tie_word_embeddings`` must be false (true would make lm_head the embedding).
* ``init_lm_head`` also calls ``set_embed(target embed)`` and
  ``sglang/srt/models/llama.py::LlamaForCausalLM.set_embed`` replaces the draft's
  ``embed_tokens`` by the target's whenever ``target_hidden_size == hidden_size``:
  the draft reads the *target's* embedding, so this draft ships none.
* ``load_weights``: names are matched after replacing ``midlayer`` by
  ``layers.0`` and prefixing ``model.`` when needed; ``q_proj/k_proj/v_proj`` are
  stacked into ``qkv_proj`` and ``gate_proj/up_proj`` into ``gate_up_proj``;
  a name containing ``d2t`` sets ``hot_token_id = d2t + arange`` (draft id ->
  target id, needed only when ``draft_vocab_size < vocab_size``); ``t2d`` is
  skipped. Unknown names are ignored silently.
* ``sglang/srt/models/llama.py::LlamaDecoderLayer`` / ``LlamaAttention``: rope is
  neox-style (``rope_is_neox_style`` default True) over the whole ``head_dim``
  (``head_dim`` default ``hidden_size // num_attention_heads``), base
  ``rope_theta``; softmax scale ``head_dim ** -0.5``; MLP is SiLU-gated.
* ``sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py::
  _resolve_eagle_aux_hidden_state``: the target captures
  ``eagle_config["eagle_aux_hidden_state_layer_ids"]``; for DeepSeek
  (``deepseek_v2.py::set_eagle3_layers_to_capture``) the ids are used as-is unless
  the first is 1 (then +1 each), so ``[0, 3, 5]`` captures ``hs[0], hs[3], hs[5]``.

Weight names written (SpecForge's, which every SGLang EAGLE-3 loader maps):
``fc.weight [H, K*Ht]``, ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight [H]``,
``midlayer.self_attn.{q,k,v}_proj.weight [heads*hd | kv*hd, 2H]``,
``midlayer.self_attn.o_proj.weight [H, heads*hd]``,
``midlayer.mlp.{gate,up}_proj.weight [I, H]``, ``midlayer.mlp.down_proj.weight [H, I]``,
``norm.weight [H]``, ``lm_head.weight [Vd, H]``, and ``d2t``/``t2d`` when ``Vd < V``.

The MLA draft (``attention="mla"``) is SGLang 0.5.23's ``Eagle3DeepseekV2ForCausalLM``
(``sglang/srt/models/kimi_k25_eagle3.py``, the ``kimi-k2.5-eagle3-mla`` layout):

* the same EAGLE-3 layer around DeepSeek-V2 multi-latent attention
  (``DeepseekV2AttentionMLA``) whose fused ``q_a``/``kv_a`` down projection reads
  ``2 * hidden_size`` (``Eagle3MLADecoderLayer.__init__``, lines 114-131), with the
  target's MLA widths (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``) and its yarn ``rope_scaling``; a dense
  ``DeepseekV2MLP``;
* ``fc`` sized from ``eagle_config.eagle_aux_hidden_state_layer_ids``, else a
  top-level ``eagle_aux_hidden_state_layer_ids``, else 3 (``_get_eagle_aux_layer_count``,
  lines 48-59);
* ``fc_norm`` (or ``use_aux_norm``): one RMSNorm per aux slot before ``fc``
  (``fc_norm.{k}.weight [Ht]``, lines 228-241, 286-292); ``norm_output``: the
  hidden state handed to the next draft step is the final norm's output instead
  of the pre-norm sum (lines 253-255, 307-312);
* checkpoint names ``layers.0.*`` (mapped to ``midlayer.*``, ``load_weights``),
  ``self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
  kv_a_layernorm, kv_b_proj, o_proj}``; ``draft_vocab_size`` set keeps the draft's
  own ``lm_head`` (``load_lm_head_from_target`` stays False), and ``set_embed``
  binds the target's embedding when ``target_hidden_size == hidden_size``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

ARCHITECTURE = "LlamaForCausalLMEagle3"
#: SGLang's MLA EAGLE-3 draft (``srt/models/kimi_k25_eagle3.py``, 0.5.23 onwards).
MLA_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"
#: Every draft architecture this package builds and reads.
ARCHITECTURES = (ARCHITECTURE, MLA_ARCHITECTURE)
#: Target config keys an MLA draft copies (its attention has the target's MLA widths).
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")

#: Names of the trained tensors, without the optional ``d2t``/``t2d``.
FC = "fc.weight"
LM_HEAD = "lm_head.weight"
NORM = "norm.weight"
LAYER = "midlayer"
#: The MLA draft's decoder layer prefix (``kimi-k2.5-eagle3-mla`` checkpoints).
MLA_LAYER = "layers.0"


def weight_names() -> tuple[str, ...]:
    """Every tensor name a Llama-style draft has (one decoder layer; see
    :meth:`DraftConfig.shapes` for the MLA layout)."""
    p = LAYER
    return (
        FC,
        f"{p}.input_layernorm.weight",
        f"{p}.hidden_norm.weight",
        f"{p}.self_attn.q_proj.weight",
        f"{p}.self_attn.k_proj.weight",
        f"{p}.self_attn.v_proj.weight",
        f"{p}.self_attn.o_proj.weight",
        f"{p}.post_attention_layernorm.weight",
        f"{p}.mlp.gate_proj.weight",
        f"{p}.mlp.up_proj.weight",
        f"{p}.mlp.down_proj.weight",
        NORM,
        LM_HEAD,
    )


@dataclass(frozen=True)
class DraftConfig:
    """Shape of a one-layer Llama EAGLE-3 draft.

    Attributes:
        hidden_size: ``H``, the draft width; equal to ``target_hidden_size`` so
            SGLang shares the target embedding (``set_embed``).
        target_hidden_size: ``Ht``, width of one aux slot.
        aux_layer_ids: ``eagle_config.eagle_aux_hidden_state_layer_ids`` (K = len).
        num_attention_heads, num_key_value_heads, head_dim: attention shape.
        intermediate_size: MLP width.
        vocab_size: the target vocabulary (``V``).
        draft_vocab_size: rows of ``lm_head`` (``Vd``); ``== V`` means no ``d2t``.
        rms_norm_eps, rope_theta, max_position_embeddings: as in Llama.
    """

    hidden_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    attention: str = "llama"
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_scaling: dict[str, Any] | None = field(default=None, compare=False)
    fc_norm: bool = False
    norm_output: bool = False

    @property
    def is_mla(self) -> bool:
        """Whether this is the MLA draft (:data:`MLA_ARCHITECTURE`)."""
        return self.attention == "mla"

    @property
    def layer_prefix(self) -> str:
        """Checkpoint name prefix of the decoder layer."""
        return MLA_LAYER if self.is_mla else LAYER

    @property
    def qk_head_dim(self) -> int:
        """Width of one query/key head: ``head_dim``, or ``qk_nope + qk_rope`` for MLA."""
        if self.is_mla:
            return int(self.qk_nope_head_dim or 0) + int(self.qk_rope_head_dim or 0)
        return self.head_dim

    @property
    def softmax_scale(self) -> float:
        """``qk_head_dim ** -0.5``; for MLA with yarn ``rope_scaling`` times ``mscale**2``
        (``DeepseekV2AttentionMLA.__init__``: ``yarn_get_mscale(factor, mscale_all_dim)``)."""
        scale = self.qk_head_dim ** -0.5
        rs = self.rope_scaling or {}
        if self.is_mla and rs and rs.get("mscale_all_dim"):
            factor = float(rs["factor"])
            m = 0.1 * float(rs["mscale_all_dim"]) * math.log(factor) + 1.0 if factor > 1 else 1.0
            scale *= m * m
        return scale

    @property
    def num_aux(self) -> int:
        """``K``: number of aux slots fed to ``fc``."""
        return len(self.aux_layer_ids)

    @property
    def fc_in(self) -> int:
        """``K * Ht``: input width of ``fc``."""
        return self.num_aux * self.target_hidden_size

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` of every trained tensor, in initialisation order
        (:func:`weight_names` for the Llama-style draft; the MLA one has its MLA
        attention tensors and, with ``fc_norm``, one norm per aux slot)."""
        H, I, p = self.hidden_size, self.intermediate_size, self.layer_prefix
        shapes: dict[str, tuple[int, ...]] = {FC: (H, self.fc_in)}
        if self.fc_norm:
            shapes.update({f"fc_norm.{k}.weight": (self.target_hidden_size,) for k in range(self.num_aux)})
        shapes[f"{p}.input_layernorm.weight"] = (H,)
        shapes[f"{p}.hidden_norm.weight"] = (H,)
        shapes.update(self._mla_attention_shapes() if self.is_mla else self._attention_shapes())
        shapes.update({
            f"{p}.post_attention_layernorm.weight": (H,),
            f"{p}.mlp.gate_proj.weight": (I, H),
            f"{p}.mlp.up_proj.weight": (I, H),
            f"{p}.mlp.down_proj.weight": (H, I),
            NORM: (H,),
            LM_HEAD: (self.draft_vocab_size, H),
        })
        return shapes

    def _attention_shapes(self) -> dict[str, tuple[int, ...]]:
        H, p = self.hidden_size, self.layer_prefix
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return {
            f"{p}.self_attn.q_proj.weight": (q, 2 * H),
            f"{p}.self_attn.k_proj.weight": (kv, 2 * H),
            f"{p}.self_attn.v_proj.weight": (kv, 2 * H),
            f"{p}.self_attn.o_proj.weight": (H, q),
        }

    def _mla_attention_shapes(self) -> dict[str, tuple[int, ...]]:
        H, n, a = self.hidden_size, self.num_attention_heads, f"{self.layer_prefix}.self_attn"
        qr, kvr = int(self.q_lora_rank or 0), int(self.kv_lora_rank or 0)
        rope, vd = int(self.qk_rope_head_dim or 0), int(self.v_head_dim or 0)
        return {
            f"{a}.q_a_proj.weight": (qr, 2 * H),
            f"{a}.q_a_layernorm.weight": (qr,),
            f"{a}.q_b_proj.weight": (n * self.qk_head_dim, qr),
            f"{a}.kv_a_proj_with_mqa.weight": (kvr + rope, 2 * H),
            f"{a}.kv_a_layernorm.weight": (kvr,),
            f"{a}.kv_b_proj.weight": (n * (int(self.qk_nope_head_dim or 0) + vd), kvr),
            f"{a}.o_proj.weight": (H, n * vd),
        }

    def num_parameters(self) -> int:
        """Trained parameters (the shipped embedding is the target's: not counted)."""
        total = 0
        for shape in self.shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def to_hf_config(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``config.json`` SGLang loads (``transformers.LlamaConfig`` keys plus EAGLE-3 ones).

        Args:
            extra: more top-level keys (the ``pytest_eagle3`` provenance block).
        """
        cfg: dict[str, Any] = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.target_hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "bias": False,
            "torch_dtype": "float32",
            "bos_token_id": 0,
            "eos_token_id": None,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                "use_aux_hidden_state": True,
            },
        }
        if self.is_mla:
            del cfg["head_dim"]
            cfg.update(self._mla_config())
        if extra:
            cfg.update(extra)
        return cfg

    def _mla_config(self) -> dict[str, Any]:
        """The keys that make a config the MLA draft (``DeepseekV3Config`` keys)."""
        out: dict[str, Any] = {
            "architectures": [MLA_ARCHITECTURE],
            "model_type": "deepseek_v3",
            "num_key_value_heads": self.num_attention_heads,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "rope_interleave": True,
        }
        for key in MLA_KEYS:
            out[key] = getattr(self, key)
        if self.fc_norm:
            out["fc_norm"] = True
        if self.norm_output:
            out["norm_output"] = True
        return out

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> DraftConfig:
        """Read a draft ``config.json`` the way SGLang 0.5.23 does (defaults included).

        Raises:
            KeyError / TypeError / ValueError: a required key is missing or malformed
            (:func:`pytest_eagle3.draft.validate.validate_draft` turns these into
            one-line errors).
        """
        H = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        eagle = cfg.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        is_mla = MLA_ARCHITECTURE in (cfg.get("architectures") or [])
        if ids is None and is_mla:
            ids = cfg.get("eagle_aux_hidden_state_layer_ids")  # _get_eagle_aux_layer_count's fallback
        k = cfg.get("num_aux_hidden_states")
        if ids is None:
            ids = list(range(int(k) if k is not None else 3))  # K only; ids unknown
        elif k is not None and int(k) != len(ids):
            raise ValueError(f"num_aux_hidden_states {k} != {len(ids)} ids")
        vocab = int(cfg["vocab_size"])
        dv = cfg.get("draft_vocab_size")
        mla: dict[str, Any] = {}
        if is_mla:
            mla = {key: int(cfg[key]) for key in MLA_KEYS}
            mla.update(attention="mla", rope_scaling=cfg.get("rope_scaling"),
                       fc_norm=bool(cfg.get("fc_norm") or cfg.get("use_aux_norm")),
                       norm_output=bool(cfg.get("norm_output")))
        return cls(
            hidden_size=H,
            target_hidden_size=int(cfg.get("target_hidden_size") or H),
            aux_layer_ids=tuple(int(i) for i in ids),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or H // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=vocab,
            draft_vocab_size=int(dv) if dv is not None else vocab,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
            **mla,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        d = asdict(self)
        d["aux_layer_ids"] = list(self.aux_layer_ids)
        return d
