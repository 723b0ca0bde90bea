"""The target side of the data path: spec -> checkpoint -> reference.

* :mod:`.spec`: a target preset (``fixtures/targets/*.json``) or a local
  checkpoint directory, and :class:`~.spec.TargetFacts`, the one shape of a
  target's facts the rest of the package reads;
* :mod:`.checkpoint`: deterministic weights and the keyed, atomic cache;
* :mod:`.reference`: transformers' hidden states for the suite prompts, computed
  in a subprocess (:mod:`.reference_worker`).

Nothing here imports torch at import time.
"""
