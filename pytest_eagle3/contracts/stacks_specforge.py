"""Translators of SpecForge's stacks: 0.2 (through SGLang only), its older HF and SGLang backends.

The signature and the table of what an id means per stack:
:mod:`pytest_eagle3.contracts.stacks`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from pytest_eagle3.contracts.contract import Contract
from pytest_eagle3.contracts.stack_ids import (
    COUNT_MSG,
    NO_IDS_NOTE,
    check_layers,
    checked_ids,
    in_range,
    no_duplicates,
)
from pytest_eagle3.conventions import predict
from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.verdicts.snapshots import FINAL_PRENORM

if TYPE_CHECKING:
    from pytest_eagle3.conventions import IdRule

SGLANG_FAILS_MSG = (
    "specforge-sglang: SGLang {version}, whose rule is '{rule}', turns ids {ids} into layers_to_capture "
    "{layers} on a target of {num_layers} layers; {problem}, so SpecForge's data generation "
    "could not have produced this draft's training data"
)

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
    check_layers(num_layers, hidden_size)
    L = num_layers
    if capture not in (CAPTURE_HOOK, CAPTURE_OUTPUT_HIDDEN_STATES):
        raise Eagle3ContractError(
            f"{stack}: unknown capture {capture!r}; known: {CAPTURE_HOOK}, {CAPTURE_OUTPUT_HIDDEN_STATES}"
        )
    declared = checked_ids(stack, ids)
    notes: list[str] = []
    used = declared if declared is not None else tuple(specforge_default_ids(L))
    if declared is None:
        notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
    if len(used) != 3:
        raise Eagle3ContractError(
            COUNT_MSG.format(stack=stack, why="SpecForge's EAGLE-3 target asserts exactly 3 layers",
                             n=len(used), ids=list(used))
        )
    no_duplicates(stack, used, "SpecForge keys hooks by layer and fails with 'Expected to capture 3 layers'",
                   declared is None)
    in_range(stack, used, 0, L - 1, L, "id v = output of layer v = hs[v+1]", declared is None)
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
    check_layers(num_layers, hidden_size)
    L = num_layers
    declared = checked_ids(stack, ids)
    notes: list[str] = []
    used = declared if declared is not None else tuple(specforge_default_ids(L))
    if declared is None:
        notes.append(NO_IDS_NOTE.format(stack=stack, default=list(used)))
    no_duplicates(stack, used, "SGLang captures each layer once", declared is None)
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
    ``training/checkpoint.py``), read by :func:`pytest_eagle3.contracts.specforge_run.specforge_capture_layers`.

    Raises:
        Eagle3ContractError: not 3 ids, ids that SGLang cannot capture, duplicates.
    """
    stack = "specforge"
    check_layers(num_layers, hidden_size)
    used = checked_ids(stack, ids)
    if used is not None and len(used) != 3:
        raise Eagle3ContractError(
            COUNT_MSG.format(stack=stack, why="SpecForge 0.2 requires exactly 3 capture layers "
                             "(algorithms/model_providers.py:206-210)", n=len(used), ids=list(used)))
    contract = specforge_sglang(ids, num_layers=num_layers, hidden_size=hidden_size, sglang_version=sglang_version,
                                dtype=dtype, source=source)
    label = sglang_version if isinstance(sglang_version, str) else "installed"
    return replace(contract, stack=stack, notes=tuple(n.replace("specforge-sglang", stack) for n in contract.notes),
                   source=source or f"SpecForge 0.2 (captured with sglang {label}) ids {list(used or ())}")
