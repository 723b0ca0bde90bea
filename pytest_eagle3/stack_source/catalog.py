"""The facts the project's contracts rely on, per stack, as read from each stack's release.

Each :class:`~pytest_eagle3.stack_source.facts.Fact` names the file, the
function and the lines it was read from, in the release the project models:
vLLM 0.34.0, speculators 0.9.0 and SpecForge 0.2.0 (each read from its wheel,
``pip download --no-deps NAME==VERSION``, 2026-12-05), and the project code that
records it.  ``pytest-eagle3 stacks`` checks them against another copy (an
install, a newer wheel); ``tox -e stacks`` against the latest releases.
"""

from __future__ import annotations

from pytest_eagle3.stack_source.facts import Fact, Older
from pytest_eagle3.stack_source.readers import AssignedLiteral, Contains, KeysRead, Order, Returns

VLLM = "0.34.0"
SPECULATORS = "0.9.0"
SPECFORGE = "0.2.0"

_EAGLE3_UTILS = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
_V1_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
_DEEPSEEK = "vllm/model_executor/models/deepseek_v2.py"

#: The fact whose older behaviour (Model Runner V1 present) makes the project model vLLM 0.33's two runners.
V1_RUNNER_REMOVED = Fact(
    "vllm", "Model Runner V1 removed (no runner reads eagle_config's ids)", _V1_RUNNER, "", None, "absent", VLLM,
    "contracts/servers.py vllm_reads",
    (Older("0.33.0", "present",
           "its GPUModelRunner._get_eagle3_aux_layers_from_config (gpu_model_runner.py:5190-5224) reads "
           "eagle_config.eagle_aux_hidden_state_layer_ids too; contracts/servers.py models both runners"),),
)

VLLM_FACTS: tuple[Fact, ...] = (
    V1_RUNNER_REMOVED,
    Fact("vllm", "config keys the runner reads the aux layer ids from, in order", _EAGLE3_UTILS, "103-140",
         KeysRead("get_eagle3_aux_layers_from_config"),
         "hf_config.eagle_aux_hidden_state_layer_ids, hf_config.dflash_config, dflash_config.target_layer_ids, "
         "hf_config.dspark_target_layer_ids, hf_config.model_type, hf_config.target_layer_ids, "
         "drafter_config.layer_ids",
         VLLM, "contracts/servers.py vllm_v2_ids"),
    Fact("vllm", "the model's default when the config names no ids", _EAGLE3_UTILS, "15-35",
         Contains("set_eagle3_aux_hidden_state_layers",
                  ("aux_layers = get_eagle3_aux_layers_from_config(spec_config)",
                   "aux_layers = eagle3_model.get_eagle3_default_aux_hidden_state_layers()"), "aux_layers"),
         "aux_layers = get_eagle3_aux_layers_from_config(spec_config); "
         "aux_layers = eagle3_model.get_eagle3_default_aux_hidden_state_layers()",
         VLLM, "contracts/servers.py vllm_reads"),
    Fact("vllm", "default aux layer ids", "vllm/model_executor/models/interfaces.py", "1764-1785",
         Returns("SupportsEagle3.get_eagle3_default_aux_hidden_state_layers"),
         "(2, num_layers // 2, num_layers - 3)", VLLM, "contracts/servers.py vllm_reads, contracts/stacks_vllm.py vllm"),
    Fact("vllm", "DeepSeek capture point: hidden_states + residual before layer idx (hs[idx])", _DEEPSEEK,
         "1508-1592",
         Order("DeepseekV2Model.forward", "aux_hidden_state = hidden_states + residual", "= layer("),
         "`aux_hidden_state = hidden_states + residual` before `= layer(`", VLLM,
         "contracts/stacks_vllm.py vllm, contracts/servers.py deepseek_snapshots"),
    Fact("vllm", "DeepSeek id L: the last layer's output before the final norm", _DEEPSEEK, "1508-1592",
         Order("DeepseekV2Model.forward", "aux_hidden_states.append(hidden_states + residual)",
               "= self.norm(hidden_states, residual)"),
         "`aux_hidden_states.append(hidden_states + residual)` before `= self.norm(hidden_states, residual)`",
         VLLM, "contracts/stacks_vllm.py vllm (final_layer)"),
)

