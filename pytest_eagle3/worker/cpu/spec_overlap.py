"""SGLang's overlap schedule for speculative decoding on CPU (the ``spec_overlap_schedule`` fills).

SGLang 0.5.23 runs EAGLE with its overlap schedule (``Scheduler.event_loop_overlap``)
by default, but turns it off on CPU before anything runs:
``srt/arg_groups/speculative_hook.py`` ``_disable_overlap_schedule_for_cpu``
("Overlap schedule is not implemented for speculative decoding on CPU").
Measured with that lifted: the overlap path's only CPU gap is one Triton kernel,
``sglang/kernels/ops/speculative/gather_spec_extras.py`` ``gather_spec_extras``,
which ``srt/managers/overlap_utils.py`` ``FutureMap._resolve_spec_extras`` calls
to gather the next draft's inputs (top-k probabilities, top-k ids, bonus tokens,
aux hidden states) by one row index ("0 active drivers" on CPU).  With the
stand-in below EAGLE-3 runs under the overlap schedule on CPU and its output
equals greedy decoding.

Two fills, applied only where the engine host set :data:`OVERLAP_ENV` (the
``other-schedule`` speculative shape, :mod:`pytest_eagle3.engine.spec_shapes`):

* :func:`keep_overlap_schedule` (module ``speculative_hook``): the CPU
  resolution leaves the overlap schedule as the arguments resolved it;
* :func:`gather_spec_extras_standin` (module ``overlap_utils``): the same
  contract as the Triton kernel, out of place, in plain torch: each output row
  ``i`` is row ``indices[i]`` of its buffer, a new tensor per buffer, ``None`` for
  absent hidden states.  Its first call in a process logs :data:`CALLED`, the
  proof that the overlap path ran (:mod:`pytest_eagle3.engine.standin_proof`).

Importable without torch or SGLang.
"""

from __future__ import annotations

import logging
import os
from typing import Any

#: The engine environment switch (set by ``engine/spec_shapes.py``).
OVERLAP_ENV = "PYTEST_EAGLE3_SPEC_OVERLAP"
#: Logged once per process at the stand-in's first call; ``op`` and ``pid`` for the proof's regex.
CALLED = "pytest-eagle3 overlap stand-in: {op} called (pid {pid})"
PROOF = r"pytest-eagle3 overlap stand-in: (?P<op>\w+) called \(pid (?P<pid>\d+)"

logger = logging.getLogger("pytest_eagle3.cpu")
_called: set[str] = set()


def wanted() -> bool:
    return os.environ.get(OVERLAP_ENV, "") == "1"


def _keep(server_args: Any) -> None:
    """Stands in for ``_disable_overlap_schedule_for_cpu``: the overlap schedule stays."""
    return None


def keep_overlap_schedule(module: Any) -> None:
    """Lift SGLang's CPU switch-off of the overlap schedule for speculative decoding."""
    if not hasattr(module, "_disable_overlap_schedule_for_cpu"):
        return
    module._disable_overlap_schedule_for_cpu = _keep
    logger.warning("pytest-eagle3: SGLang's overlap schedule kept for speculative decoding on CPU "
                   "(speculative_hook._disable_overlap_schedule_for_cpu lifted; pid %d)", os.getpid())


def gather_spec_extras(indices: Any, topk_p_buf: Any, topk_index_buf: Any, output_tokens_buf: Any,
                       hidden_states_buf: Any) -> tuple[Any, Any, Any, Any]:
    """Plain-torch ``gather_spec_extras``: ``(topk_p, topk_index, bonus_tokens, hidden_states)``,
    row ``i`` of each = row ``indices[i]`` of its buffer (new tensors)."""
    if "gather_spec_extras" not in _called:
        _called.add("gather_spec_extras")
        logger.warning(CALLED.format(op="gather_spec_extras", pid=os.getpid()))
    rows = indices.reshape(-1).long()
    return (topk_p_buf[rows].clone(), topk_index_buf[rows].clone(), output_tokens_buf[rows].clone(),
            None if hidden_states_buf is None else hidden_states_buf[rows].clone())


def gather_spec_extras_standin(module: Any) -> None:
    """Replace ``overlap_utils.gather_spec_extras`` (the name its caller looks up) with the stand-in."""
    if hasattr(module, "gather_spec_extras"):
        module.gather_spec_extras = gather_spec_extras
