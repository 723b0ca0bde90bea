"""The identity of one SGLang engine: checkpoint, TP size, device, server args, env.

Two tests that need the same :class:`EngineConfig` share one running server
(:mod:`pytest_eagle3.engine.pool`).  The GPU tier and the CPU tier build their
configs through the same function; only the device-specific defaults differ.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from pytest_eagle3.sglang_source import env_fills
from pytest_eagle3.engine.cpu import recipe
from pytest_eagle3.engine.cuda.recipe import CudaRecipe
from pytest_eagle3.sglang_source.install import SGLangInstall
from pytest_eagle3.sglang_source.norm_code import AUTO, resolve_norm_path
from pytest_eagle3.sglang_source.pp_code import PP_SPEC_SWITCH, read_pp_code
from pytest_eagle3.worker.env import RECORD_TARGET_ENV
from pytest_eagle3.worker.upstream_fixes import relay_named
from pytest_eagle3.worker.recorder_hook import TARGET as RECORD_TARGET
from pytest_eagle3.worker.env import HOOKS_ENV, INPUT_SCATTERED_ENV, ROUTE_PROOF_ENV
from pytest_eagle3.worker.sglang_hooks import SITE_HOOK_DIR
from pytest_eagle3.errors import Eagle3ConfigError

UNKNOWN_ARG = (
    "{origin} {name}: the installed {sglang} has no --{flag} server argument "
    "(check the spelling, or this test needs a newer SGLang)"
)


CPU_TOPK = (
    "speculative_eagle_topk={topk}: {sglang}'s CPU attention backend (intel_amx_backend.py) hands "
    "no tree mask to extend_attention_cpu, so the CPU tier runs EAGLE with topk 1 only there; "
    "use topk 1 or the GPU tier"
)


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class EngineConfig:
    """Hashable description of one engine.

    Attributes:
        model_path: checkpoint directory.
        tp: tensor-parallel size.
        device: ``cpu`` or ``cuda``.
        server_args: sorted ``(name, value)`` pairs (names with underscores;
            lists frozen to tuples), excluding host/port.
        env: sorted ``(name, value)`` environment overrides.
    """

    model_path: str
    tp: int
    device: str
    server_args: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...]
    #: Names of the args set by the test or the user (shown in summaries).
    chosen: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        blob = json.dumps(
            [self.model_path, self.tp, self.device, self.server_args, self.env],
            default=str, sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    @property
    def name(self) -> str:
        """Short unique label, e.g. ``tp2-cpu-1a2b3c4d5e``."""
        return f"tp{self.tp}-{self.device}-{self.key}"

    def args(self) -> dict[str, Any]:
        """Server arguments as a plain dict (lists restored)."""
        return {k: _thaw(v) for k, v in self.server_args}

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def describe(self, *, full: bool = False) -> str:
        """One line: TP, device and the args the test or user chose (``full``: every arg)."""
        parts = [f"tp={self.tp}", f"device={self.device}"]
        parts += [
            f"{k}={_thaw(v)!r}" for k, v in self.server_args
            if k not in ("model_path", "tp_size", "device") and (full or k in self.chosen)
        ]
        return " ".join(parts)


def base_server_args(model_path: str, tp: int) -> dict[str, Any]:
    """Arguments every engine gets: the checkpoint, TP, no tokenizer, no radix cache.

    The radix cache is disabled because a repeated prompt would return only the
    uncached rows of its aux hidden states (docs/design.md, "SGLang facts").
    """
    return {
        "model_path": model_path,
        "tp_size": tp,
        "skip_tokenizer_init": True,
        "disable_radix_cache": True,
        "random_seed": 0,
    }


#: Server arguments that put an engine on one of SGLang's reduce-scatter routes
#: (attention DP; input-scattered attention): :mod:`pytest_eagle3.engine.route_proof`.
REDUCE_SCATTER_ARGS = ("attn_dp_size", "enable_dp_attention", "enable_attn_tp_input_scattered")


def attention_dp_size(args: Mapping[str, Any]) -> int:
    """The attention DP size server ``args`` ask for (``--attn-dp-size``, or the older
    ``--enable-dp-attention`` with ``--dp-size``); 1 without attention DP."""
    dp = args.get("attn_dp_size") or (args.get("dp_size") if args.get("enable_dp_attention") else None)
    try:
        return max(1, int(dp or 1))
    except (TypeError, ValueError):
        return 1


def has_draft(args: Mapping[str, Any]) -> bool:
    """Whether server ``args`` load a speculative draft checkpoint (EAGLE/EAGLE-3).

    Capture-only engines (``--speculative-algorithm EAGLE3`` with
    ``--enable-return-aux-hidden-states`` and no draft) are not: they never run
    a draft model and keep the plain CPU recipe.
    """
    return bool(args.get("speculative_draft_model_path"))


def speculative_server_args(
    install: SGLangInstall,
    draft_path: str | Path,
    *,
    steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int | None = None,
    algorithm: str = "EAGLE3",
) -> dict[str, Any]:
    """Server arguments that run EAGLE-3 speculative decoding with the draft at ``draft_path``.

    SGLang reads the draft's ``config.json`` itself, including
    ``eagle_config.eagle_aux_hidden_state_layer_ids``: exactly what users ship.
    ``num_draft_tokens`` defaults to ``steps + 1`` (a chain when ``topk == 1``).
    On ``--device cpu`` :func:`build_engine_config` switches attention to
    ``intel_amx`` for such an engine (EAGLE refuses ``torch_native``).

    Raises:
        Eagle3ConfigError: the installed SGLang lacks one of the flags, or the
            sizes are out of range.
    """
    if steps < 1 or topk < 1:
        raise Eagle3ConfigError(f"speculative steps and topk must be >= 1, got steps={steps}, topk={topk}")
    if num_draft_tokens is None:
        num_draft_tokens = steps + 1 if topk == 1 else steps * topk + 1
    if num_draft_tokens < 2:
        raise Eagle3ConfigError(f"speculative num_draft_tokens must be >= 2, got {num_draft_tokens}")
    args: dict[str, Any] = {
        "speculative_algorithm": algorithm,
        "speculative_draft_model_path": str(draft_path),
        "speculative_num_steps": int(steps),
        "speculative_eagle_topk": int(topk),
        "speculative_num_draft_tokens": int(num_draft_tokens),
    }
    missing = [name for name in args if not install.has_arg(name)]
    if missing:
        raise Eagle3ConfigError(
            f"{install.describe()} cannot run {algorithm} speculative decoding: no "
            + ", ".join("--" + m.replace("_", "-") for m in missing)
        )
    return args


def _config(model_path: Any) -> dict[str, Any]:
    """The checkpoint's ``config.json`` (``{}`` when it cannot be read)."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _architecture(model_path: Any) -> str:
    """The first ``architectures`` entry of the checkpoint's ``config.json``
    (DeepSeek-V3's when it cannot be read); read once per engine."""
    archs = _config(model_path).get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return "DeepseekV3ForCausalLM"