SPECULATORS_FACTS: tuple[Fact, ...] = (
    Fact("speculators", "default target layer ids", "speculators/models/utils.py", "99-140",
         AssignedLiteral("resolve_target_layer_ids", "target_layer_ids"),
         "[2, num_layers // 2, num_layers - 3]", SPECULATORS, "contracts/stacks_vllm.py speculators"),
    Fact("speculators", "config key: eagle_aux_hidden_state_layer_ids at the top level",
         "speculators/models/eagle3/config.py", "15-119",
         Contains("Eagle3SpeculatorConfig", ("eagle_aux_hidden_state_layer_ids: list[int] | None",), "layer_ids"),
         "eagle_aux_hidden_state_layer_ids: list[int] | None", SPECULATORS,
         "contracts/draft.py (the ids' key), contracts/stacks_vllm.py speculators"),
    Fact("speculators", "fc takes every capture but the last, in capture order; the last is the verifier's",
         "speculators/train/data.py", "274-333",
         Contains("ArrowDataset._get_raw_data", ("loaded_hs['hidden_states'][:, :-1].flatten(1)",
                                                  "loaded_hs['hidden_states'][:, -1]"), "hidden_states"),
         "loaded_hs['hidden_states'][:, :-1].flatten(1); loaded_hs['hidden_states'][:, -1]", SPECULATORS,
         "contracts/stacks_vllm.py speculators (verifier_last)"),
    Fact("speculators", "verifier state: pre-norm, normed by a frozen verifier_norm", "speculators/models/eagle3/core.py",
         "193-365",
         Contains("Eagle3DraftModel.forward",
                  ("self.verifier_lm_head(self.verifier_norm(verifier_last_hidden_states))",), "verifier"),
         "self.verifier_lm_head(self.verifier_norm(verifier_last_hidden_states))", SPECULATORS,
         "contracts/stacks_vllm.py speculators (FINAL_PRENORM)"),
)

_PROVIDERS = "specforge/algorithms/model_providers.py"

SPECFORGE_FACTS: tuple[Fact, ...] = (
    Fact("specforge", "default capture layers", _PROVIDERS, "188-211",
         AssignedLiteral("resolve_eagle_capture_layers", "layers"),
         "[1, num_layers // 2 - 1, num_layers - 4]", SPECFORGE,
         "contracts/stacks_specforge.py specforge_default_ids"),
    Fact("specforge", "ids from the run option, else eagle_config's key; exactly 3", _PROVIDERS, "188-211",
         Contains("resolve_eagle_capture_layers",
                  ("layers = cfg.model.aux_hidden_state_layer_ids",
                   "layers = eagle_config.get('eagle_aux_hidden_state_layer_ids')", "len(layers) != 3"), "layers"),
         "layers = cfg.model.aux_hidden_state_layer_ids; layers = eagle_config.get('eagle_aux_hidden_state_layer_ids'); "
         "len(layers) != 3", SPECFORGE, "contracts/stacks_specforge.py specforge, contracts/specforge_run.py"),
    Fact("specforge", "captures through SGLang only (no HF target backend)", "specforge/config/schema.py", "37-126",
         Contains("ModelConfig", ("target_backend: Literal['sglang'] = 'sglang'",), "target_backend"),
         "target_backend: Literal['sglang'] = 'sglang'", SPECFORGE, "contracts/stacks_specforge.py specforge"),
    Fact("specforge", "capture layers handed to SGLang's set_eagle3_layers_to_capture",
         "specforge/offline_capture/sglang_backend/capture.py", "86-87",
         Contains("OfflineSGLangCaptureBackend.set_eagle3_capture_layers",
                  ("self.model_runner.model.set_eagle3_layers_to_capture(layer_ids)",), "capture"),
         "self.model_runner.model.set_eagle3_layers_to_capture(layer_ids)", SPECFORGE,
         "contracts/stacks_specforge.py specforge_sglang"),
    Fact("specforge", "the SGLang its data is captured with", "METADATA", "", None, "sglang==0.5.14", SPECFORGE,
         "contracts/stacks_specforge.py SPECFORGE_SGLANG"),
)

#: Facts per distribution name.
FACTS: dict[str, tuple[Fact, ...]] = {
    "vllm": VLLM_FACTS,
    "speculators": SPECULATORS_FACTS,
    "specforge": SPECFORGE_FACTS,
}
