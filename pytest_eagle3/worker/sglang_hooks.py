"""pytest-eagle3's SGLang general plugin (entry point group ``sglang.srt.plugins``).

SGLang calls every general plugin in each of its processes (the engine, every TP
scheduler worker) through ``sglang.srt.plugins.load_plugins()``
(``srt/plugins/__init__.py``, 0.5.x).  This module is registered there by
pytest-eagle3's ``pyproject.toml`` and does nothing unless the engine host set
:data:`HOOKS_ENV`, so installing pytest-eagle3 never changes a production server.

``PYTEST_EAGLE3_SGLANG_HOOKS`` is a comma-separated list of hook sets:

* ``cpu``: the CPU-tier fixes from docs/design.md, "SGLang on a plain x86 CPU".
  They route around missing CPU kernels and leave the code under test
  (capture, collectives, embedding, logits processor, speculative worker)
  untouched.
* ``record``: the per-rank recorder (:mod:`pytest_eagle3.worker.recorder_hook`)
  and the draft's input recorder (:mod:`pytest_eagle3.worker.draft_recorder`),
  idle until a test enables them.
* ``fault``: fault injection into SGLang's own capture path
  (:mod:`pytest_eagle3.worker.fault_injection`), the fault named by
  ``PYTEST_EAGLE3_FAULT``.  Also switched on when that variable is set and any
  other hook set is active (an engine pytest-eagle3 started, e.g. inside a
  self-test run); never without it.  Installed before the recorder, so the
  recorder and the HTTP API see the faulted captures.

With ``PYTEST_EAGLE3_ROUTE_PROOF=1`` (engines on a reduce-scatter route: attention
DP, input-scattered attention) every worker logs each forward's reduce-scatters
(:mod:`pytest_eagle3.worker.reduce_scatter_proof`).

With :data:`FIX_ENV` set (and any hook set active), the upstream fix it names
(:mod:`pytest_eagle3.worker.upstream_fixes`) is installed after the fault and
before the recorder.

Where the installed SGLang has no ``sglang.srt.plugins`` (releases before
0.5.11), nothing calls :func:`load`; the engine host then puts
``worker/site_hook`` on the workers' ``PYTHONPATH`` and its ``sitecustomize``
calls :func:`load_on_import` (:data:`PLUGIN_LOADER` and :data:`IMPORT_HOOK_LOADER`
name both ways; the report header says which one a run used).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pytest_eagle3.worker.env import FAULT_ENV, FIX_ENV, HOOKS_ENV, ID_SWITCH_ENV, RECORD_TARGET_ENV, ROUTE_PROOF_ENV

logger = logging.getLogger("pytest_eagle3.sglang_hooks")

#: How the hooks reach SGLang's processes: SGLang's general-plugin entry point,
#: or pytest-eagle3's ``sitecustomize`` import hook (no ``sglang.srt.plugins``).
PLUGIN_LOADER = "sglang.srt.plugins entry point"
IMPORT_HOOK_LOADER = "sitecustomize import hook (this SGLang has no sglang.srt.plugins)"
#: The directory whose ``sitecustomize`` is the import hook.
SITE_HOOK_DIR = Path(__file__).with_name("site_hook")

#: The module whose import triggers :func:`load` under the import hook: every
#: SGLang process imports it before resolving arguments or building a model.
TRIGGER_MODULE = "sglang.srt.server_args"


def enabled_hook_sets() -> set[str]:
    """Hook sets named in :data:`HOOKS_ENV`."""
    return {x.strip() for x in os.environ.get(HOOKS_ENV, "").split(",") if x.strip()}


def load_on_import() -> None:
    """Call :func:`load` right after :data:`TRIGGER_MODULE` is imported (the
    ``sitecustomize`` hook loader's way in)."""
    from pytest_eagle3.worker.post_import import when_imported

    when_imported(TRIGGER_MODULE, lambda _module: load())


_loaded = False


def load() -> None:
    """Entry point called by SGLang's ``load_plugins()`` in every process (once)."""
    global _loaded
    sets = enabled_hook_sets()
    if not sets or _loaded:
        return
    _loaded = True
    if "cpu" in sets:
        from pytest_eagle3.worker.cpu import fills

        fills.install()
        logger.info("pytest-eagle3: CPU-tier hooks installed (pid %d)", os.getpid())
    if "fault" in sets or os.environ.get(FAULT_ENV, "").strip():
        from pytest_eagle3.worker import fault_injection

        fault = fault_injection.install()
        if fault is not None:
            logger.info("pytest-eagle3: fault %s installed (pid %d)", fault["kind"], os.getpid())
    if os.environ.get(FIX_ENV, "").strip():
        from pytest_eagle3.worker import upstream_fixes

        fix = upstream_fixes.install()
        logger.warning("pytest-eagle3: upstream fix %s installed (pid %d)", fix, os.getpid())
    if os.environ.get(ID_SWITCH_ENV) == "1":
        from pytest_eagle3.worker import id_switch

        id_switch.install()
        logger.info("pytest-eagle3: aux layer id switch installed (pid %d)", os.getpid())
    if os.environ.get(ROUTE_PROOF_ENV) == "1":
        from pytest_eagle3.worker import recorder_hook, reduce_scatter_proof

        if reduce_scatter_proof.install(os.environ.get(RECORD_TARGET_ENV) or recorder_hook.TARGET):
            logger.info("pytest-eagle3: reduce-scatter proof installed (pid %d)", os.getpid())
    if "record" in sets:
        from pytest_eagle3.worker import draft_recorder, recorder_hook

        recorder_hook.install()
        draft_recorder.install()
        logger.info("pytest-eagle3: per-rank recorder installed (pid %d)", os.getpid())