def build_engine_config(
    install: SGLangInstall,
    *,
    model_path: str,
    tp: int,
    device: str,
    test_args: Mapping[str, Any] | None = None,
    user_args: Iterable[tuple[str, Any]] = (),
    cuda: "CudaRecipe | None" = None,
    extra_env: Mapping[str, str] | None = None,
    norm_path: str = AUTO,
    allreduce_fusion: bool = False,
) -> EngineConfig:
    """Compose an engine: base args, then device defaults, the test's args, the user's.

    Later layers win.  Every name is checked against the installed SGLang's flags.
    On cpu an engine that loads a draft (:func:`has_draft`), or whose
    architecture the installed SGLang refuses on ``torch_native`` (gpt-oss),
    gets ``intel_amx`` attention and the hook that keeps it
    (:func:`pytest_eagle3.engine.cpu.recipe.cpu_server_args`); a test or user
    ``attention_backend`` still wins.

    On cuda, ``cuda`` (:func:`pytest_eagle3.engine.cuda.recipe.cuda_recipe`)
    gives the device defaults: bf16, the attention backend the kernels accept,
    CUDA graphs on, a small KV pool.

    ``norm_path`` (cpu only): ``auto`` runs SGLang's in-place AMX norm branch
    where the installed ``layernorm.py`` has one the stand-in kernels serve
    (:func:`pytest_eagle3.sglang_source.norm_code.resolve_norm_path`), ``inplace`` the
    same, ``native`` the out-of-place ``forward_native``.  ``allreduce_fusion``
    (cpu, ``tp > 1``): SGLang's fused all-reduce + add + RMSNorm path with a gloo
    stand-in for the fused op (:mod:`pytest_eagle3.worker.cpu.allreduce_fusion`).

    Raises:
        Eagle3ConfigError: an argument the installed SGLang does not accept.
    """
    chosen: list[str] = []
    layers: dict[str, Any] = {}
    for origin, layer in (("test argument", dict(test_args or {})), ("--sglang-arg", dict(user_args))):
        for name, value in layer.items():
            name = name.replace("-", "_")
            if not install.has_arg(name):
                raise Eagle3ConfigError(
                    UNKNOWN_ARG.format(origin=origin, name=name, sglang=install.describe(),
                                       flag=name.replace("_", "-"))
                )
            layers[name] = value
            chosen.append(name)
    args: dict[str, Any] = base_server_args(model_path, tp)
    env: dict[str, str] = {}
    architecture = _architecture(model_path)
    pp = int(layers.get("pp_size") or 1)
    if device == "cpu":
        speculative = has_draft(layers)
        if speculative and int(layers.get("speculative_eagle_topk") or 1) > 1 and not install.cpu_tree_mask:
            raise Eagle3ConfigError(CPU_TOPK.format(topk=layers["speculative_eagle_topk"],
                                                    sglang=install.describe()))
        amx = speculative or recipe.refuses_plain_attention(install.location, architecture) is not None
        args.update(recipe.cpu_server_args(speculative=speculative, amx_attention=amx))
        env.update(recipe.cpu_env(tp * pp, amx_attention=amx
                                  and layers.get("attention_backend", recipe.SPECULATIVE_ATTENTION)
                                  == recipe.SPECULATIVE_ATTENTION,
                                  norm_path=resolve_norm_path(norm_path, install.norm_code())[0],
                                  allreduce_fusion=allreduce_fusion and tp > 1
                                  and install.fusion_code().refusal is None))
        if speculative and install.spec_v2_cpu_gap:
            env[recipe.SPEC_V2_ENV] = "False"
        env.update(recipe.linear_attention_env(_config(model_path)))
        if layers.get("enable_attn_tp_input_scattered") and tp > 1:
            # SGLang's own context decides; on CPU only its device condition is stood in
            # (worker/cpu/patches.py input_scattered_platform).
            env[INPUT_SCATTERED_ENV] = "1"
        for fill in env_fills.env_fills(install, install.model_code(architecture).file):
            env[fill.name] = fill.value
    elif device == "cuda" and cuda is not None:
        args.update(cuda.args)
    if tp > 1 and any(layers.get(name) for name in REDUCE_SCATTER_ARGS):
        # An engine on a reduce-scatter route logs each forward's reduce-scatters
        # (worker/reduce_scatter_proof.py; read by engine/route_proof.py).
        env[ROUTE_PROOF_ENV] = "1"
    # A self-test fault (worker/faults.py) is part of the engine's env, so of its key.
    env.update(extra_env or {})
    # The per-rank recorder, idle until a test enables it (worker/recorder_hook.py),
    # on the forward whose loop captures for this architecture (read from its model file).
    env[HOOKS_ENV] = ",".join(x for x in (env.get(HOOKS_ENV), "record") if x)
    forward = install.model_code(architecture).capture_forward if install.location else None
    if forward is not None and forward != RECORD_TARGET:
        env[RECORD_TARGET_ENV] = forward
    if not install.general_plugins:
        # No sglang.srt.plugins: the hooks come in through our sitecustomize.
        base = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = str(SITE_HOOK_DIR) + (os.pathsep + base if base else "")
    args.update(layers)
    if pp > 1 and install.location:
        pp_code = read_pp_code(install.location, architecture)
        if "disable_overlap_schedule" not in layers and pp_code.overlap_gate is not None:
            # SGLang refuses PP with its overlap schedule (0.5.23 validation_hook.py:121), as a user finds out.
            args["disable_overlap_schedule"] = True
        if (has_draft(layers) and pp_code.spec_switch is not None and PP_SPEC_SWITCH not in os.environ
                and layers.get("disaggregation_mode") in (None, "null")):
            # Speculative decoding at PP outside PD prefill runs SGLang's PP relay behind this switch
            # (a user's own value of it wins).
            env.setdefault(PP_SPEC_SWITCH, "1")
        if device == "cuda" and "disable_cuda_graph" not in layers and relay_named():
            # The relayed captures have no CUDA-graph buffer (worker/pp_relay.py): eager forwards.
            args["disable_cuda_graph"] = True
    if (device == "cpu" and install.location and not args.get("disable_radix_cache")
            and "disable_overlap_schedule" not in layers
            and recipe.refuses_mamba_overlap(install.location, _config(model_path)) is not None):
        # A hybrid linear-attention model with the radix cache on: SGLang refuses its
        # overlap schedule's cache strategy on CPU (recipe.refuses_mamba_overlap), as a user finds out.
        args["disable_overlap_schedule"] = True
    for name in list(args):
        if not install.has_arg(name):
            # A default this fork does not know (e.g. skip_server_warmup on old versions).
            del args[name]
    return EngineConfig(
        model_path=str(model_path),
        tp=tp,
        device=device,
        server_args=tuple(sorted((k, _freeze(v)) for k, v in args.items())),
        env=tuple(sorted(env.items())),
        chosen=tuple(dict.fromkeys(chosen)),
    )
