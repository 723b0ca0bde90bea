"""A SpecForge 0.2 run directory: its ``training_state.pt`` provenance record and the ids it names.

SpecForge 0.2 writes no ``config.json`` ids for run-option ids: they survive only
in the ``capture_layers`` entry of ``specforge_model_provenance`` in
``<output_dir>/<run_id>-step<N>/training_state.pt``
(:func:`pytest_eagle3.contracts.stacks_specforge.specforge`).
"""

from __future__ import annotations

from pathlib import Path

from pytest_eagle3.errors import Eagle3ContractError

#: Where a SpecForge 0.2 run keeps its provenance record (``training/checkpoint.py``).
SPECFORGE_STATE = "training_state.pt"
PROVENANCE_KEY = "specforge_model_provenance"
BAD_PROVENANCE_MSG = "SpecForge provenance record {record} is unreadable: {error}"


def specforge_state_file(path: Path) -> Path | None:
    """The SpecForge 0.2 ``training_state.pt`` of a draft directory: its own, else the
    ``<run_id>-latest`` checkpoint's, else the highest ``<run_id>-step<N>``'s (None: none)."""
    own = path / SPECFORGE_STATE
    if own.is_file():
        return own
    latest = sorted(path.glob(f"*-latest/{SPECFORGE_STATE}"))
    if latest:
        return latest[0]

    def step(p: Path) -> int:
        tail = p.parent.name.rsplit("-step", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    steps = sorted(path.glob(f"*-step*/{SPECFORGE_STATE}"), key=step)
    return steps[-1] if steps else None


def specforge_capture_layers(record: Path) -> tuple[int, ...] | None:
    """``capture_layers`` of a SpecForge 0.2 provenance record: ``torch.load`` of
    ``training_state.pt`` (weights only), key ``specforge_model_provenance``, a tuple
    of ``(key, value)`` pairs (SpecForge 0.2.0 ``algorithms/common/providers.py:37``,
    ``training/provenance.py:285-289``, sorted pairs at lines 341-344).  None when the
    run had no explicit ids (SpecForge's default was used).

    Raises:
        Eagle3ContractError: unreadable file, or no provenance record in it.
    """
    import torch  # only for a SpecForge run directory: its records are torch pickles

    try:
        state = torch.load(str(record), map_location="cpu", weights_only=True)
        pairs = dict(state[PROVENANCE_KEY])
    except Exception as exc:  # a pickle can fail in many ways; one line names it
        raise Eagle3ContractError(BAD_PROVENANCE_MSG.format(record=record, error=f"{type(exc).__name__}: "
                                                            f"{' '.join(str(exc).split())[:200]}")) from None
    layers = pairs.get("capture_layers")
    return None if layers is None else tuple(int(v) for v in layers)

