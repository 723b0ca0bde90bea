"""Translators from each training stack's layer ids to a :class:`Contract`.

Every translator has the signature::

    translator(ids, *, num_layers, hidden_size, dtype=None, source="", **stack_options) -> Contract

where ``ids`` is what the stack was given (normally the draft config's
``eagle_aux_hidden_state_layer_ids``; ``None`` when it names none, so the stack
used its default).  Each docstring cites the code it was read from (repository,
path, function, commit or PR).  :func:`translate` dispatches by name through
:data:`STACKS`.

The same list of ids means different snapshots on different stacks, e.g. on an
8-layer target (``hs`` indices, :mod:`pytest_eagle3.verdicts.snapshots`):

=====================  =================================  ======================
stack                  id ``v`` means                      ``[1, 4, 6]`` gives
=====================  =================================  ======================
``speculators``        input of layer v (vLLM)             ``hs[1], hs[4], hs[6]``
``vllm``               input of layer v                    ``hs[1], hs[4], hs[6]``
``specforge-hf``       output of layer v (forward hook)    ``hs[2], hs[5], hs[7]``
``specforge-sglang``   SGLang's rule of that version       0.5.23: ``hs[2], hs[5], hs[7]``
``eagle``              (no ids: fixed ``2, L//2, L-3``)    ``hs[2], hs[4], hs[5]``
``raw``                ``hs`` index                        ``hs[1], hs[4], hs[6]``
=====================  =================================  ======================
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pytest_eagle3.contracts.contract import Contract, Entry
from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.verdicts.snapshots import FINAL_PRENORM
from pytest_eagle3.conventions import predict

if TYPE_CHECKING:
    from pytest_eagle3.conventions import IdRule

#: ``translator(ids, *, num_layers, hidden_size, dtype=None, source="", **options) -> Contract``
Translator = Callable[..., Contract]

# Message templates (tests import these).
UNKNOWN_STACK_MSG = "unknown training stack {name!r}; known stacks: {known}"
BAD_OPTION_MSG = "stack {stack!r} takes no option {option!r}; its options: {options}"
BAD_IDS_MSG = "{stack}: layer ids must be a list of non-negative ints, got {ids!r}"
EMPTY_IDS_MSG = "{stack}: the layer id list is empty; name at least one layer or omit the key"
DUPLICATE_IDS_MSG = "{stack}: ids {ids} name layer {id} more than once; {why}"
IDS_RANGE_MSG = "{stack}: id {id} in {ids} is outside {lo}..{hi} for a target of {num_layers} layers ({meaning})"
COUNT_MSG = "{stack}: {why}; got {n} ids {ids}"
NO_IDS_NOTE = (
    "the draft declares no layer ids: {stack} trained on its default {default}; "
    "a server that reads no ids uses its own default"
)
UNSORTED_NOTE = (
    "ids {ids} are not in layer order; {stack} captures in layer order, so fc slot order is {order}"
)
COLLAPSE_MSG = (
    "eagle: the original EAGLE-3 rule picks layers {{2, L//2, L-3}} = {layers} on a target of "
    "{num_layers} layers, only {n} distinct, but its fc always takes 3 slots"
)
SGLANG_FAILS_MSG = (
    "specforge-sglang: SGLang {version}, whose rule is '{rule}', turns ids {ids} into layers_to_capture "
    "{layers} on a target of {num_layers} layers; {problem}, so SpecForge's data generation "
    "could not have produced this draft's training data"
)
VLLM_EMBEDDING_NOTE = (
    "id 0 is the embedding; vLLM's DeepSeek model adds a None residual at layer 0, "
    "so vLLM itself cannot capture it on DeepSeek"
)
NEEDS_IDS_MSG = "raw: an explicit contract needs entries (hs indices or a human form), got none"


def _ids(stack: str, ids: Sequence[int] | None) -> tuple[int, ...] | None:
    """Validate an id list (ints >= 0, non-empty) and return it as a tuple."""
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise Eagle3ContractError(BAD_IDS_MSG.format(stack=stack, ids=ids))
    out = tuple(ids)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in out):
        raise Eagle3ContractError(BAD_IDS_MSG.format(stack=stack, ids=list(out)))
    if not out:
        raise Eagle3ContractError(EMPTY_IDS_MSG.format(stack=stack))
    return out


def _show(ids: tuple[int, ...], default: bool) -> str:
    return f"{'default ' if default else ''}{list(ids)}"


def _no_duplicates(stack: str, ids: tuple[int, ...], why: str, default: bool = False) -> None:
    for v in ids:
        if ids.count(v) > 1:
            raise Eagle3ContractError(
                DUPLICATE_IDS_MSG.format(stack=stack, ids=_show(ids, default), id=v, why=why)
            )


def _in_range(
    stack: str, ids: tuple[int, ...], lo: int, hi: int, num_layers: int, meaning: str, default: bool = False
) -> None:
    for v in ids:
        if not lo <= v <= hi:
            raise Eagle3ContractError(
                IDS_RANGE_MSG.format(
                    stack=stack, id=v, ids=_show(ids, default), lo=lo, hi=hi, num_layers=num_layers,
                    meaning=meaning,
                )
            )


def _layer_order(stack: str, ids: tuple[int, ...], notes: list[str]) -> tuple[int, ...]:
    order = tuple(sorted(ids))
    if order != ids:
        notes.append(UNSORTED_NOTE.format(ids=list(ids), stack=stack, order=list(order)))
    return order


def _check_layers(num_layers: int, hidden_size: int | None) -> None:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers <= 0:
        raise Eagle3ContractError(f"num_layers must be a positive int, got {num_layers!r}")
    if hidden_size is not None and (isinstance(hidden_size, bool) or not isinstance(hidden_size, int)
                                    or hidden_size <= 0):
        raise Eagle3ContractError(f"hidden_size must be a positive int, got {hidden_size!r}")


# --------------------------------------------------------------------------------------
# speculators
# --------------------------------------------------------------------------------------

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
    _check_layers(num_layers, hidden_size)
    L = num_layers
    declared = _ids(stack, ids)
    notes: list[str] = []
    if datagen == DATAGEN_EXTRACT:
        used = declared if declared is not None else (2, L // 2, L - 3)
        if declared is None:
            notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
        _no_duplicates(stack, used, "vLLM captures each layer once, so fc would get fewer slots",
                       declared is None)
        if L in used:
            raise Eagle3ContractError(
                IDS_RANGE_MSG.format(
                    stack=stack, id=L, ids=list(used), lo=0, hi=L - 1, num_layers=L,
                    meaning=f"id {L} is the verifier's last hidden state, which launch_vllm.py appends; "
                    "it is not an fc input",
                )
            )
        _in_range(stack, used, 0, L - 1, L, "id v = input of layer v = hs[v]", declared is None)
        entries: list[Entry] = list(_layer_order(stack, used, notes))
        verifier: Entry = FINAL_PRENORM
        if 0 in used:
            notes.append(VLLM_EMBEDDING_NOTE)
    elif datagen == DATAGEN_CUSTOM_WORKER:
        used = declared if declared is not None else (2, L // 2, L - 3, L - 1)
        if declared is None:
            notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
        _no_duplicates(stack, used, "the worker captures each layer once", declared is None)
        _in_range(stack, used, 0, L - 1, L, "id v = output of layer v = hs[v+1]", declared is None)
        if len(used) < 2:
            raise Eagle3ContractError(
                COUNT_MSG.format(stack=stack, why="the last id is the verifier state, so fc needs at least 2",
                                 n=len(used), ids=list(used))
            )
        order = _layer_order(stack, used, notes)
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


# --------------------------------------------------------------------------------------
# SpecForge
# --------------------------------------------------------------------------------------

#: SpecForge HF backend since PR #346 (2025-12-03): forward hooks on the layers.
CAPTURE_HOOK = "hook"
#: SpecForge HF backend before PR #346: ``output_hidden_states`` and ``hs[v+1]``.
CAPTURE_OUTPUT_HIDDEN_STATES = "output_hidden_states"


def specforge_default_ids(num_layers: int) -> list[int]:
    """SpecForge's default ``[1, L//2 - 1, L - 4]``."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def specforge_hf(
    ids: Sequence[int] | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    dtype: str | None = None,
    source: str = "",
    capture: str = CAPTURE_HOOK,
) -> Contract:
    """sgl-project/SpecForge, HF target backend: id ``v`` = output of layer ``v`` = ``hs[v+1]``.

    An older SpecForge: 0.2.0 (2026-08-10) removed the in-process HF backend
    (``config/schema.py:51-54``, ``target_backend: Literal["sglang"]``) and captures
    through SGLang only (:func:`specforge_sglang`, SGLang pinned to 0.5.14).

    Read in ``specforge/modeling/target/eagle3_target_model.py`` at ``c9b9b660``
    (2026-07-04; the file moved in later refactors):

    * ``Eagle3TargetEngine.set_aux_hidden_states_layers``: ``None`` ->
      ``[1, L//2 - 1, L - 4]``, and asserts exactly 3 layers.  ``scripts/train_eagle3.py``
      passes the draft config's ``eagle_config.eagle_aux_hidden_state_layer_ids``
      when present.  The current server runtime keeps the default
      (``specforge/algorithms/model_providers.py::resolve_eagle_capture_layers`` at
      ``a6b6b023``); ``configs/deepseek-v3-671b-eagle3.json`` ships ``[1, 29, 57]`` for 61 layers.
    * ``HFEagle3TargetEngine.generate_eagle3_data``: ``register_forward_hook`` on
      ``layers[v]`` (bounds ``0 <= v < L``) keeps the layer's output, then
      ``torch.cat`` of the three captures **in the listed order** (not layer order).
      The last layer's hooked output is before the final norm (``final_prenorm``).
      Hooks came with PR #346 (``94de9f8a``, 2025-12-03); before it
      (``capture="output_hidden_states"``, PR #278 ``ba6159cc``) the code took
      ``outputs.hidden_states[v + 1]``, which for ``v = L-1`` is ``hs[L]`` (after the norm).

    Raises:
        Eagle3ContractError: not 3 ids, ids out of range or duplicated, unknown ``capture``.
    """
    stack = "specforge-hf"
    _check_layers(num_layers, hidden_size)
    L = num_layers
    if capture not in (CAPTURE_HOOK, CAPTURE_OUTPUT_HIDDEN_STATES):
        raise Eagle3ContractError(
            f"{stack}: unknown capture {capture!r}; known: {CAPTURE_HOOK}, {CAPTURE_OUTPUT_HIDDEN_STATES}"
        )
    declared = _ids(stack, ids)
    notes: list[str] = []
    used = declared if declared is not None else tuple(specforge_default_ids(L))
    if declared is None:
        notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
    if len(used) != 3:
        raise Eagle3ContractError(
            COUNT_MSG.format(stack=stack, why="SpecForge's EAGLE-3 target asserts exactly 3 layers",
                             n=len(used), ids=list(used))
        )
    _no_duplicates(stack, used, "SpecForge keys hooks by layer and fails with 'Expected to capture 3 layers'",
                   declared is None)
    _in_range(stack, used, 0, L - 1, L, "id v = output of layer v = hs[v+1]", declared is None)
    last = FINAL_PRENORM if capture == CAPTURE_HOOK else L
    entries = [last if v == L - 1 else v + 1 for v in used]
    return Contract(
        entries=tuple(entries), hidden_size=hidden_size, num_layers=L, dtype=dtype, stack=stack,
        source=source or f"SpecForge HF backend ({capture}) ids {list(used)}",
        declared_ids=declared, notes=tuple(notes),
    )


