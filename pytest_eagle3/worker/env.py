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
