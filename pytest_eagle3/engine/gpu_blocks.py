"""GPU blocks: the visible GPUs cut into blocks of ``--tp``, the unit a pytest
process leases (:mod:`pytest_eagle3.engine.lease`), each with its own window
of NCCL ports.

Blocks.  The visible GPUs are the entries of ``CUDA_VISIBLE_DEVICES`` when it
lists any (physical ids, UUIDs or MIG ids, as written), else ``0 .. count-1``
with ``count`` from :func:`pytest_eagle3.engine.gpus.detect_gpus`.  They are cut
into consecutive blocks of ``tp``: 8 GPUs at ``--tp 2`` give ``0,1 | 2,3 | 4,5
| 6,7``; ``--tp 8`` gives one block; GPUs left over (6 GPUs at ``--tp 4``) are
not used.  ``--tp`` above the visible count is refused earlier, as a usage error
(:func:`pytest_eagle3.plugin.validate.validate_settings`); :func:`gpu_blocks` refuses it
too (:class:`~pytest_eagle3.errors.Eagle3ConfigError`) for callers outside pytest.

Ports.  Engines bind their HTTP port from the kernel (a free port, see
:func:`pytest_eagle3.engine.ports.free_port`); SGLang's NCCL/TCPStore port
(``--nccl-port``, otherwise random in 22000-29999) comes from the lease's own
window of :data:`PORT_STRIDE` ports at ``PORT_BASE + PORT_STRIDE * k`` (``k`` the
block's first GPU id, or its position when ids are not numbers), the first port
there that is free, so engines on different blocks never race for one.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from pytest_eagle3.errors import Eagle3ConfigError

if TYPE_CHECKING:
    from pytest_eagle3.settings import Settings

#: NCCL port windows: ``PORT_BASE + PORT_STRIDE * k`` .. ``+ PORT_STRIDE - 1``
#: (below SGLang's own random range 22000-29999 and the kernel's ephemeral range).
PORT_BASE = 15000
PORT_STRIDE = 100

# Messages (tests import these).
MSG_TOO_FEW = (
    "--tp {tp} needs {tp} GPUs on --device cuda but {count} are visible ({gpus}); "
    "lower --tp or make more GPUs visible"
)


@dataclass(frozen=True)
class GpuBlock:
    """``tp`` consecutive visible GPUs.

    Attributes:
        index: position of the block among the blocks of the visible GPUs (0-based).
        gpus: the GPU ids as ``CUDA_VISIBLE_DEVICES`` writes them (``("2", "3")``).
        port_key: ``k`` of the block's NCCL port window (see the module docstring).
    """

    index: int
    gpus: tuple[str, ...]
    port_key: int

    @property
    def label(self) -> str:
        """``"2,3"``."""
        return ",".join(self.gpus)

    @property
    def ports(self) -> range:
        """The block's NCCL port window."""
        start = PORT_BASE + PORT_STRIDE * self.port_key
        return range(start, start + PORT_STRIDE)

    def env(self) -> dict[str, str]:
        """``{"CUDA_VISIBLE_DEVICES": "2,3"}``: the engine sees exactly this block."""
        return {"CUDA_VISIBLE_DEVICES": self.label}


def visible_gpu_ids(count: int, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Ids of the ``count`` visible GPUs: ``CUDA_VISIBLE_DEVICES`` entries when it
    lists at least ``count`` (the first ``count``), else ``"0" .. str(count - 1)``.

    ``count`` is what the GPU probe saw (:attr:`pytest_eagle3.engine.gpus.GpuProbe.count`),
    which is already capped by ``CUDA_VISIBLE_DEVICES``.
    """
    env = os.environ if env is None else env
    entries = [e.strip() for e in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if entries and entries[0] != "-1" and len(entries) >= count:
        return tuple(entries[:count])
    # No list, or a shorter one than the count (``--eagle3-plan-gpus`` pretending more).
    return tuple(str(i) for i in range(count))


def gpu_blocks(gpu_ids: Sequence[str], tp: int) -> list[GpuBlock]:
    """Cut ``gpu_ids`` into consecutive blocks of ``tp`` (leftover GPUs unused).

    >>> [b.gpus for b in gpu_blocks(["0", "1", "2", "3"], 2)]
    [('0', '1'), ('2', '3')]

    Raises:
        Eagle3ConfigError: ``tp`` is larger than the number of GPUs.
    """
    ids = [str(g) for g in gpu_ids]
    if tp < 1 or tp > len(ids):
        raise Eagle3ConfigError(MSG_TOO_FEW.format(tp=tp, count=len(ids), gpus=",".join(ids) or "none"))
    numeric = all(g.isdigit() for g in ids)
    blocks = []
    for index in range(len(ids) // tp):
        gpus = tuple(ids[index * tp:(index + 1) * tp])
        blocks.append(GpuBlock(index, gpus, int(gpus[0]) if numeric else index * tp))
    return blocks


def describe_blocks(blocks: Sequence[GpuBlock]) -> str:
    """``"0,1 | 2,3"``."""
    return " | ".join(b.label for b in blocks)


def settings_blocks(settings: "Settings", env: Mapping[str, str] | None = None) -> list[GpuBlock]:
    """The blocks of a ``--device cuda`` run (``settings.gpu.count`` GPUs, ``settings.tp`` x
    ``settings.pp`` each: at PP an engine's stages take consecutive GPUs from its ``base_gpu_id``)."""
    return gpu_blocks(visible_gpu_ids(settings.gpu.count, env), settings.tp * max(1, settings.pp))
