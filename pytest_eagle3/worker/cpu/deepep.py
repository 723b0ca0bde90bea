"""A CPU stand-in for DeepEP's all-to-all, so that SGLang's EP MoE path
(``--moe-a2a-backend deepep``), and with it two-batch overlap as DeepSeek-V3 runs
it, runs on the CPU tier.

DeepEP (``deep_ep.Buffer``) moves each token to the ranks holding its top-k
experts and back.  Its contract, as SGLang 0.5.23 calls it
(``srt/layers/moe/token_dispatcher/deepep.py``):

* normal mode (``_DeepEPDispatcherImplNormal``, prefill):
  ``get_dispatch_layout(topk_idx [T, K] int64, num_experts)`` returns the tokens per
  rank and per expert and ``is_token_in_rank [T, ranks]``; ``dispatch(x [T, H],
  topk_idx=, topk_weights=, ...)`` returns ``(recv_x [N, H], recv_topk_idx [N, K],
  recv_topk_weights [N, K], num_recv_tokens_per_expert, handle, event)``: one row per
  token that has an expert on this rank, its expert ids local (``-1``: another
  rank's); ``combine(x [N, H], handle)`` returns ``(out [T, H], weights, event)``,
  each token's rows summed on its own rank;
* low-latency mode (``_DeepEPDispatcherImplLowLatency``, decode):
  ``low_latency_dispatch(x [T, H], topk_idx [T, K], num_max_dispatch_tokens_per_rank,
  num_experts, use_fp8=...)`` returns ``(recv_x [E_local, N * ranks, H], recv_count
  [E_local] int32, handle, event, hook)``: local expert ``e`` received the
  ``recv_count[e]`` tokens in ``recv_x[e, :recv_count[e]]``;
  ``low_latency_combine(x [E_local, N * ranks, H], topk_idx, topk_weights, handle)``
  returns ``(out [T, H], event, hook)``, ``out[t] = sum_k topk_weights[t, k] * y_k(t)``,
  ``y_k(t)`` the output of expert ``topk_idx[t, k]`` for token ``t`` (``-1``: none).

This module keeps that contract over the EP group's own process group (gloo on
CPU): dispatch all-gathers every rank's tokens and routing; combine all-reduces
the rows each rank owns (zeros elsewhere) and each token's rank keeps its own.
Work has completed when a call returns, so every event is complete.  Bf16
dispatch only (``--deepep-dispatcher-output-dtype bf16``): FP8 dispatch raises
NotImplementedError.  The experts' grouped GEMMs on these layouts are
:func:`expert_core`.  Each rank logs :data:`DEEPEP_LINE` at the first call of each
operation.

Importable without torch: the stand-in classes are built when installed.
"""

from __future__ import annotations

import logging
import os
import types
from typing import Any

from pytest_eagle3.worker.cpu.patches import STANDIN_COMM_SMS, STANDIN_SMS, Namespace, torch_with_cuda

logger = logging.getLogger("pytest_eagle3.cpu")

DEEPEP_LINE = "pytest-eagle3 DeepEP stand-in: {what} on EP rank {rank} of {size} (pid {pid})"