def specforge_sglang(
    ids: Sequence[int] | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    sglang_version: "str | IdRule",
    dtype: str | None = None,
    source: str = "",
) -> Contract:
    """sgl-project/SpecForge, SGLang backend: the ids mean what that SGLang version makes of them.

    ``sglang_version``: the SGLang used at data generation: a version string (the
    version table's rule for that upstream release) or an installed SGLang's
    :class:`~pytest_eagle3.conventions.IdRule` read from its code.

    SpecForge hands the ids to SGLang's own ``model.set_eagle3_layers_to_capture``:
    ``specforge/modeling/target/sglang_backend/capture.py`` (at ``c9b9b660``) and
    ``specforge/offline_capture/sglang_backend/capture.py::set_eagle3_capture_layers``
    (at ``a6b6b023``); the server runtime sends them as SGLang's
    ``eagle_aux_hidden_state_layer_ids`` (``patches/sglang/v0.5.14/spec-capture.patch``).
    So the training data holds exactly what that SGLang version captures, in layer
    order: :func:`pytest_eagle3.conventions.predict` with the SGLang version used
    *at data generation*.

    ``None``: the current runtime sends SpecForge's default ``[1, L//2-1, L-4]``
    (``resolve_eagle_capture_layers``); the older offline backend sent nothing and
    SGLang used its default ``[2, L//2, L-3]``.  Both end in ``hs[2], hs[L//2], hs[L-3]``
    under either SGLang rule; this uses the SpecForge default.

    Raises:
        Eagle3ContractError: ids that SGLang cannot capture on ``L`` layers (data
            generation would have failed at the first forward), duplicates.
    """

    stack = "specforge-sglang"
    _check_layers(num_layers, hidden_size)
    L = num_layers
    declared = _ids(stack, ids)
    notes: list[str] = []
    used = declared if declared is not None else tuple(specforge_default_ids(L))
    if declared is None:
        notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
    _no_duplicates(stack, used, "SGLang captures each layer once", declared is None)
    pred = predict(list(used), L, sglang_version)
    label = sglang_version if isinstance(sglang_version, str) else f"installed ({sglang_version.source})"
    problem = ""
    if pred.missing:
        problem = f"layers {list(pred.missing)} are never reached (valid 0..{L - 1})"
    elif len(set(pred.layers_to_capture)) != len(pred.layers_to_capture):
        problem = "two ids land on the same layer"
    if problem:
        raise Eagle3ContractError(
            SGLANG_FAILS_MSG.format(version=label, rule=pred.rule, ids=list(used),
                                    layers=list(pred.layers_to_capture), num_layers=L, problem=problem)
        )
    notes.append(f"SGLang {label}: {pred.rule}; layers_to_capture {list(pred.layers_to_capture)}")
    return Contract(
        entries=tuple(pred.snapshots), hidden_size=hidden_size, num_layers=L, dtype=dtype, stack=stack,
        source=source or f"SpecForge SGLang backend (sglang {label}) ids {list(used)}",
        declared_ids=declared, notes=tuple(notes),
    )


