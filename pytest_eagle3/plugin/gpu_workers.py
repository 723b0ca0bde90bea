"""pytest-xdist workers on GPU blocks: which block a pytest process (an xdist
worker, or the one process without xdist) tries first and how it names itself
to other processes (:func:`leaser_for_run`), how many workers ``-n auto`` runs
(:func:`auto_num_workers`) and the warning for ``-n N`` above the number of
blocks (:func:`oversubscription`).

The blocks come from :mod:`pytest_eagle3.engine.gpu_blocks`, the locks from
:mod:`pytest_eagle3.engine.lease`.  Nothing here imports torch or sglang.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from pytest_eagle3.engine.gpu_blocks import describe_blocks, settings_blocks
from pytest_eagle3.engine.lease import GpuLeaser, holder_label
from pytest_eagle3.errors import Eagle3ConfigError

if TYPE_CHECKING:
    import pytest

    from pytest_eagle3.settings import Settings

# Messages (tests import these).
MSG_OVERSUBSCRIBED = (
    "pytest-eagle3: -n {n} workers but {blocks} block(s) of --tp {tp} GPUs ({gpus}): "
    "{waiting} worker(s) will wait for a block; -n auto runs {blocks}"
)


def worker_id(config: "pytest.Config") -> str | None:
    """The xdist worker id (``"gw0"``), ``None`` without xdist (or in its controller)."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput.get("workerid"))


def worker_index(config: "pytest.Config") -> int:
    """``3`` for ``gw3``; ``0`` without xdist."""
    wid = worker_id(config) or ""
    digits = wid.lstrip("gw")
    return int(digits) if digits.isdigit() else 0


def owner_label(config: "pytest.Config | None" = None) -> str:
    """Who holds a lease, for messages: ``"xdist worker gw1 (pid 123 on host, run 1a2b3c4d)"``."""
    workerinput = getattr(config, "workerinput", None) if config is not None else None
    if not workerinput:
        return holder_label()
    return holder_label(f"xdist worker {workerinput.get('workerid')}",
                        str(workerinput.get("testrunuid", ""))[:8])


def leaser_for_run(
    settings: "Settings",
    config: "pytest.Config | None" = None,
    *,
    progress: Callable[[str], None] | None = None,
    nccl_port: bool = True,
) -> GpuLeaser | None:
    """The leaser of a pytest process; ``None`` on ``--device cpu`` (no lease there).

    Raises:
        Eagle3ConfigError: ``--tp`` above the visible GPUs.
    """
    if settings.device != "cuda":
        return None
    return GpuLeaser(settings_blocks(settings), owner=owner_label(config),
                     prefer=worker_index(config) if config is not None else 0,
                     progress=progress, nccl_port=nccl_port)


def auto_num_workers(settings: "Settings") -> int:
    """``-n auto`` for an eagle3 run.

    ``--device cuda``: one worker per block, ``visible GPUs // tp`` (at least 1):
    every worker then leases a block at once and none waits.  ``--device cpu``: 1.
    A CPU engine at TP ``n`` binds ``n`` OpenMP threads and its scheduler keeps
    polling; two engines on a small machine (the CPU tier is measured on 2 cores)
    only slow each other down, and each rank needs about 1.3 GB (docs/design.md,
    "SGLang on a plain x86 CPU").
    """
    if settings.device == "cuda":
        return max(1, settings.gpu.count // max(1, settings.tp))
    return 1


def oversubscription(settings: "Settings", numprocesses: Any) -> str | None:
    """The warning for ``-n N`` above the number of blocks on cuda, else ``None``."""
    if settings.device != "cuda" or not isinstance(numprocesses, int) or numprocesses < 2:
        return None
    try:
        blocks = settings_blocks(settings)
    except Eagle3ConfigError:
        return None
    if numprocesses <= len(blocks):
        return None
    return MSG_OVERSUBSCRIBED.format(n=numprocesses, blocks=len(blocks), tp=settings.tp,
                                     gpus=describe_blocks(blocks), waiting=numprocesses - len(blocks))
