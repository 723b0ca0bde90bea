"""The environment an engine inherits from the runner, less what would fake a measurement.

SGLang hosts inherit the test process's whole environment (a fork's own
settings, ``CUDA_VISIBLE_DEVICES``, proxies).  One family of variables must not
pass: SGLang's benchmark knobs that replace the verify's real acceptance with a
simulated one.  SGLang 0.5.23 reads ``SGLANG_SIMULATE_ACC_LEN``,
``SGLANG_SIMULATE_ACC_METHOD`` and ``SGLANG_SIMULATE_ACC_TOKEN_MODE``
(``srt/speculative/spec_utils.py:276-278``; with ``SGLANG_SIMULATE_ACC_LEN`` set
the verify accepts that many draft tokens whatever the target predicted).  An
accept length the suite reports must be measured, so every variable whose name
starts with :data:`SIMULATED_ACCEPTANCE_PREFIX` is removed from every engine's
environment, and the report header says so (``plugin/header.py``).
"""

from __future__ import annotations

from typing import Mapping

#: Names SGLang reads to simulate acceptance start with this (0.5.23 ``spec_utils.py:276-278``).
SIMULATED_ACCEPTANCE_PREFIX = "SGLANG_SIMULATE_ACC"


def simulated_acceptance(environ: Mapping[str, str]) -> dict[str, str]:
    """The simulated-acceptance variables set in ``environ`` (name -> value), sorted by name."""
    return {k: environ[k] for k in sorted(environ) if k.startswith(SIMULATED_ACCEPTANCE_PREFIX)}


def engine_environ(environ: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """An engine's environment: ``environ`` (the runner's), then the engine's own
    ``overrides``, less every simulated-acceptance variable from either."""
    merged = {**environ, **overrides}
    for name in simulated_acceptance(merged):
        del merged[name]
    return merged


def describe_removed(environ: Mapping[str, str]) -> str | None:
    """``NAME=value, ...`` of the variables :func:`engine_environ` removes, or None."""
    found = simulated_acceptance(environ)
    return ", ".join(f"{k}={v}" for k, v in found.items()) or None
