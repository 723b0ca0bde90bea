"""Whether a path variant can run here: what a variant needs (:class:`Needs`:
devices, TP size, GPU architecture, a CPU-tier fix) and the skip reason when
this run, or the installed SGLang's flags, fall short.

:meth:`pytest_eagle3.engine.variants.Variant.requirements` asks these checks for
every variant of the table, before anything starts: the installed SGLang must
accept its flags (read from its ``--help``, never from its version number) and
the device, TP size and GPU architecture must allow the path.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_eagle3.engine.gpus import normalize_arch
from pytest_eagle3.worker.cpu import fills

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall

#: GPU architectures, as ``sm<major><minor>`` (``sm10x``: any compute capability 10.x).
SM90 = "sm90"
SM10X = "sm10x"
#: GPUs that take single-batch overlap: every CUDA architecture of SGLang's kernels but SM90,
#: which SGLang refuses at startup (0.5.23 ``srt/layers/moe/utils.py:507-511``).
SBO_GPU_ARCHS = ("sm80", "sm86", "sm89", SM10X, "sm120", "sm121")

# Reason templates (tests import these).  {summary}: the variant's Needs.summary.
MSG_NO_FLAG = "{summary}; the installed {sglang} has {flags}"
MSG_DEVICE = "{summary}; this run is {device}"
MSG_TP = "{summary}; this case runs at TP {tp}"
MSG_ARCH = "{summary}; this GPU is {arch}"
MSG_ARCH_UNKNOWN = "{summary}; the GPU architecture of this run is unknown"
MSG_CPU_FIX = "{summary}; on cpu it also needs the CPU-tier fix {fix!r}, which this pytest-eagle3 lacks ({why})"


@dataclass(frozen=True)
class Needs:
    """What a variant needs to run.

    Attributes:
        summary: one clause naming the needs, the start of every skip reason
            (``"all-reduce fusion needs CUDA SM90/SM100 and TP>1"``).
        devices: devices the path exists on (``"cpu"``, ``"cuda"``).
        min_tp: smallest TP size that enters the path.
        gpu_archs: on CUDA, the architectures that enter it (:data:`SM90`,
            :data:`SM10X`); empty: any.
        cpu_fix: on CPU, the name of a CPU-tier fix the path needs, looked up
            in ``pytest_eagle3.worker.cpu.fills.FILL_NAMES`` (``""``: none).
        cpu_fix_why: what goes wrong on CPU without it.
    """

    summary: str = ""
    devices: tuple[str, ...] = ("cpu", "cuda")
    min_tp: int = 1
    gpu_archs: tuple[str, ...] = ()
    cpu_fix: str = ""
    cpu_fix_why: str = ""


NO_NEEDS = Needs()


def missing_flags(spellings: Sequence[Mapping[str, Any]], install: "SGLangInstall") -> str:
    """``no --a server argument`` / ``no --a, --b server arguments`` for the
    flags of the preferred spelling (``spellings[0]``) ``install`` lacks, plus
    ``(nor the older --c)`` for what the alternative spellings lack."""

    def missing(args: Mapping[str, Any]) -> list[str]:
        return ["--" + name.replace("_", "-") for name in args if not install.has_arg(name)]

    first = missing(spellings[0])
    older: list[str] = []
    for args in spellings[1:]:
        older += [flag for flag in missing(args) if flag not in first and flag not in older]
    text = f"no {', '.join(first)} server argument{'s' if len(first) > 1 else ''}"
    return text + (f" (nor the older {', '.join(older)})" if older else "")


def unmet_needs(needs: Needs, summary: str, device: str, tp: int,
                gpu_arch: str | Sequence[int] | None = None) -> str | None:
    """Why ``needs`` rule the path out on this run, or ``None`` when they allow it.

    Checks, in order: the device, the TP size, the CPU-tier fix (on cpu), the
    GPU architecture (on cuda; ``"sm90"``, ``"9.0"``, ``(9, 0)``; ``None``: unknown).
    ``summary`` starts the reason.
    """
    if device not in needs.devices:
        return MSG_DEVICE.format(summary=summary, device=device)
    if tp < needs.min_tp:
        return MSG_TP.format(summary=summary, tp=tp)
    if device == "cpu" and needs.cpu_fix and needs.cpu_fix not in cpu_tier_fixes():
        return MSG_CPU_FIX.format(summary=summary, fix=needs.cpu_fix, why=needs.cpu_fix_why)
    if device == "cuda" and needs.gpu_archs:
        arch = normalize_arch(gpu_arch)
        if arch is None:
            return MSG_ARCH_UNKNOWN.format(summary=summary)
        if not _arch_matches(arch, needs.gpu_archs):
            return MSG_ARCH.format(summary=summary, arch=arch)
    return None


def cpu_tier_fixes() -> frozenset[str]:
    """Names of the fixes the CPU tier installs in SGLang's processes
    (``pytest_eagle3.worker.cpu.fills.FILL_NAMES``; empty when it names none)."""

    return frozenset(fills.FILL_NAMES)


def _arch_matches(arch: str, wanted: tuple[str, ...]) -> bool:
    # sm10x: compute capability 10.x (SGLang's is_sm100 covers SM100/SM103).
    return any(arch == w or (w == SM10X and arch.startswith("sm10") and len(arch) == 5) for w in wanted)
