"""Run a function right after a module finishes importing (worker side).

The CPU tier's fixes for older SGLang releases, and the hook loader for
releases without ``sglang.srt.plugins``, must act on an SGLang module as soon
as it exists and before anything uses it.  :func:`when_imported` calls ``fn``
now when the module is already imported, else right after its first import
completes (a ``sys.meta_path`` finder that wraps the module's loader).  It
changes nothing about *how* the module is found or executed.

Stdlib only: importable in every SGLang process without torch.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from typing import Any, Callable

logger = logging.getLogger("pytest_eagle3.post_import")

_pending: dict[str, list[Callable[[Any], None]]] = {}
#: Modules whose execution has finished (callbacks added later run at once).
_done: set[str] = set()
#: Modules whose loader this finder wrapped (their callbacks will run).
_wrapped: set[str] = set()
_busy = threading.local()
_lock = threading.RLock()


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of modules with pending callbacks; finds nothing itself."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        with _lock:
            if name not in _pending or getattr(_busy, "active", False):
                return None
        _busy.active = True  # a finder that re-enters the import system finds us inert
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _busy.active = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        with _lock:
            _wrapped.add(name)
        original = loader.exec_module

        def exec_module(module: Any, _original: Callable[[Any], None] = original) -> None:
            _original(module)
            _run(name, module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_finder = _Finder()


def _run(name: str, module: Any) -> None:
    with _lock:
        _done.add(name)
        callbacks = _pending.pop(name, [])
    for fn in callbacks:
        fn(module)


def when_imported(name: str, fn: Callable[[Any], None]) -> None:
    """Call ``fn(module)`` once module ``name`` is imported (now, if it already is).

    Exceptions from ``fn`` propagate to the importer: a fix that cannot apply
    stops the process with its own message rather than serving wrongly.
    """
    with _lock:
        module = sys.modules.get(name)
        initializing = getattr(getattr(module, "__spec__", None), "_initializing", False)
        run_now = module is not None and (name in _done or not initializing)
        if not run_now:
            if module is not None and name not in _wrapped:
                # Mid-import, started before this finder could wrap it: its end
                # cannot be hooked, and a fix silently missing would serve wrongly.
                raise RuntimeError(f"pytest-eagle3: cannot hook {name}: it is being imported and its "
                                   "import started before the hook was registered")
            _pending.setdefault(name, []).append(fn)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
    if run_now:
        fn(module)
