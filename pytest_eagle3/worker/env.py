"""The environment variables the engine host sets for SGLang's processes.

They are the whole interface between the test process and the code in
:mod:`pytest_eagle3.worker`: the host writes them into an engine's environment
(:mod:`pytest_eagle3.engine.config`), and the hooks read them in every SGLang
process (:mod:`pytest_eagle3.worker.sglang_hooks`).  Unset, nothing of
pytest-eagle3 runs inside SGLang.
"""

from __future__ import annotations

#: Comma-separated hook sets to install (``cpu``, ``record``, ``fault``).
HOOKS_ENV = "PYTEST_EAGLE3_SGLANG_HOOKS"
#: The fault to inject (:mod:`pytest_eagle3.worker.faults`, :mod:`pytest_eagle3.worker.fault_injection`).
FAULT_ENV = "PYTEST_EAGLE3_FAULT"
#: The upstream fix to apply (:mod:`pytest_eagle3.worker.upstream_fixes`).
FIX_ENV = "PYTEST_EAGLE3_UPSTREAM_FIX"
#: ``1``: the engine switches its aux layer ids between requests (:mod:`pytest_eagle3.worker.id_switch`).
ID_SWITCH_ENV = "PYTEST_EAGLE3_ID_SWITCH"
#: Where the per-rank recorder writes (``rank<r>/``) and the id switch reads ``IDS``
#: (:mod:`pytest_eagle3.worker.recorder_hook`, :mod:`pytest_eagle3.worker.id_switch`).
RECORD_DIR_ENV = "PYTEST_EAGLE3_RECORD_DIR"
#: The dotted path of the forward whose loop captures, read from the installed model file.
RECORD_TARGET_ENV = "PYTEST_EAGLE3_RECORD_TARGET"
#: ``1``: the engine runs on ``intel_amx`` attention (:mod:`pytest_eagle3.worker.cpu.patches`).
AMX_ATTENTION_ENV = "PYTEST_EAGLE3_CPU_AMX_ATTENTION"
#: ``1``: SGLang's fused all-reduce + add + RMSNorm path (:mod:`pytest_eagle3.worker.cpu.allreduce_fusion`).
FUSION_ENV = "PYTEST_EAGLE3_CPU_ALLREDUCE_FUSION"
#: ``inplace`` / ``native``: the norm branch SGLang takes in the workers
#: (:mod:`pytest_eagle3.worker.cpu.norms`); resolved by the host from the user's
#: ``--eagle3-cpu-norm`` (env ``PYTEST_EAGLE3_CPU_NORM_PATH``, an option, not this).
NORM_PATH_ENV = "PYTEST_EAGLE3_WORKER_NORM_BRANCH"
#: ``1``: log the reduce-scatters of every forward (:mod:`pytest_eagle3.worker.reduce_scatter_proof`).
ROUTE_PROOF_ENV = "PYTEST_EAGLE3_ROUTE_PROOF"
#: ``1``: the engine runs with ``--enable-attn-tp-input-scattered`` on cpu (:func:`pytest_eagle3.worker.cpu.patches.input_scattered_platform`).
INPUT_SCATTERED_ENV = "PYTEST_EAGLE3_CPU_INPUT_SCATTERED"
