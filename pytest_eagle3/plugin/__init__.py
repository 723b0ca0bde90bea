"""The pytest side: hooks (:mod:`.hooks`, the ``pytest11`` entry point), options
and settings (:mod:`.options`), the fixture chain (:mod:`.fixtures`), run state
(:mod:`.session`) and ``--eagle3-plan`` (:mod:`.plan`).

Nothing here imports torch, transformers or sglang at import time.
"""
