"""Capture-order cases: aux layer id lists, as functions of the layer count ``L``.

Each list is declared the way a draft config declares
``eagle_aux_hidden_state_layer_ids``; the installed SGLang's rule
(:mod:`pytest_eagle3.conventions`) says which snapshots it must capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

Ids = Optional[Sequence[int]]


@dataclass(frozen=True)
class IdCase:
    """A named id list; ``make(L)`` gives the ids (``None``: the draft declares none)."""

    name: str
    make: Callable[[int], Ids]
    why: str

    def ids(self, num_layers: int) -> Ids:
        return self.make(num_layers)


#: The embedding first, then two layer inputs (the Kimi-K2.5 training layout).
EMBEDDING_FIRST = IdCase(
    "embedding-first", lambda L: [0, L // 2, L - 2],
    "a list starting with 0: no offset on sglang >= 0.5.13, slot 0 is the embedding",
)
#: Starts with 1: SGLang adds +1 to every id (PR #25454), reaching the last capturable layer.
STARTS_WITH_ONE = IdCase(
    "starts-with-1", lambda L: [1, L // 2, L - 2],
    "a list starting with 1: SGLang reads it as layer outputs and adds +1 to every id",
)
#: SGLang's own default list, used when a draft config has no ids.
DEFAULT_IDS = IdCase(
    "default", lambda L: None,
    "no ids: SGLang's default [2, L//2, L-3] (distinct only for L >= 8)",
)

CAPTURE_ORDER_CASES = (EMBEDDING_FIRST, STARTS_WITH_ONE, DEFAULT_IDS)
