"""pytest-eagle3's hook loader for SGLang releases without ``sglang.srt.plugins``.

Only on the ``PYTHONPATH`` of engines pytest-eagle3 starts, and only when the
installed SGLang has no general-plugin mechanism (``srt/plugins/__init__.py``,
``load_plugins``; absent before sglang 0.5.11, see ``sglang_source/install.py``).
Python imports ``sitecustomize`` at the start of every interpreter, so this
reaches the server process and every TP worker SGLang spawns.

It does nothing unless ``PYTEST_EAGLE3_SGLANG_HOOKS`` is set, then calls the
same entry point SGLang's ``load_plugins()`` would
(:func:`pytest_eagle3.worker.sglang_hooks.load`), right after
``sglang.srt.server_args`` is imported: before any server argument is resolved
or model built.  Any other ``sitecustomize`` later on ``sys.path`` (the
environment's own) still runs.
"""

import os
import sys


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.realpath(os.path.dirname(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # `import sitecustomize` now names the environment's own.
    sys.modules["sitecustomize"] = module


def _install() -> None:
    if not os.environ.get("PYTEST_EAGLE3_SGLANG_HOOKS", "").strip():
        return
    from pytest_eagle3.worker import sglang_hooks

    sglang_hooks.load_on_import()


try:
    _install()
finally:
    _chain_next_sitecustomize()
