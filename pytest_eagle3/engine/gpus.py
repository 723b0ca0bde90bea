"""What GPUs this machine has, without importing torch.

* :func:`detect_gpus`: how many NVIDIA GPUs are visible (``CUDA_VISIBLE_DEVICES``,
  ``nvidia-smi -L``, ``/dev/nvidia<N>``), as a :class:`GpuProbe` with the evidence.
* :func:`detect_gpu_arch`: GPU 0's compute capability from ``nvidia-smi``.

The one place that probes GPUs: the plugin's settings, the GPU leases, the path
variants and the CUDA recipe all ask here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_eagle3.settings import GpuProbe


def detect_gpus(env: Mapping[str, str] | None = None) -> GpuProbe:
    """Count visible NVIDIA GPUs without importing torch.

    ``CUDA_VISIBLE_DEVICES`` set to ``""`` or ``-1`` means none; a list caps the
    count.  The physical count comes from ``nvidia-smi -L`` when it is on PATH,
    else from ``/dev/nvidia<N>`` device nodes.
    """
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e for e in visible.split(",") if e.strip()]
        if not entries or entries[0].strip() == "-1":
            return GpuProbe(0, f"CUDA_VISIBLE_DEVICES={visible!r}")
    physical, how = _physical_gpus()
    if visible is not None and physical:
        count = min(len(entries), physical)
        return GpuProbe(count, f"{how}, CUDA_VISIBLE_DEVICES={visible!r}")
    return GpuProbe(physical, how)


def _physical_gpus() -> tuple[int, str]:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "-L"], capture_output=True, text=True, timeout=15, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return 0, f"nvidia-smi -L failed: {exc}"
        count = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        return count, f"nvidia-smi -L: {count} GPU{'s' if count != 1 else ''}"
    nodes = [p for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit()]
    if nodes:
        return len(nodes), f"{len(nodes)} /dev/nvidia<N> device nodes"
    return 0, "no nvidia-smi, no /dev/nvidia<N>"


def normalize_arch(arch: str | Sequence[int] | None) -> str | None:
    """``"sm90"`` from ``"sm90"``, ``"sm_90"``, ``"9.0"``, ``"90"`` or ``(9, 0)``; ``None`` stays ``None``.

    >>> normalize_arch("10.0"), normalize_arch((9, 0)), normalize_arch("sm_120")
    ('sm100', 'sm90', 'sm120')
    """
    if arch is None:
        return None
    if not isinstance(arch, str):
        major, minor = (list(arch) + [0])[:2]
        return f"sm{int(major)}{int(minor)}"
    text = arch.strip().lower().replace("sm_", "").replace("sm", "")
    major, dot, minor = text.partition(".")
    if dot and major.isdigit() and (minor.isdigit() or not minor):
        return f"sm{int(major)}{int(minor or 0)}"
    return f"sm{text}" if text.isdigit() else None


#: GPU architecture ``--eagle3-plan`` assumes where it cannot see one (H100/H200 runners).
PLAN_GPU_ARCH = "sm90"


def detect_gpu_arch() -> str | None:
    """Compute capability of GPU 0 from ``nvidia-smi`` (no torch), e.g. ``"sm90"``; ``None`` if unknown."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return normalize_arch(lines[0]) if lines else None
