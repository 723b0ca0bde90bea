"""Proof, from an engine's log, that a CPU-tier stand-in path really ran on every TP rank.

The CPU tier runs five of SGLang's production branches through stand-ins: the
in-place norms (:mod:`pytest_eagle3.worker.cpu.norms`), the fused all-reduce
(:mod:`pytest_eagle3.worker.cpu.allreduce_fusion`), single-batch overlap's
second stream (``patches.sbo_streams`` of :mod:`pytest_eagle3.worker.cpu.patches`),
two-batch overlap over the DeepEP stand-in (:mod:`pytest_eagle3.worker.cpu.deepep`;
its proof is the split line of :mod:`pytest_eagle3.worker.tbo_proof`), the two
selected by a server argument, not the env, and SGLang's overlap schedule for
speculative decoding (:mod:`pytest_eagle3.worker.cpu.spec_overlap`).  Each stand-in logs one line at
its first call in a process; a test on such an
engine passes only if at least ``tp`` processes (one per TP rank) logged it,
else it fails with :data:`NOT_TAKEN`: a configured path that never ran
proves nothing.  Nothing here imports torch or sglang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from pytest_eagle3.engine.config import attention_dp_size
from pytest_eagle3.worker.cpu import spec_overlap
from pytest_eagle3.worker.env import FUSION_ENV, NORM_PATH_ENV

NOT_TAKEN = ("{engine}: {path} was configured ({env}) but {what}: the path did not run, so this test "
             "proves nothing about it (log: {log})")


@dataclass(frozen=True)
class StandinPath:
    """One stand-in path: what turns it on and the log line its kernels write.

    Attributes:
        name: what the path is, for messages (``the in-place norm path``).
        env: ``(variable, value)`` in the engine's env that selects it, or with
            ``by_arg`` ``(server argument, value)`` among a cpu engine's server args.
        called: regex of the first-call line; group ``op`` names the kernel, ``pid`` the process.
        by_arg: ``env`` names a server argument, not an environment variable.
    """

    name: str
    env: tuple[str, Any]
    called: re.Pattern[str]
    by_arg: bool = False


PATHS = (
    StandinPath("the in-place norm path", (NORM_PATH_ENV, "inplace"),
                re.compile(r"pytest-eagle3 norm stand-in: sgl_kernel\.(?P<op>\w+) called \(pid (?P<pid>\d+)")),
    StandinPath("all-reduce fusion", (FUSION_ENV, "1"),
                re.compile(r"pytest-eagle3 all-reduce fusion stand-in: (?P<op>\w+) called \(pid (?P<pid>\d+)")),
    StandinPath("single-batch overlap's second stream", ("enable_single_batch_overlap", True),
                re.compile(r"pytest-eagle3 SBO stand-in: (?P<op>\w+)\.wait_stream called \(pid (?P<pid>\d+)"),
                by_arg=True),
    # The split line of pytest_eagle3.worker.tbo_proof (op: the forward mode), written on every DP rank.
    StandinPath("two-batch overlap", ("enable_two_batch_overlap", True),
                re.compile(r"pytest-eagle3 TBO: (?P<op>\w+) batch of \d+ token\(s\) split .*?\(pid (?P<pid>\d+)\)"),
                by_arg=True),
    StandinPath("SGLang's overlap schedule for speculative decoding", (spec_overlap.OVERLAP_ENV, "1"),
                re.compile(spec_overlap.PROOF)),
)


def ops_called(log_text: str, path: StandinPath) -> dict[str, set[int]]:
    """Stand-in op -> pids that called it, from an engine's log."""
    out: dict[str, set[int]] = {}
    for m in path.called.finditer(log_text):
        out.setdefault(m.group("op"), set()).add(int(m.group("pid")))
    return out


def configured(env: Mapping[str, str], cpu_args: Mapping[str, Any] | None = None) -> list[StandinPath]:
    """The stand-in paths an engine with ``env`` runs (and, on cpu, with server args ``cpu_args``).

    All-reduce fusion is not among them under an EP all-to-all backend
    (``moe_a2a_backend`` other than ``none``): its combine sums the MoE output and DP
    attention leaves no attention all-reduce, so there is no all-reduce to fuse; nor
    under DP attention at all: SGLang's gate ``flashinfer_ar_fusion_applies`` is false
    there (0.5.23 ``srt/layers/layer_boundary/residual/add_norm.py``, ``not
    is_dp_attention_enabled()``; measured: a DP-attention engine of a run with
    ``--eagle3-cpu-allreduce-fusion`` calls no fused op)."""
    args = cpu_args or {}
    paths = [p for p in PATHS if (args if p.by_arg else env).get(p.env[0]) == p.env[1]]
    if str(args.get("moe_a2a_backend") or "none").lower() != "none" or attention_dp_size(args) > 1:
        paths = [p for p in paths if p.env[0] != FUSION_ENV]
    return paths


def not_taken(log_text: str, path: StandinPath, tp: int) -> str | None:
    """Why ``path`` did not run on every TP rank (``None``: it ran)."""
    called = ops_called(log_text, path)
    if not called:
        return "no process called its stand-in kernels"
    pids = set().union(*called.values())
    if len(pids) < tp:
        return f"only {len(pids)} of {tp} TP ranks called its stand-in kernels ({', '.join(sorted(called))})"
    return None