#: The SGLang SpecForge 0.2.0 captures with (its wheel's ``Requires-Dist: sglang==0.5.14``).
SPECFORGE_SGLANG = "0.5.14"


def specforge(
    ids: Sequence[int] | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    sglang_version: "str | IdRule" = SPECFORGE_SGLANG,
    dtype: str | None = None,
    source: str = "",
) -> Contract:
    """sgl-project/SpecForge 0.2.x (0.2.0, 2026-08-10): captures through SGLang only, so
    an id means what that SGLang's rule makes of it (:func:`specforge_sglang`).

    Read in the 0.2.0 wheel: the in-process HF backend is gone
    (``config/schema.py:51-54``); the ids come from the run option
    ``model.aux_hidden_state_layer_ids``, else the draft config's
    ``eagle_config.eagle_aux_hidden_state_layer_ids``, else ``[1, L//2-1, L-4]``
    (``algorithms/model_providers.py:188-211``, exactly 3); the offline capture hands
    them to SGLang's ``set_eagle3_layers_to_capture``
    (``offline_capture/sglang_backend/capture.py:86-112``) and the wheel pins
    ``sglang==0.5.14`` (``sglang_version``, default).  Training writes no
    ``config.json``: run-option ids survive only in the provenance record, the
    ``capture_layers`` entry of ``specforge_model_provenance`` in
    ``<output_dir>/<run_id>-step<N>/training_state.pt``
    (``training/provenance.py:285-289``, ``algorithms/common/providers.py:37``,
    ``training/checkpoint.py``), read by :func:`pytest_eagle3.contracts.draft.specforge_capture_layers`.

    Raises:
        Eagle3ContractError: not 3 ids, ids that SGLang cannot capture, duplicates.
    """
    stack = "specforge"
    _check_layers(num_layers, hidden_size)
    used = _ids(stack, ids)
    if used is not None and len(used) != 3:
        raise Eagle3ContractError(
            COUNT_MSG.format(stack=stack, why="SpecForge 0.2 requires exactly 3 capture layers "
                             "(algorithms/model_providers.py:206-210)", n=len(used), ids=list(used)))
    contract = specforge_sglang(ids, num_layers=num_layers, hidden_size=hidden_size, sglang_version=sglang_version,
                                dtype=dtype, source=source)
    label = sglang_version if isinstance(sglang_version, str) else "installed"
    return replace(contract, stack=stack, notes=tuple(n.replace("specforge-sglang", stack) for n in contract.notes),
                   source=source or f"SpecForge 0.2 (captured with sglang {label}) ids {list(used or ())}")


