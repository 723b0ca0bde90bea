"""pytest-eagle3's SGLang general plugin (entry point group ``sglang.srt.plugins``).

SGLang calls every general plugin in each of its processes (the engine, every TP
scheduler worker) through ``sglang.srt.plugins.load_plugins()``
(``srt/plugins/__init__.py``, 0.5.x).  This module is registered there by
pytest-eagle3's ``pyproject.toml`` and does nothing unless the engine host set
:data:`HOOKS_ENV`, so installing pytest-eagle3 never changes a production server.

``PYTEST_EAGLE3_SGLANG_HOOKS`` is a comma-separated list of hook sets:

* ``cpu``: the CPU-tier fixes from ``DESIGN.md`` ("SGLang on a plain x86 CPU").
  They route around missing CPU kernels and leave the code under test
  (capture, collectives, embedding, logits processor, speculative worker)
  untouched.
* ``record``: the per-rank recorder (:mod:`pytest_eagle3.engine.recorder_hook`),
  idle until a test enables it.
"""

from __future__ import annotations

import logging
import os

HOOKS_ENV = "PYTEST_EAGLE3_SGLANG_HOOKS"

logger = logging.getLogger("pytest_eagle3.sglang_hooks")


def enabled_hook_sets() -> set[str]:
    """Hook sets named in :data:`HOOKS_ENV`."""
    return {x.strip() for x in os.environ.get(HOOKS_ENV, "").split(",") if x.strip()}


def load() -> None:
    """Entry point called by SGLang's ``load_plugins()`` in every process."""
    sets = enabled_hook_sets()
    if not sets:
        return
    if "cpu" in sets:
        from pytest_eagle3.engine.cpu import patches

        patches.install()
        logger.info("pytest-eagle3: CPU-tier hooks installed (pid %d)", os.getpid())
    if "record" in sets:
        from pytest_eagle3.engine import recorder_hook

        recorder_hook.install()
        logger.info("pytest-eagle3: per-rank recorder installed (pid %d)", os.getpid())
