"""The ``pytest-eagle3`` command: ``info`` and ``inspect`` (:mod:`.main`), with the
draft pre-flight (:mod:`.preflight`) and id-fix search (:mod:`.idfix`) behind
``inspect`` (:mod:`.inspect`)."""