# --------------------------------------------------------------------------------------
# original EAGLE-3
# --------------------------------------------------------------------------------------


def eagle(
    ids: Sequence[int] | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    dtype: str | None = None,
    source: str = "",
) -> Contract:
    """SafeAILab/EAGLE, original EAGLE-3 training: fixed ``hs[2], hs[L//2], hs[L-3]``.

    Read at ``cb7e0841`` (2026-02-19):

    * ``eagle/traineagle3/modeling_llama_kv.py::LlamaModel.forward`` appends
      ``hidden_states`` *before* decoder layer ``idx`` runs when
      ``idx == L-3 or idx == L//2 or idx == 2``: the input of those layers
      (``hs[idx]``), in layer order, each once.
    * ``eagle/traineagle3/cnets.py::Model.dataprepare`` concatenates
      ``outs.hidden_states[0], [1], [2]`` (those three) and ``Model.__init__`` builds
      ``fc = nn.Linear(hidden_size * 3, hidden_size)``.

    The code takes no layer ids: ``ids`` (e.g. added to the config later for a
    server) are kept as ``declared_ids`` with a note, and do not change the contract.

    Raises:
        Eagle3ContractError: a target so shallow that the three layers coincide.
    """
    stack = "eagle"
    _check_layers(num_layers, hidden_size)
    L = num_layers
    declared = _ids(stack, ids)
    layers = sorted({v for v in (2, L // 2, L - 3) if 0 <= v < L})
    if len(layers) != 3:
        raise Eagle3ContractError(COLLAPSE_MSG.format(layers=layers, num_layers=L, n=len(layers)))
    notes = []
    if declared is not None:
        notes.append(
            f"the config declares ids {list(declared)}, but EAGLE-3 training takes none: "
            f"it always used hs[2], hs[L//2], hs[L-3]; the ids only steer a server"
        )
    return Contract(
        entries=tuple(layers), hidden_size=hidden_size, num_layers=L, dtype=dtype, stack=stack,
        source=source or "EAGLE-3 training (SafeAILab/EAGLE): layers {2, L//2, L-3}",
        declared_ids=declared, notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------------------


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

    Checked against the released vLLM 0.33.0 wheel (2026-11-01):
    ``model_executor/models/deepseek_v2.py:1508-1593``.  Which config key each model
    runner reads the ids from differs (V2, the default, never reads
    ``eagle_config``'s key): :mod:`pytest_eagle3.contracts.servers`.

    ``vllm/model_executor/models/deepseek_v2.py::DeepseekV2Model.forward`` (read at
    ``002d6073``) appends ``hidden_states + residual`` *before* layer ``idx`` when
    ``idx in aux_hidden_state_layers``, so captures come out in layer order, once per
    layer; after the loop it appends the last layer's output (before ``self.norm``)
    when ``end_layer`` (= ``L``) is in the set.  That final-layer capture came with
    PR #46973 (merged 2026-06-28; PR #46788 proposed it and was closed); before it an
    id ``L`` captured nothing (``final_layer=False`` rejects it).

    ``None``: ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``
    ``get_eagle3_aux_layers_from_config`` returns None when the draft's ``hf_config``
    has no (or an empty) ``eagle_aux_hidden_state_layer_ids`` and
    ``set_eagle3_aux_hidden_state_layers`` falls back to the model's default,
    ``DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers`` =
    ``(2, L//2, L-3)``.  PR #50170 (open, 2026-07-28) only adds a warning for that
    fallback (1.21% acceptance vs 58.9% on Llama-3.3-70B).

    Id ``0`` is the embedding in vLLM's ``EagleModelMixin`` models (llama, qwen2, ...);
    DeepSeek's loop computes ``hidden_states + residual`` with ``residual = None`` at
    layer 0, so the contract is noted as not capturable by vLLM's DeepSeek.

    Raises:
        Eagle3ContractError: ids out of range or duplicated.
    """
    stack = "vllm"
    _check_layers(num_layers, hidden_size)
    L = num_layers
    declared = _ids(stack, ids)
    notes: list[str] = []
    used = declared if declared is not None else (2, L // 2, L - 3)
    if declared is None:
        notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
    _no_duplicates(stack, used, "vLLM tests 'idx in aux_hidden_state_layers', so fc would get fewer slots",
                   declared is None)
    hi = L if final_layer else L - 1
    meaning = "id v = input of layer v = hs[v]" + (f"; {L} = last layer before the final norm" if final_layer
                                                   else f"; id {L} needs vLLM PR #46973")
    _in_range(stack, used, 0, hi, L, meaning, declared is None)
    order = _layer_order(stack, used, notes)
    if 0 in order:
        notes.append(VLLM_EMBEDDING_NOTE)
    entries = [FINAL_PRENORM if v == L else v for v in order]
    return Contract(
        entries=tuple(entries), hidden_size=hidden_size, num_layers=L, dtype=dtype, stack=stack,
        source=source or f"vLLM DeepSeek aux capture ids {list(used)}", declared_ids=declared,
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------
# raw
# --------------------------------------------------------------------------------------


def raw(
    ids: Sequence[Entry] | str | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    dtype: str | None = None,
    source: str = "",
) -> Contract:
    """An explicit contract: ``hs`` indices (ints, or ``"final_prenorm"``) in fc slot
    order, or a human form string such as ``"[embedding, out(L2), out(L4)]"``.

    Raises:
        Eagle3ContractError: no entries, a bad entry or human form, out of range.
    """
    _check_layers(num_layers, hidden_size)
    if ids is None:
        raise Eagle3ContractError(NEEDS_IDS_MSG)
    if isinstance(ids, str):
        return Contract.parse(ids, num_layers=num_layers, hidden_size=hidden_size, dtype=dtype,
                              stack="raw", source=source or f"explicit {ids}")
    entries = tuple(ids)
    declared = entries if all(isinstance(e, int) for e in entries) else None
    return Contract(
        entries=entries, hidden_size=hidden_size, num_layers=num_layers, dtype=dtype, stack="raw",
        source=source or f"explicit hs indices {list(entries)}", declared_ids=declared,
    )


#: Translator per stack name (``--eagle3-stack`` values).
STACKS: dict[str, Translator] = {
    "speculators": speculators,
    "specforge": specforge,
    "specforge-hf": specforge_hf,
    "specforge-sglang": specforge_sglang,
    "eagle": eagle,
    "vllm": vllm,
    "raw": raw,
}


def stack_options(stack: str) -> list[str]:
    """Extra keyword options a stack's translator accepts (beyond the common ones)."""
    common = {"ids", "num_layers", "hidden_size", "dtype", "source"}
    return [p for p in inspect.signature(get_translator(stack)).parameters if p not in common]


def get_translator(stack: str) -> Translator:
    """The translator registered as ``stack``.

    Raises:
        Eagle3ContractError: unknown name (the message lists the known ones).
    """
    try:
        return STACKS[stack]
    except (KeyError, TypeError):
        raise Eagle3ContractError(UNKNOWN_STACK_MSG.format(name=stack, known=", ".join(STACKS))) from None


def translate(
    stack: str,
    ids: Sequence[Any] | str | None,
    *,
    num_layers: int,
    hidden_size: int | None,
    **options: Any,
) -> Contract:
    """``STACKS[stack](ids, num_layers=..., hidden_size=..., **options)``.

    Raises:
        Eagle3ContractError: unknown stack, an option the stack does not take, or
            whatever the translator rejects.
    """
    fn = get_translator(stack)
    params = inspect.signature(fn).parameters
    for name in options:
        if name not in params:
            raise Eagle3ContractError(
                BAD_OPTION_MSG.format(stack=stack, option=name, options=", ".join(stack_options(stack)) or "none")
            )
    return fn(ids, num_layers=num_layers, hidden_size=hidden_size, **options)
