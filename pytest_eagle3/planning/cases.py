"""The suite's id-list cases: the contract fixtures in ``fixtures/contracts``.

Each fixture is a draft config a user could write (ids as expressions in the
target's layer count ``L``, the training stack that declared them).  The
capture-order test checks SGLang's own rule on each list; the contracts test
checks the captures against what the stack trained the draft on; both share one
engine per list.

Engine starts dominate the suite's wall time, so only :data:`WIDE_CASE` (the
embedding-first layout, which also exercises the embedding all-reduce) runs at
every TP size up to ``--tp``; the other lists run at TP 1, because which layers
an id list selects does not depend on TP (the policy is in
:mod:`pytest_eagle3.planning.collect`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from pytest_eagle3.contracts.catalog import ContractFixture, contracts_dir, load_contract_fixture

#: Runs at every TP size: slot 0 is the embedding where the installed model file
#: captures layer 0 (upstream DeepSeek from 0.5.14).
WIDE_CASE = "kimi-embedding-first"



@lru_cache(maxsize=None)
def case_files() -> dict[str, Path]:
    """Fixture name -> file, read at collection (plain JSON, no torch)."""
    out = {}
    for path in sorted(contracts_dir().glob("*.json")):
        out[json.loads(path.read_text())["name"]] = path
    return out


def case_names() -> list[str]:
    return sorted(case_files())


def resolve(name: str, num_layers: int, hidden_size: int, sglang_version: Any) -> ContractFixture:
    """The fixture ``name`` for an ``L``-layer target; ``sglang_version``: the installed
    SGLang's :class:`~pytest_eagle3.conventions.IdRule` (or a version string for the
    version table), which a ``specforge-sglang`` fixture's ids are read with."""
    return load_contract_fixture(case_files()[name], num_layers, hidden_size=hidden_size,
                                 sglang_version=sglang_version)
