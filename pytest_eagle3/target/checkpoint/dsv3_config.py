"""The DeepSeek-V3 config fields the checkpoint builder reads, validated.

:class:`Dims` is what :mod:`pytest_eagle3.target.checkpoint.init` draws weights
for and what :mod:`pytest_eagle3.target.checkpoint.dsv3_forward` runs; a config
outside the supported layout raises
:class:`~pytest_eagle3.errors.Eagle3ConfigError` naming the feature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_eagle3.errors import Eagle3ConfigError

#: ``{what}``: the unsupported config feature.
UNSUPPORTED_MSG = (
    "the checkpoint builder supports the DeepSeek-V3 layout only ({what}); "
    "use a tiny-dsv3-like spec or pass an existing checkpoint directory"
)


@dataclass(frozen=True)
class Dims:
    """The config fields the builder reads, validated.

    Raises (from :meth:`from_config`):
        Eagle3ConfigError: the config is not a DeepSeek-V3 layout the builder supports.
    """

    layers: int
    hidden: int
    vocab: int
    heads: int
    q_lora: int | None
    kv_lora: int
    nope: int
    rope: int
    v: int
    inter: int
    moe_inter: int
    experts: int
    shared: int
    topk: int
    n_group: int
    topk_group: int
    first_dense: int
    moe_freq: int
    eps: float
    norm_topk: bool
    routed_scale: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    rope_interleave: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Dims:
        arch = cfg.get("architectures") or []
        if "DeepseekV3ForCausalLM" not in arch:
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what=f"architectures={arch}"))
        checks = {
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "hidden_act": "silu",
        }
        for key, want in checks.items():
            if cfg.get(key, want) != want:
                raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what=f"{key}={cfg.get(key)!r}"))
        if cfg.get("tie_word_embeddings", False):
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what="tie_word_embeddings=true"))
        if cfg.get("attention_bias", False):
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what="attention_bias=true"))
        rp = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rtype = rp.get("rope_type", rp.get("type", "default"))
        theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        if rtype not in ("default", "yarn"):
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what=f"rope type {rtype!r}"))
        try:
            return cls(
                layers=int(cfg["num_hidden_layers"]),
                hidden=int(cfg["hidden_size"]),
                vocab=int(cfg["vocab_size"]),
                heads=int(cfg["num_attention_heads"]),
                q_lora=None if cfg.get("q_lora_rank") is None else int(cfg["q_lora_rank"]),
                kv_lora=int(cfg["kv_lora_rank"]),
                nope=int(cfg["qk_nope_head_dim"]),
                rope=int(cfg["qk_rope_head_dim"]),
                v=int(cfg["v_head_dim"]),
                inter=int(cfg["intermediate_size"]),
                moe_inter=int(cfg["moe_intermediate_size"]),
                experts=int(cfg["n_routed_experts"]),
                shared=int(cfg.get("n_shared_experts") or 0),
                topk=int(cfg["num_experts_per_tok"]),
                n_group=int(cfg.get("n_group") or 1),
                topk_group=int(cfg.get("topk_group") or 1),
                first_dense=int(cfg.get("first_k_dense_replace", 0)),
                moe_freq=int(cfg.get("moe_layer_freq", 1)),
                eps=float(cfg.get("rms_norm_eps", 1e-6)),
                norm_topk=bool(cfg.get("norm_topk_prob", True)),
                routed_scale=float(cfg.get("routed_scaling_factor", 1.0)),
                rope_theta=theta,
                rope_scaling=rp if rtype == "yarn" else None,
                rope_interleave=bool(cfg.get("rope_interleave", True)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise Eagle3ConfigError(UNSUPPORTED_MSG.format(what=f"config field {exc}")) from None

    def is_moe(self, layer: int) -> bool:
        """Whether ``layer`` has a MoE MLP (transformers' and SGLang's rule)."""
        return layer >= self.first_dense and layer % self.moe_freq == 0
