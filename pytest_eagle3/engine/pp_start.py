"""What a failed start at pipeline parallelism means: the ``[pp-earlier-stage]`` diagnosis.

With SGLang's PP gates lifted (a fork, a release that loosens them, or the
``pp-capture-gate-lifted`` upstream fix of
:mod:`pytest_eagle3.worker.upstream_fixes`), the capture path behind them runs:
only the last stage sets layers to capture (``set_eagle3_layers_to_capture``
returns on every other stage, 0.5.23 ``srt/models/deepseek_v2.py:3459``; SGLang
issue #39634), while its packer is sized for every id.  Measured on 0.5.23 at
PP 2 on CPU: the engine dies at its first forward, ``RuntimeError: captured 2
of 3 aux hidden states`` (``srt/layers/aux_hidden_states.py:87``).

:func:`explain_start` turns that cause into one line naming the defect: the
stage split (SGLang's own ``get_pp_indices``, read by
:mod:`pytest_eagle3.sglang_source.pp_code`), how many layers the last stage
captured of how many, and the line that keeps the earlier stages from
capturing.  Nothing here imports torch or sglang.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_eagle3.sglang_source.pp_code import EARLIER_STAGE_ISSUE, read_pp_code
from pytest_eagle3.target.spec import DEFAULT_ARCHITECTURE
from pytest_eagle3.worker.upstream_fixes import relay_named

if TYPE_CHECKING:
    from pytest_eagle3.engine.config import EngineConfig

#: SGLang's packer when fewer layers were captured than it was sized for (0.5.23 aux_hidden_states.py).
PACKER_SHORT = re.compile(r"captured (?P<got>\d+) of (?P<want>\d+) aux hidden states")

#: The cause a failed start at PP is grouped by (one root cause, one failure, whatever the counts).
PP_EARLIER_STAGE_CAUSE = "[pp-earlier-stage] at PP {pp} only the last stage captures ({check}; {issue})"
PP_EARLIER_STAGE = (
    "[pp-earlier-stage] at PP {pp} only the last stage captures: the engine died at its first forward with "
    "{cause}; the last stage holds layers {start}-{end} and captured {got} of the {want} layers to capture, "
    "{missing} on {where} ({stages}), which never {capture} ({check}; {issue})"
)


def _layers_and_architecture(model_path: str) -> tuple[int | None, str]:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None, DEFAULT_ARCHITECTURE
    if not isinstance(config, dict):
        return None, DEFAULT_ARCHITECTURE
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    value = config.get("num_hidden_layers") or text.get("num_hidden_layers")
    architectures = config.get("architectures") or [DEFAULT_ARCHITECTURE]
    return (int(value) if value else None), str(architectures[0])


def explain_start(config: "EngineConfig", cause: str | None,
                  sglang_location: str | None) -> tuple[str, str] | None:
    """``(cause, line)`` for a start that failed with ``cause`` at ``pp_size`` > 1: the cause
    the run groups failed starts by (:data:`PP_EARLIER_STAGE_CAUSE`, the same for every
    engine this root cause stops) and the ``[pp-earlier-stage]`` line with this engine's
    counts; ``None`` when the cause is not the packer's short count or the run is not at PP."""
    args = dict(config.server_args)
    pp = int(args.get("pp_size") or 1)
    found = PACKER_SHORT.search(cause or "")
    if pp < 2 or found is None or not sglang_location or relay_named():
        return None  # under the relay every stage captures: a short packer is something else
    layers, architecture = _layers_and_architecture(config.model_path)
    try:
        code = read_pp_code(sglang_location, architecture)
        stages = code.stages(layers, pp) if layers else None
    except Exception:  # noqa: BLE001 - SGLang's own split refused these sizes: no explanation, the cause stands
        return None
    if stages is None or code.earlier_stages_capture is not False:
        return None
    start, end = stages[-1]
    got, want = int(found["got"]), int(found["want"])
    earlier = ", ".join(f"stage {r}: layers {s}-{e - 1}" for r, (s, e) in enumerate(stages[:-1]))
    check = code.stage_check or "set_eagle3_layers_to_capture"
    one_stage = len(stages) == 2
    missing = "the other one lies" if want - got == 1 else f"the other {want - got} lie"
    line = PP_EARLIER_STAGE.format(pp=pp, cause=cause, start=start, end=end - 1, got=got, want=want,
                                   missing=missing, where="an earlier stage" if one_stage else "earlier stages",
                                   capture="captures" if one_stage else "capture", stages=earlier, check=check,
                                   issue=EARLIER_STAGE_ISSUE)
    return PP_EARLIER_STAGE_CAUSE.format(pp=pp, check=check, issue=EARLIER_STAGE_ISSUE), line
