"""Verdicts: captures compared with the reference and with SGLang's own rules.

* :mod:`.snapshots`: names of the ``output_hidden_states`` snapshots;
* :mod:`.compare`: per-slot comparison with a diagnosis a person can act on
  (:mod:`.diagnose`, :mod:`.patterns`, :mod:`.evidence`);
* :mod:`.embedding`: the embedding slot row by row;
* :mod:`.rankcheck`: the same per TP rank (per-rank recorder);
* :mod:`.order`, :mod:`.contract`, :mod:`.paths`, :mod:`.acceptance`: one check
  of the packaged suite each, returning an :class:`.outcome.Verdict`.
"""
