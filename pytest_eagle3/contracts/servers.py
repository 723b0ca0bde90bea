"""Which layers vLLM would feed a draft, from its ``config.json`` alone.

vLLM 0.33.0 (2026-11-01) reads a draft's aux layer ids differently in its two
GPU model runners; both were read in the released wheel:

* **V2** (the default; ``VLLM_USE_V2_MODEL_RUNNER=0`` selects V1,
  ``vllm/config/vllm.py:731-767``):
  ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:113-150``
  ``get_eagle3_aux_layers_from_config`` takes, the first that is set: the
  top-level ``eagle_aux_hidden_state_layer_ids`` as given;
  ``dflash_config.target_layer_ids`` + 1; ``dspark_target_layer_ids`` + 1;
  a top-level ``target_layer_ids`` + 1; ``dflash_config.layer_ids`` or
  ``eagle_config.layer_ids`` as given.  It never reads
  ``eagle_config.eagle_aux_hidden_state_layer_ids``.
* **V1**: ``vllm/v1/worker/gpu_model_runner.py:5190-5224``
  ``_get_eagle3_aux_layers_from_config``: the top-level key; else
  ``dflash_config.target_layer_ids`` + 1; then, when an ``eagle_config`` dict
  exists, its ``eagle_aux_hidden_state_layer_ids`` as given (overwriting the
  DFlash result, even with None).

With nothing found both fall back to the model's default ``(2, L//2, L-3)``
(``vllm/model_executor/models/interfaces.py:1751-1772``).  For DeepSeek
(``vllm/model_executor/models/deepseek_v2.py:1508-1593``) an id ``v`` captures
``hidden_states + residual`` before layer ``v`` (``hs[v]``), in layer order; id
``L`` captures the last layer's output before the final norm; id 0 adds a None
residual (TypeError at the first forward).  A speculators-format config
(``speculators_config``) is mapped by ``vllm/transformers_utils/configs/speculators/algos.py:15-50``
with its top-level ids kept, so both runners read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

KEY = "eagle_aux_hidden_state_layer_ids"
VLLM_VERSION = "0.33.0"
V2_SOURCE = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:113-150"
V1_SOURCE = "vllm/v1/worker/gpu_model_runner.py:5190-5224"
DEFAULT_SOURCE = "vllm/model_executor/models/interfaces.py:1751-1772"


@dataclass(frozen=True)
class ServerRead:
    """What one server would read from a draft config and capture for it.

    Attributes:
        server: ``"vllm 0.33.0 V2"`` and the like.
        key: the config key the ids came from (``None``: none, the default).
        ids: the layer ids the server uses (its default when ``key`` is None).
        snapshots: ``hs`` indices captured, in layer order (``L + 1`` = ``final_prenorm``);
            empty when it fails.
        fails: why capturing fails (id 0 on DeepSeek, an id past ``L``), else None.
        source: the file and lines the reading comes from.
    """

    server: str
    key: str | None
    ids: tuple[int, ...]
    snapshots: tuple[int, ...]
    fails: str | None
    source: str

    def describe(self, snapshot_text: Callable[[int], str] | None = None) -> str:
        """One line; ``snapshot_text`` writes a snapshot index (default ``hs[i]``)."""
        read = f"{self.key} {list(self.ids)}" if self.key else f"no ids: its default {list(self.ids)}"
        text = snapshot_text or (lambda i: f"hs[{i}]")
        got = f"fails: {self.fails}" if self.fails else "captures [" + ", ".join(text(i) for i in self.snapshots) + "]"
        return f"{self.server}: reads {read}; {got} ({self.source})"


def _plus_one(values: Any) -> tuple[int, ...] | None:
    if not values:
        return None
    return tuple(int(v) + 1 for v in values)


def _as_ids(values: Any) -> tuple[int, ...] | None:
    if not values:
        return None
    return tuple(int(v) for v in values)


def vllm_v2_ids(config: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, str | None]:
    """``(ids, key)`` the V2 runner reads (``None, None``: none; it uses its default)."""
    ids = _as_ids(config.get(KEY))
    if ids:
        return ids, KEY
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), Mapping) else {}
    ids = _plus_one(dflash.get("target_layer_ids"))
    if ids:
        return ids, "dflash_config.target_layer_ids (+1)"
    dspark = config.get("dspark_target_layer_ids")
    if dspark:
        if config.get("model_type") == "deepseek_v41":
            return _as_ids(dspark), "dspark_target_layer_ids"
        return _plus_one(dspark), "dspark_target_layer_ids (+1)"
    ids = _plus_one(config.get("target_layer_ids"))
    if ids:
        return ids, "target_layer_ids (+1)"
    for name in ("dflash_config", "eagle_config"):
        sub = config.get(name)
        if isinstance(sub, Mapping) and sub.get("layer_ids"):
            return _as_ids(sub["layer_ids"]), f"{name}.layer_ids"
    return None, None


def vllm_v1_ids(config: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, str | None]:
    """``(ids, key)`` the V1 runner reads (``None, None``: none; it uses its default)."""
    ids = _as_ids(config.get(KEY))
    if ids:
        return ids, KEY
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), Mapping) else {}
    found: tuple[tuple[int, ...] | None, str | None] = (None, None)
    plus = _plus_one(dflash.get("target_layer_ids"))
    if plus:
        found = (plus, "dflash_config.target_layer_ids (+1)")
    eagle = config.get("eagle_config")
    if isinstance(eagle, Mapping):
        nested = _as_ids(eagle.get(KEY))
        found = (nested, "eagle_config." + KEY) if nested else (None, None)
    return found


def deepseek_snapshots(ids: Sequence[int], num_layers: int) -> tuple[tuple[int, ...], str | None]:
    """What vLLM's DeepSeek model captures for ``ids``: ``(hs indices in layer order, why it
    fails)``; id ``L`` is the pre-norm final state, written ``L + 1`` (``final_prenorm``)."""
    L = num_layers
    if 0 in ids:
        return (), "id 0 adds a None residual at layer 0 (TypeError at the first forward, deepseek_v2.py:1561-1568)"
    bad = [v for v in ids if v > L]
    if bad:
        return (), f"ids {bad} are past the last layer {L}"
    return tuple(L + 1 if v == L else v for v in sorted(set(ids))), None


def vllm_reads(config: Mapping[str, Any], num_layers: int) -> list[ServerRead]:
    """What vLLM 0.33.0's V2 (default) and V1 runners would feed a draft with ``config``
    on an ``num_layers``-layer DeepSeek target."""
    L = num_layers
    out = []
    for label, fn, source in (("V2 (default)", vllm_v2_ids, V2_SOURCE), ("V1", vllm_v1_ids, V1_SOURCE)):
        ids, key = fn(config)
        if ids is None:
            ids, src = (2, L // 2, L - 3), f"{source}; default {DEFAULT_SOURCE}"
        else:
            src = source
        snaps, fails = deepseek_snapshots(ids, L)
        out.append(ServerRead(f"vllm {VLLM_VERSION} {label}", key, tuple(ids), snaps, fails, src))
    return out
