"""Small helpers shared by the packaged suite's tests."""

from __future__ import annotations

from pytest_eagle3.options import Settings

#: Relative L2 tolerance for a slot to count as the expected snapshot.  CPU runs
#: in float32 (measured 6e-6 on sglang 0.5.23); CUDA kernels differ more (TF32,
#: fused kernels).  Distinct snapshots of the preset targets differ by >= 0.48.
CPU_TOL = 1e-3
CUDA_TOL = 2e-2


def tolerance(settings: Settings) -> float:
    return CPU_TOL if settings.device == "cpu" else CUDA_TOL
