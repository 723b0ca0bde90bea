"""Verdicts: captures compared with the reference and with SGLang's own rules.

* :mod:`.snapshots`: names of the ``output_hidden_states`` snapshots;
* :mod:`.conventions`: each SGLang version's aux layer-id rule;
* :mod:`.compare`: per-slot comparison with a diagnosis a person can act on;
* :mod:`.rankcheck`: the same per TP rank (per-rank recorder).
"""