def _standin_module() -> types.ModuleType:
    import torch
    import torch.distributed as dist

    class EventOverlap:
        """DeepEP's event handle: work on the CPU has completed when the call returns."""

        def current_stream_wait(self) -> None:
            return None

    class Config:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.args, self.kwargs = args, kwargs

        def get_nvl_buffer_size_hint(self, *args: Any) -> int:  # noqa: ARG002
            return 0

        def get_rdma_buffer_size_hint(self, *args: Any) -> int:  # noqa: ARG002
            return 0

    class Buffer:
        num_sms = STANDIN_COMM_SMS

        def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                     low_latency_mode: bool = False, **kwargs: Any) -> None:  # noqa: ARG002
            self.group = group
            self.group_size = dist.get_world_size(group)
            self.rank = dist.get_rank(group)
            self.low_latency_mode = low_latency_mode
            self._logged: set[str] = set()

        @staticmethod
        def get_low_latency_rdma_size_hint(*args: Any) -> int:  # noqa: ARG004
            return 0

        @staticmethod
        def get_dispatch_config(size: int) -> Config:  # noqa: ARG004
            return Config()

        @staticmethod
        def get_combine_config(size: int) -> Config:  # noqa: ARG004
            return Config()

        @staticmethod
        def capture() -> EventOverlap:
            return EventOverlap()

        def clean_low_latency_buffer(self, *args: Any) -> None:  # noqa: ARG002
            return None

        def _log(self, what: str) -> None:
            if what not in self._logged:
                self._logged.add(what)
                logger.warning(DEEPEP_LINE.format(what=what, rank=self.rank, size=self.group_size,
                                                  pid=os.getpid()))

        def _gather(self, t: Any) -> list:
            out = [torch.empty_like(t) for _ in range(self.group_size)]
            dist.all_gather(out, t.contiguous(), group=self.group)
            return out

        def get_dispatch_layout(self, topk_idx: Any, num_experts: int, previous_event: Any = None,  # noqa: ARG002
                                async_finish: bool = False, allocate_on_comm_stream: bool = False) -> tuple:
            self.num_experts = num_experts  # dispatch, which SGLang calls next, is not told
            local = num_experts // self.group_size
            owner = torch.where(topk_idx >= 0, topk_idx // local, -1)
            in_rank = torch.stack([(owner == r).any(dim=1) for r in range(self.group_size)], dim=1)
            per_expert = torch.bincount(topk_idx[topk_idx >= 0].flatten(), minlength=num_experts).int()
            return in_rank.sum(dim=0).int(), None, per_expert, in_rank, EventOverlap()

        def dispatch(self, x: Any, topk_idx: Any = None, topk_weights: Any = None,
                     num_tokens_per_rank: Any = None, num_tokens_per_rdma_rank: Any = None,  # noqa: ARG002
                     is_token_in_rank: Any = None, num_tokens_per_expert: Any = None,  # noqa: ARG002
                     previous_event: Any = None, async_finish: bool = False,  # noqa: ARG002
                     allocate_on_comm_stream: bool = False, expert_alignment: int = 1,  # noqa: ARG002
                     config: Any = None, **kwargs: Any) -> tuple:  # noqa: ARG002
            if isinstance(x, tuple):
                raise NotImplementedError("pytest-eagle3's DeepEP stand-in dispatches bf16 only: "
                                          "--deepep-dispatcher-output-dtype bf16")
            counts = self._gather(torch.tensor([x.shape[0]], dtype=torch.int64))
            sizes = [int(c) for c in counts]
            most = max(sizes) if sizes else 0
            pad = lambda t, fill: torch.cat([t, t.new_full((most - t.shape[0], *t.shape[1:]), fill)])  # noqa: E731
            all_x = self._gather(pad(x.float(), 0.0))
            all_idx = self._gather(pad(topk_idx, -1))
            all_w = self._gather(pad(topk_weights.float(), 0.0))
            local = self.num_experts // self.group_size
            lo, hi = self.rank * local, (self.rank + 1) * local
            rows, recv_idx, recv_w = [], [], []
            for src in range(self.group_size):
                idx = all_idx[src][: sizes[src]]
                mine = (idx >= lo) & (idx < hi)
                for t in mine.any(dim=1).nonzero().flatten().tolist():
                    rows.append((src, t))
                    recv_idx.append(torch.where(mine[t], idx[t] - lo, torch.full_like(idx[t], -1)))
                    recv_w.append(all_w[src][t])
            hidden, topk = x.shape[1], topk_idx.shape[1]
            recv_x = torch.stack([all_x[s][t] for s, t in rows]).to(x.dtype) if rows else x.new_zeros((0, hidden))
            ids = torch.stack(recv_idx) if rows else topk_idx.new_zeros((0, topk))
            weights = torch.stack(recv_w).to(topk_weights.dtype) if rows else topk_weights.new_zeros((0, topk))
            per_expert = [int((ids == e).sum()) for e in range(local)]
            if expert_alignment > 1:
                per_expert = [-(-n // expert_alignment) * expert_alignment for n in per_expert]
            self._log("dispatch (normal)")
            return recv_x, ids, weights, per_expert, (rows, sizes), EventOverlap()

        def combine(self, x: Any, handle: Any, async_finish: bool = False, previous_event: Any = None,  # noqa: ARG002
                    allocate_on_comm_stream: bool = False, config: Any = None, **kwargs: Any) -> tuple:  # noqa: ARG002
            rows, sizes = handle
            back = torch.zeros((self.group_size, max(sizes), x.shape[-1]), dtype=torch.float32)
            for (src, t), value in zip(rows, x):
                back[src, t] += value.float()
            dist.all_reduce(back, group=self.group)
            self._log("combine (normal)")
            return back[self.rank, : sizes[self.rank]].to(x.dtype), None, EventOverlap()

        def low_latency_dispatch(self, x: Any, topk_idx: Any, num_max_dispatch_tokens_per_rank: int,
                                 num_experts: int, use_fp8: bool = False, async_finish: bool = False,
                                 return_recv_hook: bool = False, **kwargs: Any) -> tuple:  # noqa: ARG002
            if use_fp8:
                raise NotImplementedError("pytest-eagle3's DeepEP stand-in dispatches bf16 only: "
                                          "--deepep-dispatcher-output-dtype bf16")
            n_max, ranks = num_max_dispatch_tokens_per_rank, self.group_size
            tokens, hidden = x.shape
            if tokens > n_max:
                raise ValueError(f"{tokens} tokens exceed num_max_dispatch_tokens_per_rank={n_max}")
            local = num_experts // ranks
            padded_x = x.new_zeros((n_max, hidden))
            padded_x[:tokens] = x
            padded_idx = topk_idx.new_full((n_max, topk_idx.shape[1]), -1)
            padded_idx[:tokens] = topk_idx
            all_x = self._gather(padded_x.float())
            all_idx = self._gather(padded_idx)
            recv_x = x.new_zeros((local, n_max * ranks, hidden))
            recv_count = torch.zeros(local, dtype=torch.int32)
            routes = []  # (source rank, token, k, local expert, slot)
            for src in range(ranks):
                for t, k in (all_idx[src] >= 0).nonzero().tolist():
                    expert = int(all_idx[src][t, k])
                    if expert // local != self.rank:
                        continue
                    e, slot = expert % local, int(recv_count[expert % local])
                    recv_x[e, slot] = all_x[src][t].to(x.dtype)
                    recv_count[e] += 1
                    routes.append((src, t, k, e, slot))
            handle = (routes, n_max, tuple(topk_idx.shape))
            self._log("low_latency_dispatch")
            hook = (lambda: None) if return_recv_hook else None
            return recv_x, recv_count, handle, EventOverlap(), hook

        def low_latency_combine(self, x: Any, topk_idx: Any, topk_weights: Any, handle: Any,
                                async_finish: bool = False, return_recv_hook: bool = False,
                                **kwargs: Any) -> tuple:  # noqa: ARG002
            routes, n_max, (tokens, topk) = handle
            back = torch.zeros((self.group_size, n_max, topk, x.shape[-1]), dtype=torch.float32)
            for src, t, k, e, slot in routes:
                back[src, t, k] = x[e, slot].float()
            dist.all_reduce(back, group=self.group)
            mine = back[self.rank, :tokens]  # [T, K, H]
            weights = topk_weights.float().masked_fill(topk_idx < 0, 0.0)
            out = (mine * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)
            self._log("low_latency_combine")
            hook = (lambda: None) if return_recv_hook else None
            return out, EventOverlap(), hook

    module = types.ModuleType("deep_ep")
    module.__doc__ = "pytest-eagle3's CPU stand-in for DeepEP (see pytest_eagle3.worker.cpu.deepep)."
    module.Buffer, module.Config, module.EventOverlap = Buffer, Config, EventOverlap
    return module


def install(module: Any) -> None:
    """Give SGLang's DeepEP dispatcher module (``srt/layers/moe/token_dispatcher/deepep.py``)
    the stand-in ``Buffer`` and ``Config`` where ``deep_ep`` could not be imported
    (``use_deepep`` False: no CUDA device); a no-op where CUDA is available or DeepEP
    imported.  Also answers the module's ``torch.cuda.get_device_properties`` (the SM
    count ``DeepEPBuffer.get_deepep_buffer`` logs against)."""
    import torch

    if torch.cuda.is_available() or getattr(module, "use_deepep", True):
        return

    standin = _standin_module()
    module.Buffer, module.Config = standin.Buffer, standin.Config
    module.use_deepep, module._deepep_import_error = True, None
    # combine_a passes the experts' output through only on DeepGEMM's branch (deepep.py:698-710)
    module.deep_gemm_wrapper = Namespace(module.deep_gemm_wrapper, ENABLE_JIT_DEEPGEMM=True)
    module.torch = torch_with_cuda(
        module.torch, get_device_properties=lambda device=None: types.SimpleNamespace(
            multi_processor_count=STANDIN_SMS, name="pytest-eagle3 CPU stand-in"))
    logger.info("pytest-eagle3: DeepEP's all-to-all stood in on CPU (pid %d)", os.getpid())


def expert_core(module: Any) -> None:
    """Run unquantized experts on DeepEP's two layouts on CPU.

    0.5.23's ``DeepEPMoE.run_moe_core`` (``srt/layers/moe/ep_moe/layer.py:278-313``)
    refuses unquantized experts (``NotImplementedError`` on the normal layout, an
    assertion on the low-latency one) unless ``deprecate_flag`` hands them to the
    DeepGEMM runner's grouped bf16 GEMM (``layer.py:135-147``, DeepGEMM's JIT), which
    needs CUDA.  This gives ``DeepEPMoE`` that computation in torch,
    ``w2[e] @ silu_and_mul(w13[e] @ x)`` per local expert ``e``:

    * normal layout (``DeepEPNormalDispatchOutput``): each received row sums its
      local experts' outputs weighted by its router weights (what the runner's
      ``ep_gather`` returns);
    * low-latency layout (``DeepEPLLDispatchOutput``): each local expert's
      ``masked_m[e]`` rows, unweighted (the combine weights them).

    A quantized layer or any other layout keeps SGLang's own code.  A no-op where
    CUDA is available or the module has no ``DeepEPMoE``.
    """
    import torch
    import torch.nn.functional as F

    cls = getattr(module, "DeepEPMoE", None)
    if cls is None or torch.cuda.is_available():
        return
    from sglang.srt.layers.moe.token_dispatcher.deepep import (
        DeepEPLLCombineInput,
        DeepEPLLDispatchOutput,
        DeepEPNormalCombineInput,
        DeepEPNormalDispatchOutput,
    )

    real = cls.run_moe_core
    layouts = (DeepEPLLDispatchOutput, DeepEPNormalDispatchOutput)

    def expert(layer: Any, e: int, x: Any) -> Any:
        gate, up = (x @ layer.w13_weight[e].t()).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ layer.w2_weight[e].t()

    def run_moe_core(self: Any, dispatch_output: Any) -> Any:
        if self.quant_config is not None or not isinstance(dispatch_output, layouts):
            return real(self, dispatch_output)
        if isinstance(dispatch_output, DeepEPNormalDispatchOutput):
            x, _scale, topk_ids, topk_weights, _per_expert = dispatch_output
            out = torch.zeros_like(x)
            for e in range(self.w13_weight.shape[0]):
                rows, slots = (topk_ids == e).nonzero(as_tuple=True)
                if rows.numel():
                    out.index_add_(0, rows, expert(self, e, x[rows]) * topk_weights[rows, slots, None].to(x.dtype))
            return DeepEPNormalCombineInput(hidden_states=out, topk_ids=topk_ids, topk_weights=topk_weights)
        x, _scale, topk_ids, topk_weights, masked_m, _expected = dispatch_output
        out = torch.zeros_like(x)
        for e in range(x.shape[0]):
            rows = int(masked_m[e])
            if rows:
                out[e, :rows] = expert(self, e, x[e, :rows])
        return DeepEPLLCombineInput(hidden_states=out, topk_ids=topk_ids, topk_weights=topk_weights)

    cls.run_moe_core = run_moe_core
    logger.info("pytest-eagle3: DeepEPMoE's expert GEMMs stood in on CPU (pid %d)", os.getpid())
