"""SGLang's rule mapping EAGLE-3 aux layer ids to residual-stream snapshots.

SGLang's DeepSeek model captures the *input* of layer ``i`` (the completed
residual stream) for every ``i`` in ``DeepseekV2Model.layers_to_capture``, in
layer order, so ``layers_to_capture = [i, ...]`` yields snapshots ``hs[i]``
(``snapshots.py``); ``i >= L`` is never reached and ``i = 0`` is the embedding.
``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture(ids)`` builds that list:

* sglang <= 0.5.12: always ``[v + 1 for v in ids]``;
* sglang >= 0.5.13 (PR #25454, May 2026): ``+1`` only when ``ids[0] == 1``,
  else ``ids`` unchanged;
* no ids: ``[2, L // 2, L - 3]`` (no offset).

Layer 0 (the embedding) can be captured only since sglang 0.5.14: before, the
capture adds ``hidden_states + residual`` while ``residual`` is still None
before layer 0, a TypeError at the first forward (0.5.9 ``deepseek_v2.py:2728``,
0.5.13 ``:2453``; 0.5.14 captures after ``prepare_attn`` sets the residual).

Read from ``srt/models/deepseek_v2.py`` of every wheel 0.5.8-0.5.23 and
measured on sglang 0.5.9 and 0.5.23 (``tests/data/measured_id_rules.json``).
This module is the *prediction*; the suite always measures what the running
engine captures and reports when the two disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from packaging.version import InvalidVersion, Version

#: First release with the first-id rule of PR #25454.
FIRST_ID_RULE_SINCE = Version("0.5.13")
#: First release whose DeepSeek model can capture layer 0 (the embedding).
EMBEDDING_CAPTURE_SINCE = Version("0.5.14")

ALWAYS_PLUS_ONE = "always +1 (sglang <= 0.5.12)"
PLUS_ONE_IF_FIRST_IS_ONE = "+1 only when the first id is 1 (sglang >= 0.5.13, PR #25454)"


@dataclass(frozen=True)
class Prediction:
    """What SGLang will capture for a list of ids.

    Attributes:
        rule: the rule applied (a module constant).
        layers_to_capture: SGLang's ``layers_to_capture`` list.
        snapshots: the snapshot index each capture slot will hold, in slot
            order (SGLang captures in layer order, whatever order ids have).
        missing: layers in ``layers_to_capture`` that are never reached
            (``>= L``): SGLang fails at the first forward with
            "captured k of K aux hidden states".
        embedding_fails: layer 0 is in ``layers_to_capture`` on a release
            that cannot capture it (TypeError at the first forward).
    """

    rule: str
    layers_to_capture: tuple[int, ...]
    snapshots: tuple[int, ...]
    missing: tuple[int, ...]
    embedding_fails: bool = False

    @property
    def fails_at_first_forward(self) -> bool:
        return (bool(self.missing) or self.embedding_fails
                or len(set(self.layers_to_capture)) != len(self.layers_to_capture))


def captures_embedding(version: str) -> bool:
    """Whether SGLang ``version``'s DeepSeek model can capture layer 0 (unknown or
    dev versions: yes, as the newest releases)."""
    try:
        return Version(version).release >= EMBEDDING_CAPTURE_SINCE.release
    except InvalidVersion:
        return True


def rule_for(version: str) -> str:
    """The id rule of an SGLang version (unknown or dev versions get the newest rule)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return PLUS_ONE_IF_FIRST_IS_ONE
    return ALWAYS_PLUS_ONE if parsed.release < FIRST_ID_RULE_SINCE.release else PLUS_ONE_IF_FIRST_IS_ONE


def predict(ids: Sequence[int] | None, num_layers: int, version: str) -> Prediction:
    """Predict the snapshots SGLang ``version`` captures for draft ids ``ids`` on ``num_layers`` layers."""
    rule = rule_for(version)
    if ids is None:
        layers = [2, num_layers // 2, num_layers - 3]
    elif rule == ALWAYS_PLUS_ONE or (ids and ids[0] == 1):
        layers = [v + 1 for v in ids]
    else:
        layers = list(ids)
    reached = sorted({i for i in layers if 0 <= i < num_layers})
    missing = tuple(i for i in layers if not 0 <= i < num_layers)
    embedding_fails = 0 in layers and not captures_embedding(version)
    return Prediction(rule, tuple(layers), tuple(reached), missing, embedding_fails)
