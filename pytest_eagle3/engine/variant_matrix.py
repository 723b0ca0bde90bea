"""The path matrix: every variant of :data:`pytest_eagle3.engine.variants.VARIANTS`
with its skip reason on this run (:func:`matrix`), and the matrix as text
(:func:`format_matrix`, what ``pytest --eagle3-list-variants`` prints).

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from pytest_eagle3.engine.gpus import normalize_arch
from pytest_eagle3.engine.variants import TP, VARIANTS, Variant

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall

LIST_HEADER = "eagle3 variants for {sglang}, device {device}, tp {tp}{arch}:"
LIST_RUNS = "runs"
LIST_SKIPPED = "skipped: {reason}"
LIST_LEFT_OUT = "left out of this run: {reason}"


def matrix(install: "SGLangInstall", device: str, tp: int,
           gpu_arch: str | Sequence[int] | None = None) -> list[tuple[Variant, str | None]]:
    """Every variant with its skip reason here (``None``: it runs), in :data:`VARIANTS` order."""
    return [(v, v.requirements(install, device, tp, gpu_arch)) for v in VARIANTS]


def _format_args(variant: Variant, install: "SGLangInstall", tp: int, device: str) -> str:
    if device == "cpu" and variant.cpu_args is not None:
        args = variant.cpu_args
    else:
        args = variant.spelling_for(install) or variant.server_args
    parts = [f"{k}={tp if v is TP else v!r}" for k, v in args.items()]
    parts += [f"request.{k}={v!r}" for k, v in variant.request.items()]
    if variant.ids is not None:
        parts.append(f"ids={variant.ids.__name__}(L, first_k_dense_replace)")
    return " ".join(parts) or "-"


def format_matrix(install: "SGLangInstall", device: str, tp: int,
                  gpu_arch: str | Sequence[int] | None = None,
                  left_out: "Callable[[Variant], str | None] | None" = None) -> str:
    """The matrix as text: a header, then ``name  args  runs|skipped: reason`` per variant.

    ``left_out``: why collection leaves a variant this machine can run out of the
    run (``--eagle3-slow`` not given, ...), or ``None``; such a variant does not
    count as running (``runs`` says only what collection keeps)."""
    rows = matrix(install, device, tp, gpu_arch)
    arch = normalize_arch(gpu_arch)
    lines = [LIST_HEADER.format(sglang=install.describe(), device=device, tp=tp,
                                arch=f", {arch}" if device == "cuda" and arch else "")]
    width = max(len(v.name) for v, _ in rows)
    runs = 0
    for variant, reason in rows:
        dropped = left_out(variant) if reason is None and left_out is not None else None
        if reason is not None:
            verdict = LIST_SKIPPED.format(reason=reason)
        elif dropped is not None:
            verdict = LIST_LEFT_OUT.format(reason=dropped)
        else:
            verdict, runs = LIST_RUNS, runs + 1
        lines.append(f"  {variant.name:<{width}}  {_format_args(variant, install, tp, device)}")
        lines.append(f"  {'':<{width}}  -> {verdict}")
    lines.append(f"{runs} of {len(rows)} variants run here")
    return "\n".join(lines) + "\n"
