"""Readers of the training and serving stacks' own files (vLLM, speculators, SpecForge).

The contracts (:mod:`pytest_eagle3.contracts`) rest on facts about other
projects' code: default layer ids, which config keys are read and in what
order, where a layer is captured, which captures feed ``fc``.  Each fact is
recorded with the file and lines it was read from (:mod:`.catalog`) and read
again, never imported, from an installed stack or a downloaded wheel
(:mod:`.files`, :mod:`.readers`, :mod:`.facts`, :mod:`.report`), as
:mod:`pytest_eagle3.sglang_source` reads SGLang.  ``pytest-eagle3 stacks``
and ``tox -e stacks`` run them (docs/compatibility.md).
"""
