"""Planning: which engines the packaged tests need and which id-list cases run.

* :mod:`.cases`: the suite's id-list cases (the contract fixtures).
* :mod:`.declare`: what a declared test needs (:class:`~.declare.EngineNeed`);
  :mod:`.collect`: why a need is left out of a run; :mod:`.request`: how it
  resolves into an engine request.
* :mod:`.selftest`: the self-test plan (which tests must catch which fault).

Sits above target, engine, capture, verdicts, contracts and draft, below the
pytest plugin and the CLI.  Nothing here imports torch or sglang at import time.
"""
