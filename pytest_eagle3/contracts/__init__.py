"""Training contracts: what an EAGLE-3 draft's ``fc`` was trained on, per training stack.

* :mod:`.contract`: :class:`Contract` (entries in ``hs`` indices, human one-line form).
* :mod:`.stacks`: one translator per training stack, :data:`STACKS`, :func:`translate`
  (the translators: :mod:`.stacks_vllm`, :mod:`.stacks_specforge`, :mod:`.stacks_fixed`;
  their shared id checks: :mod:`.stack_ids`).
* :mod:`.draft`: :func:`load_draft` (config ids, hidden size, ``fc`` shape from the
  safetensors header, :mod:`.fc_weight`; a SpecForge run's record, :mod:`.specforge_run`);
  :mod:`.draft_contract`: :func:`contract_for_draft`; :mod:`.unread_ids`: why a
  server will not read a draft's ids.
* :mod:`.catalog`: the ``fixtures/contracts`` fixtures, :func:`load_contract_fixtures`.

Pure Python and JSON: nothing here imports torch, transformers or sglang.
"""

from __future__ import annotations

from pytest_eagle3.contracts.catalog import ContractFixture, load_contract_fixture, load_contract_fixtures
from pytest_eagle3.contracts.contract import Contract, Entry
from pytest_eagle3.contracts.draft import DraftInfo, load_draft
from pytest_eagle3.contracts.draft_contract import contract_for_draft
from pytest_eagle3.contracts.fc_weight import read_safetensors_header
from pytest_eagle3.contracts.stacks import STACKS, get_translator, translate
from pytest_eagle3.errors import Eagle3ContractError
from pytest_eagle3.verdicts.snapshots import FINAL_PRENORM

__all__ = [
    "Contract",
    "ContractFixture",
    "DraftInfo",
    "Eagle3ContractError",
    "Entry",
    "FINAL_PRENORM",
    "STACKS",
    "contract_for_draft",
    "get_translator",
    "load_contract_fixture",
    "load_contract_fixtures",
    "load_draft",
    "read_safetensors_header",
    "translate",
]
