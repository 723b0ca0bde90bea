"""Read the aux hidden states a running SGLang captures, through its public API.

Two ways exist; the installed SGLang's flags decide (never its version number):

* ``capture-only`` (sglang 0.5.23+): ``--enable-return-aux-hidden-states
  --speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids ...``
  captures on the target without a draft (``srt/arg_groups/validation_hook.py``,
  ``handle_aux_hidden_state_capture``).
* ``eagle3-draft`` (the draft path, any SGLang that serves DeepSeek EAGLE-3):
  ``--enable-return-hidden-states`` with an EAGLE-3 draft loaded through
  ``--speculative-draft-model-path``; ``meta_info["hidden_states"]`` then holds
  the concatenated aux states fed to the draft (prefill rows, then the
  accepted target-verify rows; :mod:`pytest_eagle3.capture.draft_path`).  The
  capture tests use a random-weights draft per id list
  (:mod:`pytest_eagle3.draft.random_draft`); SGLang reads the ids from its
  ``config.json``.

With ``return_hidden_states=True`` a request's ``meta_info["hidden_states"]``
is a list: entry 0 is the prefill ``[prompt_tokens, K*H]``, then one ``[K*H]``
row per decode step (measured on 0.5.23: ``max_new_tokens=2`` gives
``[(T, K*H), (K*H,)]``).  The radix cache must be off, or a repeated prompt
returns only its uncached rows (:func:`pytest_eagle3.engine.config.base_server_args`).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_eagle3.sglang_source.install import SGLangInstall
from pytest_eagle3.errors import Eagle3Error
from pytest_eagle3.engine.config import build_engine_config
from pytest_eagle3.engine.cuda.recipe import cuda_recipe
from pytest_eagle3.engine.gpus import PLAN_GPU_ARCH, detect_gpu_arch
from pytest_eagle3.engine.spec_shapes import CPU_SPEC_OVERLAP
from pytest_eagle3.engine.variants import CPU_ALLREDUCE_FUSION
from pytest_eagle3.worker.cpu.spec_overlap import OVERLAP_ENV
from pytest_eagle3.capture.draft_path import draft_path_server_args
from pytest_eagle3.capture.response import Captures, parse_response
from pytest_eagle3.settings import Settings
from pytest_eagle3.worker.env import FAULT_ENV, ID_SWITCH_ENV

if TYPE_CHECKING:
    from pytest_eagle3.engine.config import EngineConfig
    from pytest_eagle3.engine.cuda.recipe import CudaRecipe
    from pytest_eagle3.engine.server import SGLangServer
    from pytest_eagle3.target.spec import TargetFacts


CAPTURE_ONLY = "capture-only"
EAGLE3_DRAFT = "eagle3-draft"

NO_CAPTURE_API = (
    "{sglang} cannot return aux hidden states: it has neither "
    "--enable-return-aux-hidden-states nor --enable-return-hidden-states"
)
NEEDS_DRAFT = (
    "{sglang} has no --enable-return-aux-hidden-states (added in 0.5.23); reading "
    "its captures needs a real EAGLE-3 draft checkpoint (--eagle3-draft PATH)"
)


class Eagle3CaptureUnsupported(Eagle3Error):
    """The installed SGLang cannot expose its captures in the requested way."""


def select_method(install: SGLangInstall, *, draft_path: str | None = None, prefer: str = "auto") -> str:
    """The capture method to use: :data:`CAPTURE_ONLY` or :data:`EAGLE3_DRAFT`.

    ``prefer`` (``--eagle3-capture-method``): ``auto`` takes capture-only where
    the installed SGLang has it and no draft is given, else the draft path;
    ``capture-only`` / ``eagle3-draft`` force one.  Decided from the installed
    SGLang's flags, never its version.

    Raises:
        Eagle3CaptureUnsupported: the method is missing (the message says what is missing).
    """
    has_capture_only = install.has_arg("enable_return_aux_hidden_states")
    has_draft_path = install.has_arg("enable_return_hidden_states") or install.has_arg("return_hidden_states_mode")
    if prefer == CAPTURE_ONLY or (prefer == "auto" and draft_path is None and has_capture_only):
        if not has_capture_only:
            raise Eagle3CaptureUnsupported(NEEDS_DRAFT.format(sglang=install.describe()))
        return CAPTURE_ONLY
    if has_draft_path:
        return EAGLE3_DRAFT
    raise Eagle3CaptureUnsupported(NO_CAPTURE_API.format(sglang=install.describe()))


def capture_server_args(
    install: SGLangInstall, layer_ids: Sequence[int] | None, *, draft_path: str | None = None
) -> dict[str, Any]:
    """Server arguments that make SGLang capture ``layer_ids`` (``None``: its default list).

    Capture-only: the ids are passed exactly as a draft config would declare
    them; SGLang's own rule maps them to layers (see
    :mod:`pytest_eagle3.conventions`).  Draft path (``draft_path``
    given): SGLang runs EAGLE-3 with that draft and reads the ids from its
    ``config.json`` (:func:`pytest_eagle3.capture.draft_path.draft_path_server_args`).
    """
    if draft_path is not None:
        return draft_path_server_args(install, draft_path)
    select_method(install, prefer=CAPTURE_ONLY)
    args: dict[str, Any] = {
        "enable_return_aux_hidden_states": True,
        "speculative_algorithm": "EAGLE3",
    }
    if layer_ids is not None:
        args["return_aux_hidden_state_layer_ids"] = list(layer_ids)
    return args


def engine_config(install: SGLangInstall, settings: Settings, *, model_path: str, tp: int,
                  ids: Sequence[int] | None, extra_args: Mapping[str, Any] | None = None,
                  facts: "TargetFacts | None" = None, draft: str | None = None) -> "EngineConfig":
    """The engine that captures ``ids`` with ``extra_args``: the one the
    ``eagle3_capture`` fixture starts and ``--eagle3-plan`` prints.  On cuda the
    device defaults come from :func:`cuda_recipe_for` (``facts``: the target's
    MLA widths and dtype).

    Raises:
        Eagle3CaptureUnsupported: this SGLang cannot return captures this way.
    """

    # Under DP attention a rank may serve none of a request's forwards, and so never
    # switch before it: one engine per list there.
    dp = any(k in (extra_args or {}) for k in ("attn_dp_size", "enable_dp_attention"))
    switch = switches_ids(install, settings, facts, ids, draft) and not dp
    args = capture_server_args(install, list(ids) if ids is not None and not switch else None, draft_path=draft)
    args.update(extra_args or {})
    # A variant's CPU stand-in switch (engine/variants.py cpu_args) is ours, not SGLang's.
    fusion = bool(args.pop(CPU_ALLREDUCE_FUSION, settings.cpu_allreduce_fusion))
    overlap = bool(args.pop(CPU_SPEC_OVERLAP, False))  # a speculative shape's CPU switch (engine/spec_shapes.py)
    cuda = cuda_recipe_for(install, settings, facts) if settings.device == "cuda" else None
    extra_env = {ID_SWITCH_ENV: "1"} if switch else {}
    if overlap:
        extra_env[OVERLAP_ENV] = "1"
    if settings.fault:
        extra_env[FAULT_ENV] = str(settings.fault)
    return build_engine_config(install, model_path=model_path, tp=tp, device=settings.device,
                               test_args=args, user_args=settings.sglang_args, cuda=cuda, extra_env=extra_env,
                               norm_path=settings.cpu_norm, allreduce_fusion=fusion)


#: Architectures whose capture the id switch serves (``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture``).
SWITCH_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")
#: Ids per list the switch serves: the length of SGLang's default list, whose
#: packer width the engine starts with (``[2, L//2, L-3]``).
SWITCH_IDS = 3


def switches_ids(install: SGLangInstall, settings: Settings, facts: "TargetFacts | None",
                 ids: Sequence[int] | None, draft: str | None) -> bool:
    """Whether the engine for ``ids`` is the run's one capture-only engine at its TP
    size that switches ids between requests (:mod:`pytest_eagle3.worker.id_switch`):
    on cpu (no CUDA graph keeps the layers it was captured with), capture-only
    (a draft's ids come from its ``config.json``), a DeepSeek-V3-layout target,
    an SGLang with ``HookRegistry`` (``srt/plugins/hook_registry.py``),
    :data:`SWITCH_IDS` ids (or SGLang's default), and no
    ``--sglang-arg return_aux_hidden_state_layer_ids`` (the user's ids win, as a
    bisect that feeds a wrong list expects)."""
    if settings.device != "cpu" or draft is not None or not settings.id_switch:
        return False
    if any(name.replace("-", "_") == "return_aux_hidden_state_layer_ids" for name, _ in settings.sglang_args):
        return False  # the user's --sglang-arg names the ids: SGLang captures those, as the user asked
    if facts is None or facts.architecture not in SWITCH_ARCHITECTURES:
        return False
    if ids is not None and len(ids) != SWITCH_IDS:
        return False
    return bool(install.location) and install.source("srt/plugins/hook_registry.py") is not None


def cuda_recipe_for(install: SGLangInstall, settings: Settings, facts: "TargetFacts | None") -> "CudaRecipe":
    """The CUDA recipe for the run's GPU (``nvidia-smi``; ``--eagle3-plan`` on a
    machine without one assumes :data:`~pytest_eagle3.engine.gpus.PLAN_GPU_ARCH`)."""

    arch = detect_gpu_arch() or (PLAN_GPU_ARCH if settings.plan else None)
    return cuda_recipe(install, arch=arch,
                       kv_lora_rank=facts.kv_lora_rank if facts else None,
                       qk_rope_head_dim=facts.qk_rope_head_dim if facts else None,
                       torch_dtype=facts.torch_dtype if facts else "bfloat16")


def capture(
    server: "SGLangServer",
    prompts: Sequence[Sequence[int]],
    *,
    decode_steps: int = 0,
    batch: bool = False,
) -> list[Captures]:
    """Run greedy generation on ``prompts`` and return each request's captures.

    Each request carries a request id (``rid``, ``eagle3-<random>-<i>``) that
    the per-rank recorder stores with every forward, so forwards the test did
    not send (a health check, another client) are never compared.

    Args:
        server: a started server configured with :func:`capture_server_args`.
        prompts: token-id prompts.
        decode_steps: decode rows wanted per prompt (``max_new_tokens = 1 + decode_steps``).
        batch: send all prompts in one batched request instead of one by one.
    """
    sampling = {"max_new_tokens": 1 + decode_steps, "temperature": 0.0, "ignore_eos": True}
    tag = f"eagle3-{uuid.uuid4().hex[:12]}"
    rids = [f"{tag}-{i}" for i in range(len(prompts))]
    if batch:
        payload = {"input_ids": [list(p) for p in prompts], "sampling_params": sampling,
                   "return_hidden_states": True, "rid": rids}
        responses = server.generate(payload)
        out = [parse_response(r, p, i) for i, (r, p) in enumerate(zip(responses, prompts))]
    else:
        out = []
        for i, prompt in enumerate(prompts):
            payload = {"input_ids": list(prompt), "sampling_params": sampling,
                       "return_hidden_states": True, "rid": rids[i]}
            out.append(parse_response(server.generate(payload), prompt, i))
    for captures, rid in zip(out, rids):
        captures.rid = captures.rid or rid
    return out
