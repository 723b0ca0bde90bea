"""The pytest side: hooks (:mod:`.hooks`, the ``pytest11`` entry point), option
registration (:mod:`.options`, :mod:`.parsers`, :mod:`.spellings`), settings
resolution and checks (:mod:`.resolve`, :mod:`.validate`), the run object
(:mod:`.run`), the report header (:mod:`.header`), the fixture chain
(:mod:`.fixtures`), engine logs and the ``tp`` marker (:mod:`.session`) and
``--eagle3-plan`` (:mod:`.plan`).

Nothing here imports torch, transformers or sglang at import time.
"""
