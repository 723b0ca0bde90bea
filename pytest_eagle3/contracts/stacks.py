"""Translators from each training stack's layer ids to a :class:`Contract`.

Every translator has the signature::

    translator(ids, *, num_layers, hidden_size, dtype=None, source="", **stack_options) -> Contract

where ``ids`` is what the stack was given (normally the draft config's
``eagle_aux_hidden_state_layer_ids``; ``None`` when it names none, so the stack
used its default).  Each docstring cites the code it was read from (repository,
path, function, commit or PR).  :func:`translate` dispatches by name through
:data:`STACKS`.  The translators live by stack: :mod:`.stacks_vllm` (speculators,
vLLM), :mod:`.stacks_specforge` (SpecForge), :mod:`.stacks_fixed` (EAGLE, raw); the
checks they share: :mod:`.stack_ids`.

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
from typing import Any, Callable, Sequence

from pytest_eagle3.contracts.contract import Contract
from pytest_eagle3.contracts.stacks_fixed import eagle, raw
from pytest_eagle3.contracts.stacks_specforge import specforge, specforge_hf, specforge_sglang
from pytest_eagle3.contracts.stacks_vllm import speculators, vllm
from pytest_eagle3.errors import Eagle3ContractError

#: ``translator(ids, *, num_layers, hidden_size, dtype=None, source="", **options) -> Contract``
Translator = Callable[..., Contract]

# Message templates (tests import these).
UNKNOWN_STACK_MSG = "unknown training stack {name!r}; known stacks: {known}"
BAD_OPTION_MSG = "stack {stack!r} takes no option {option!r}; its options: {options}"


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
