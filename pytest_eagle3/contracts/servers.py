"""Which layers vLLM would feed a draft, from its ``config.json`` alone.

vLLM 0.34.0 has one GPU model runner: Model Runner V1 is gone
(``vllm/v1/worker/gpu_model_runner.py`` is not in the wheel, and
``vllm/platforms/interface.py:1481-1490`` refuses ``VLLM_USE_V2_MODEL_RUNNER``
other than ``1``: "Model Runner V1 has been removed").  Read in the released
0.34.0 wheel (``pip download --no-deps vllm==0.34.0``):

* ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:103-140``
  ``get_eagle3_aux_layers_from_config`` takes, the first that is set: the
  top-level ``eagle_aux_hidden_state_layer_ids`` as given;
  ``dflash_config.target_layer_ids`` + 1; ``dspark_target_layer_ids`` + 1
  (as given for ``model_type`` ``deepseek_v41``); a top-level
  ``target_layer_ids`` + 1; ``dflash_config.layer_ids`` or
  ``eagle_config.layer_ids`` as given.  It never reads
  ``eagle_config.eagle_aux_hidden_state_layer_ids``: a draft that keeps its
  ids only there (a layout SGLang reads) is served vLLM's default
  (:func:`nested_ids_ignored`).
* With nothing found, ``set_eagle3_aux_hidden_state_layers``
  (``eagle3_utils.py:15-30``) falls back to
  ``get_eagle3_default_aux_hidden_state_layers``
  (``vllm/model_executor/models/interfaces.py:1764-1785``): ``(2, L//2, L-3)``.

vLLM 0.33.0 also had Model Runner V1, whose
``vllm/v1/worker/gpu_model_runner.py:5190-5224`` read the nested key as well;
:func:`vllm_reads` models both runners of 0.33 only where the installed vLLM
still has that runner's file (read, whatever its version number).  For DeepSeek
(``vllm/model_executor/models/deepseek_v2.py:1508-1593``, unchanged in 0.34.0)
an id ``v`` captures ``hidden_states + residual`` before layer ``v``
(``hs[v]``), in layer order; id ``L`` captures the last layer's output before
the final norm; id 0 adds a None residual (TypeError at the first forward).  A
speculators-format config (``speculators_config``) is mapped by
``vllm/transformers_utils/configs/speculators/algos.py:16-50`` with its
top-level ids kept, so the runner reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pytest_eagle3.stack_source.catalog import V1_RUNNER_REMOVED
from pytest_eagle3.stack_source.facts import OLDER, check
from pytest_eagle3.stack_source.files import StackFiles, installed as installed_stack

KEY = "eagle_aux_hidden_state_layer_ids"
#: The modelled release and where each fact was read in its wheel.
VLLM_VERSION = "0.34.0"
V2_SOURCE = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:103-140"
DEFAULT_SOURCE = "vllm/model_executor/models/interfaces.py:1764-1785"
#: vLLM 0.33.0 (both runners), modelled where the installed vLLM still has Model Runner V1.
V033_VERSION = "0.33.0"
V2_SOURCE_033 = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:113-150"
V1_SOURCE = "vllm/v1/worker/gpu_model_runner.py:5190-5224"
DEFAULT_SOURCE_033 = "vllm/model_executor/models/interfaces.py:1751-1772"
#: A draft whose ids only the nested key holds, on a runner that never reads it.
NESTED_IGNORED = ("vLLM {since} ignores eagle_config.{key} {ids}: it would serve its default (2, L//2, L-3) = "
                  "{default}; move the ids to the top level of config.json ({key})")
_PROBE = object()


@dataclass(frozen=True)
class ServerRead:
    """What one server would read from a draft config and capture for it.

    Attributes:
        server: ``"vllm 0.34.0"``, ``"vllm 0.33.0 V1 (installed)"`` and the like.
        key: the config key the ids came from (``None``: none, the default).
        ids: the layer ids the server uses (its default when ``key`` is None).
        snapshots: ``hs`` indices captured, in layer order (``L + 1`` = ``final_prenorm``);
            empty when it fails.
        fails: why capturing fails (id 0 on DeepSeek, an id past ``L``), else None.
        source: the file and lines the reading comes from.
        note: why the ids the draft declares are not the ones read
            (:data:`NESTED_IGNORED`), else None.
    """

    server: str
    key: str | None
    ids: tuple[int, ...]
    snapshots: tuple[int, ...]
    fails: str | None
    source: str
    note: str | None = None

    def describe(self, snapshot_text: Callable[[int], str] | None = None) -> str:
        """One line; ``snapshot_text`` writes a snapshot index (default ``hs[i]``)."""
        read = f"{self.key} {list(self.ids)}" if self.key else f"no ids: its default {list(self.ids)}"
        text = snapshot_text or (lambda i: f"hs[{i}]")
        got = f"fails: {self.fails}" if self.fails else "captures [" + ", ".join(text(i) for i in self.snapshots) + "]"
        return f"{self.server}: reads {read}; {got} ({self.source})" + (f"; {self.note}" if self.note else "")


def _plus_one(values: Any) -> tuple[int, ...] | None:
    if not values:
        return None
    return tuple(int(v) + 1 for v in values)


def _as_ids(values: Any) -> tuple[int, ...] | None:
    if not values:
        return None
    return tuple(int(v) for v in values)


def vllm_v2_ids(config: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, str | None]:
    """``(ids, key)`` the runner reads (0.34.0's only one, 0.33's V2; ``None, None``:
    none, it uses its default)."""
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
    """``(ids, key)`` vLLM 0.33's V1 runner reads (``None, None``: none; it uses its
    default); removed in 0.34.0."""
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


def installed_vllm() -> StackFiles | None:
    """The installed vLLM's files (read, never imported), or ``None``."""
    return installed_stack("vllm")


