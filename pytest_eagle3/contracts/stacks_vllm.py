"""Translators of the stacks whose training data vLLM captured: speculators and vLLM.

The signature and the table of what an id means per stack:
:mod:`pytest_eagle3.contracts.stacks`.
"""

from __future__ import annotations

from typing import Sequence

from pytest_eagle3.contracts.contract import Contract, Entry
from pytest_eagle3.contracts.stack_ids import (
    COUNT_MSG,
    IDS_RANGE_MSG,
    NO_IDS_NOTE,
    check_layers,
    checked_ids,
    in_range,
    layer_order,
    no_duplicates,
)
from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.verdicts.snapshots import FINAL_PRENORM

VLLM_EMBEDDING_NOTE = (
    "id 0 is the embedding; vLLM's DeepSeek model adds a None residual at layer 0, "
    "so vLLM itself cannot capture it on DeepSeek"
)

#: speculators data generation through vLLM's ``extract_hidden_states`` (PR #353 onwards).
DATAGEN_EXTRACT = "extract_hidden_states"
#: speculators' own vLLM worker extension (PR #157 .. PR #353, Nov 2025 - Mar 2026).
DATAGEN_CUSTOM_WORKER = "custom_worker"


def speculators(
    ids: Sequence[int] | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    dtype: str | None = None,
    source: str = "",
    datagen: str = DATAGEN_EXTRACT,
) -> Contract:
    """vllm-project/speculators: vLLM captures the data, training splits off the last entry.

    Checked against the released speculators 0.9.0 wheel (2026-10-15):
    ``models/eagle3/config.py:27-87`` (``Eagle3SpeculatorConfig``: ids at the top
    level, ``architectures ["Eagle3Speculator"]``, flags ``norm_before_fc``,
    ``fc_norm``, ``norm_output``, ``norm_before_residual``), ``train/data.py:324-333``
    (all captures but the last feed ``fc``; the last is ``verifier_last_hidden_states``),
    ``models/eagle3/core.py:119-120, 249-253`` (a frozen ``verifier_norm`` on it: the
    pre-norm final state), ``models/utils.py:99-140`` (default ``[2, L//2, L-3]``);
    ``standardize_data_v1`` is gone.  The flags change the draft's forward, not which
    layers feed ``fc``; a flag its serving model never reads is refused before any
    engine (:func:`pytest_eagle3.sglang_source.id_keys.flags_read`).

    ``datagen="extract_hidden_states"`` (default; speculators PR #353, commit
    ``2a1443c8``, 2026-03-26, onwards; read at ``c05b95b3``, 2026-08-20):

    * ``ids`` are the draft config's ``eagle_aux_hidden_state_layer_ids`` (the
      ``fc`` layers).  ``None`` -> ``[2, L//2, L-3]``:
      ``src/speculators/models/utils.py::resolve_target_layer_ids`` (PR #457),
      also the default of ``scripts/launch_vllm.py::main``.
    * ``scripts/launch_vllm.py::main`` starts vLLM with method
      ``extract_hidden_states`` and ``eagle_aux_hidden_state_layer_ids = ids + [L]``
      (``--include-last-layer`` defaults to True).  vLLM captures the *input* of
      layer ``v`` (``hs[v]``) and for ``v = L`` the last layer's output before the
      final norm (see :func:`vllm`; speculators PR #313, ``a54a7283``, states that
      the vLLM last state is pre-norm and re-applies the norm in training).
      Captures come out in layer order, whatever order ``ids`` has.
    * ``src/speculators/train/data.py::ArrowDataset._get_raw_data``:
      ``hidden_states[:, :-1]`` flattened -> ``fc`` input, ``hidden_states[:, -1]``
      -> ``verifier_last_hidden_states``.  ``standardize_data_v1`` (same file, removed
      in PR #914, ``c80a242a``) made the same split for the legacy ``.pt`` files:
      ``torch.cat(hidden_states[:-1])`` -> ``fc``, ``hidden_states[-1]`` -> verifier.

    So entries are ``hs[v]`` for ``v`` in layer order and ``verifier_last`` is
    ``final_prenorm``.  An id equal to ``L`` is the verifier's slot and is rejected.

    ``datagen="custom_worker"`` (PR #157, ``751f3a04``, to PR #353; file
    ``src/speculators/data_generation/custom_worker.py``, removed in PR #433):
    the worker patched the model forward to append ``hidden_states + residual``
    *after* layer ``v`` ran, i.e. ``hs[v+1]``, and ``v = L-1`` is ``final_prenorm``.
    ``ids`` is the data-generation ``--layer-ids`` list whose last (highest) entry
    is the verifier state; ``None`` -> ``[2, L//2, L-3, L-1]``
    (``vllm_hidden_states_generator.py::VllmHiddenStatesGenerator.__init__``).
    Drafts trained then saved no ids in their config.

    Raises:
        Eagle3ContractError: an unknown ``datagen``, ids out of range or duplicated.
    """
    stack = "speculators"
    check_layers(num_layers, hidden_size)
    L = num_layers
    declared = checked_ids(stack, ids)
    notes: list[str] = []
    if datagen == DATAGEN_EXTRACT:
        used = declared if declared is not None else (2, L // 2, L - 3)
        if declared is None:
            notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
        no_duplicates(stack, used, "vLLM captures each layer once, so fc would get fewer slots",
                       declared is None)
        if L in used:
            raise Eagle3ContractError(
                IDS_RANGE_MSG.format(
                    stack=stack, id=L, ids=list(used), lo=0, hi=L - 1, num_layers=L,
                    meaning=f"id {L} is the verifier's last hidden state, which launch_vllm.py appends; "
                    "it is not an fc input",
                )
            )
        in_range(stack, used, 0, L - 1, L, "id v = input of layer v = hs[v]", declared is None)
        entries: list[Entry] = list(layer_order(stack, used, notes))
        verifier: Entry = FINAL_PRENORM
        if 0 in used:
            notes.append(VLLM_EMBEDDING_NOTE)
    elif datagen == DATAGEN_CUSTOM_WORKER:
        used = declared if declared is not None else (2, L // 2, L - 3, L - 1)
        if declared is None:
            notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
        no_duplicates(stack, used, "the worker captures each layer once", declared is None)
        in_range(stack, used, 0, L - 1, L, "id v = output of layer v = hs[v+1]", declared is None)
        if len(used) < 2:
            raise Eagle3ContractError(
                COUNT_MSG.format(stack=stack, why="the last id is the verifier state, so fc needs at least 2",
                                 n=len(used), ids=list(used))
            )
        order = layer_order(stack, used, notes)
        snap = [FINAL_PRENORM if v == L - 1 else v + 1 for v in order]
        entries, verifier = snap[:-1], snap[-1]
    else:
        raise Eagle3ContractError(
            f"speculators: unknown datagen {datagen!r}; known: {DATAGEN_EXTRACT}, {DATAGEN_CUSTOM_WORKER}"
        )
    return Contract(
        entries=tuple(entries), hidden_size=hidden_size, num_layers=L, dtype=dtype, stack=stack,
        source=source or f"speculators ({datagen}) ids {list(used)}", verifier_last=verifier,
        declared_ids=declared, notes=tuple(notes),
    )


def vllm(
    ids: Sequence[int] | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    dtype: str | None = None,
    source: str = "",
    final_layer: bool = True,
) -> Contract:
    """vllm-project/vllm, DeepSeek-V2/V3 aux capture: id ``v`` = input of layer ``v`` = ``hs[v]``.

    Checked against the released vLLM 0.33.0 (2026-11-01) and 0.34.0 wheels:
    ``model_executor/models/deepseek_v2.py:1508-1593`` in both.  Which config key
    the runner reads the ids from (never ``eagle_config``'s key in 0.34.0):
    :mod:`pytest_eagle3.contracts.servers`.

    ``vllm/model_executor/models/deepseek_v2.py::DeepseekV2Model.forward`` (read at
    ``002d6073``) appends ``hidden_states + residual`` *before* layer ``idx`` when
    ``idx in aux_hidden_state_layers``, so captures come out in layer order, once per
    layer; after the loop it appends the last layer's output (before ``self.norm``)
    when ``end_layer`` (= ``L``) is in the set.  That final-layer capture came with
    PR #46973 (merged 2026-06-28; PR #46788 proposed it and was closed); before it an
    id ``L`` captured nothing (``final_layer=False`` rejects it).

    ``None``: ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:103-140``
    ``get_eagle3_aux_layers_from_config`` returns None when the draft's ``hf_config``
    has no (or an empty) ``eagle_aux_hidden_state_layer_ids`` and
    ``set_eagle3_aux_hidden_state_layers`` (``eagle3_utils.py:15-30``) falls back to
    the generic ``get_eagle3_default_aux_hidden_state_layers``
    (``vllm/model_executor/models/interfaces.py:1764-1785`` in 0.34.0) =
    ``(2, L//2, L-3)``; DeepSeek's own ``get_eagle3_aux_hidden_state_layers``
    (``deepseek_v2.py:1958``) gives the same value but no runner calls it.  PR #50170 (open, 2026-07-28) only adds a warning for that
    fallback (1.21% acceptance vs 58.9% on Llama-3.3-70B).

    Id ``0`` is the embedding in vLLM's ``EagleModelMixin`` models (llama, qwen2, ...);
    DeepSeek's loop computes ``hidden_states + residual`` with ``residual = None`` at
    layer 0, so the contract is noted as not capturable by vLLM's DeepSeek.

    Raises:
        Eagle3ContractError: ids out of range or duplicated.
    """
    stack = "vllm"
    check_layers(num_layers, hidden_size)
    L = num_layers
    declared = checked_ids(stack, ids)
    notes: list[str] = []
    used = declared if declared is not None else (2, L // 2, L - 3)
    if declared is None:
        notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
    no_duplicates(stack, used, "vLLM tests 'idx in aux_hidden_state_layers', so fc would get fewer slots",
                   declared is None)
    hi = L if final_layer else L - 1
    meaning = "id v = input of layer v = hs[v]" + (f"; {L} = last layer before the final norm" if final_layer
                                                   else f"; id {L} needs vLLM PR #46973")
    in_range(stack, used, 0, hi, L, meaning, declared is None)
    order = layer_order(stack, used, notes)
    if 0 in order:
        notes.append(VLLM_EMBEDDING_NOTE)
    entries = [FINAL_PRENORM if v == L else v for v in order]
    return Contract(
        entries=tuple(entries), hidden_size=hidden_size, num_layers=L, dtype=dtype, stack=stack,
        source=source or f"vLLM DeepSeek aux capture ids {list(used)}", declared_ids=declared,
        notes=tuple(notes),
    )
