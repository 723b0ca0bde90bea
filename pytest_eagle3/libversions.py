"""Versions of the libraries a run uses, named by the module that is imported.

A fork may ship a library under another distribution name (sglang-kt 0.7.2
installs the ``transformers`` module as the distribution ``transformers-kt``),
so asking ``importlib.metadata.version("transformers")`` says "not installed"
while ``import transformers`` works.  :func:`module_version` finds the
distribution that owns the importable module instead.  Nothing is imported.
Stdlib only.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from pathlib import Path


@functools.lru_cache(maxsize=None)
def _owners(module: str) -> tuple[str, ...]:
    return tuple(importlib.metadata.packages_distributions().get(module, ()))


def owning_distribution(module: str, location: str | Path) -> tuple[str, str] | None:
    """``(distribution name, version)`` of the installed distribution whose files hold
    top-level package ``module`` at ``location`` (``None``: none does, e.g. a
    source tree on ``sys.path``)."""
    for name in _candidates(module):
        try:
            dist = importlib.metadata.distribution(name)
            if Path(str(dist.locate_file(module))).resolve() == Path(location).resolve():
                return dist.metadata["Name"] or name, dist.version
        except (importlib.metadata.PackageNotFoundError, OSError, TypeError, NotImplementedError):
            continue
    return None


def _candidates(module: str):
    """The distribution named like the module first; the (slow, about 1 s) scan of
    every installed distribution's files only when that one does not own it."""
    yield module
    for name in _owners(module):
        if name != module:
            yield name


def module_distribution(module: str) -> tuple[str, str] | None:
    """``(distribution name, version)`` of the distribution that owns the importable
    top-level ``module`` (``("transformers-kt", "5.6.0.post6")``), or ``None``
    when the module is not importable or no installed distribution owns it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    origin = Path(spec.origin).parent if spec.origin and spec.origin not in ("namespace", "built-in") else None
    if origin is None and spec.submodule_search_locations:
        origin = Path(next(iter(spec.submodule_search_locations)))
    fallback = None
    for name in _candidates(module):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        try:
            owned = origin is not None and Path(str(dist.locate_file(module))).resolve() == origin.resolve()
        except (OSError, TypeError, NotImplementedError):
            owned = False
        if owned:
            return dist.metadata["Name"] or name, dist.version
        fallback = fallback or (dist.metadata["Name"] or name, dist.version)
    return fallback


def module_version(module: str, *, missing: str = "not installed") -> str:
    """The version of importable ``module`` for people: ``2.14.1``, or
    ``5.6.0.post6 (distribution transformers-kt)`` when it ships under another
    name; ``missing`` when it cannot be imported."""
    found = module_distribution(module)
    if found is None:
        return missing
    name, version = found
    canonical = name.lower().replace("_", "-")
    return version if canonical == module.lower().replace("_", "-") else f"{version} (distribution {name})"