def has_v1_runner(files: StackFiles) -> bool:
    """Whether this copy of vLLM still has Model Runner V1 (0.33's behaviour), read from
    its files (:data:`pytest_eagle3.stack_source.catalog.V1_RUNNER_REMOVED`), whatever
    its version number says."""
    return check(V1_RUNNER_REMOVED, files).status == OLDER


def nested_ids_ignored(config: Mapping[str, Any], num_layers: int, *, since: str = ">= 0.34") -> str | None:
    """:data:`NESTED_IGNORED` when ``config`` keeps its ids only under
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` and vLLM's runner
    (``eagle3_utils.py:103-140``) reads none of its keys, else ``None``."""
    eagle = config.get("eagle_config")
    nested = _as_ids(eagle.get(KEY)) if isinstance(eagle, Mapping) else None
    if nested is None or vllm_v2_ids(config)[0] is not None:
        return None
    L = num_layers
    return NESTED_IGNORED.format(since=since, key=KEY, ids=list(nested), default=[2, L // 2, L - 3])


def vllm_reads(config: Mapping[str, Any], num_layers: int, installed: "StackFiles | None | object" = _PROBE
               ) -> list[ServerRead]:
    """What vLLM would feed a draft with ``config`` on an ``num_layers``-layer
    DeepSeek target: vLLM 0.34.0's one runner; where the installed vLLM
    (``installed``: its files, default :func:`installed_vllm`; ``None``: none)
    still has Model Runner V1 (:func:`has_v1_runner`, as 0.33 does), 0.33's V2
    (default) and V1 runners instead."""
    L = num_layers
    files = installed_vllm() if installed is _PROBE else installed
    assert files is None or isinstance(files, StackFiles)
    if files is not None and has_v1_runner(files):
        version = files.version
        runners = ((f"vllm {version} V2 (default; installed)", vllm_v2_ids, V2_SOURCE_033, "0.33 V2"),
                   (f"vllm {version} V1 (installed)", vllm_v1_ids, V1_SOURCE, None))
        default = DEFAULT_SOURCE_033
    else:
        runners = ((f"vllm {VLLM_VERSION}", vllm_v2_ids, V2_SOURCE, ">= 0.34"),)
        default = DEFAULT_SOURCE
    out = []
    for label, fn, source, since in runners:
        ids, key = fn(config)
        if ids is None:
            ids, src = (2, L // 2, L - 3), f"{source}; default {default}"
        else:
            src = source
        snaps, fails = deepseek_snapshots(ids, L)
        note = nested_ids_ignored(config, L, since=since) if since else None
        out.append(ServerRead(label, key, tuple(ids), snaps, fails, src, note))
    return out
