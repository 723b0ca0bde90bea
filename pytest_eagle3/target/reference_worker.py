"""Subprocess entry point of the transformers reference (see :mod:`pytest_eagle3.target.reference`).

Usage::

    python -m pytest_eagle3.target.reference_worker --checkpoint DIR --prompts PROMPTS.json \\
        --dtype float32 --out OUT.safetensors

Loads ``DIR`` with ``AutoModelForCausalLM.from_pretrained`` (a multimodal
wrapper that transformers maps to no causal LM, such as Qwen2.5-VL: with
``AutoModelForImageTextToText``; text-only prompts) (offline, eager
attention), runs each prompt alone (batch 1, no padding, no KV cache) with
``output_hidden_states=True``, and writes one float32 tensor per prompt,
``prompt_<i>`` = ``[L+2, tokens, hidden]``: ``hs[0..L]`` then ``final_prenorm``
(the input of the final norm, captured by a forward pre-hook), the layout of
:mod:`pytest_eagle3.verdicts.snapshots`. Rotary ``inv_freq`` buffers are kept in float32
whatever ``--dtype`` is (docs/design.md, "Ground truth": the ``inv_freq`` pitfall).

With ``--details-tp N`` it writes :func:`run_details`'s tensors instead
(post-attention residuals, MLP outputs and each of ``N`` TP ranks' unreduced
MLP shares), which the diagnoses of :mod:`pytest_eagle3.verdicts.diagnose` use.

Exit status 0 on success; on failure a traceback on stderr and status 1.
Like SGLang's ``HFRunner``, it keeps transformers out of the test process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pytest_eagle3.target.checkpoint.family_worker import decoder_of, mlp_of, model_class

DTYPES = ("float32", "bfloat16", "float16")
#: Below this many bytes of safetensors the worker runs torch single-threaded.
SMALL_MODEL_BYTES = 256 * 1024 * 1024


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m pytest_eagle3.target.reference_worker")
    ap.add_argument("--checkpoint", required=True, type=Path)
    ap.add_argument("--prompts", required=True, type=Path, help='JSON: {"prompts": [[ids], ...]}')
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (0: torch default; default: 1 for small checkpoints)")
    ap.add_argument("--details-tp", type=int, default=None,
                    help="write the inside-the-layer tensors of run_details for this TP size instead")
    return ap.parse_args(argv)


def _keep_inv_freq_fp32(model: Any) -> int:
    """Recompute any rotary ``inv_freq`` that is not float32; returns how many were fixed."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    fixed = 0
    for module in model.modules():
        inv = getattr(module, "inv_freq", None)
        if not isinstance(inv, torch.Tensor) or inv.dtype == torch.float32:
            continue
        rope_type = getattr(module, "rope_type", "default")
        if rope_type == "default":
            fresh, _ = module.compute_default_rope_parameters(module.config, device=inv.device)
        else:
            fresh, _ = ROPE_INIT_FUNCTIONS[rope_type](module.config, device=inv.device)
        module.inv_freq = fresh.to(torch.float32)
        if hasattr(module, "original_inv_freq"):
            module.original_inv_freq = fresh.to(torch.float32).clone()
        fixed += 1
    return fixed


def _load(checkpoint: Path, dtype: str) -> Any:
    """The transformers model of ``checkpoint`` (eager attention, offline)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(checkpoint), local_files_only=True)
    return model_class(config).from_pretrained(
        str(checkpoint), dtype=getattr(torch, dtype), attn_implementation="eager", local_files_only=True,
    )


def _final_norm(model: Any) -> Any:
    decoder = decoder_of(model)[1]
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise RuntimeError(f"{type(decoder).__name__} has no final 'norm' to hook for final_prenorm")
    return norm


def run(
    checkpoint: Path, prompts: list[list[int]], dtype: str, threads: int | None = None
) -> tuple[list[Any], dict[str, str]]:
    """Reference snapshots of ``prompts``: ``([L+2, T, H] float32 per prompt], metadata)``.

    ``threads``: torch intra-op threads; ``0`` keeps torch's default; ``None``
    uses 1 for checkpoints under :data:`SMALL_MODEL_BYTES` (tiny ops run far
    faster single-threaded on shared cores) and torch's default otherwise.
    """
    import torch
    import transformers

    if threads is None:
        weight_bytes = sum(p.stat().st_size for p in Path(checkpoint).glob("*.safetensors"))
        threads = 1 if weight_bytes < SMALL_MODEL_BYTES else 0
    if threads > 0:
        torch.set_num_threads(threads)
    model = _load(checkpoint, dtype)
    model.eval()
    fixed = _keep_inv_freq_fp32(model)
    num_layers = len(decoder_of(model)[1].layers)
    captured: dict[str, torch.Tensor] = {}

    def pre_hook(_module: Any, args: tuple[Any, ...]) -> None:
        captured["prenorm"] = args[0]

    handle = _final_norm(model).register_forward_pre_hook(pre_hook)
    out: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            for i, ids in enumerate(prompts):
                captured.clear()
                input_ids = torch.tensor([ids], dtype=torch.long)
                result = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
                hs = result.hidden_states
                if len(hs) != num_layers + 1:
                    raise RuntimeError(
                        f"prompt {i}: expected {num_layers + 1} hidden states, got {len(hs)}"
                    )
                if "prenorm" not in captured:
                    raise RuntimeError(f"prompt {i}: the final-norm hook did not fire")
                stack = torch.stack([h[0] for h in hs] + [captured["prenorm"][0]])
                out.append(stack.to(torch.float32).contiguous())
    finally:
        handle.remove()
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": dtype,
        "num_layers": str(num_layers),
        "model_class": type(model).__name__,
        "inv_freq_fixed": str(fixed),
        "threads": str(torch.get_num_threads()),
    }
    return out, meta


def _shard_rows(rows: int, tp: int, rank: int) -> slice:
    """Rank ``rank``'s contiguous share of ``rows`` intermediate rows (SGLang's
    column-parallel gate/up and each MoE expert's ``w13`` under TP)."""
    if rows % tp:
        raise ValueError(f"intermediate size {rows} is not divisible by tp {tp}")
    per = rows // tp
    return slice(rank * per, (rank + 1) * per)


def _rank_mlp(mlp: Any, tp: int, rank: int) -> Any:
    """A copy of ``mlp`` whose output is TP rank ``rank``'s unreduced partial sum.

    Row-parallel ``down_proj`` makes each rank's output the sum over its own
    intermediate rows; zeroing every other gate/up row (``silu(0) * 0 == 0``)
    leaves exactly that sum.  Routing reads the full input and is unchanged.
    """
    import copy

    import torch

    part = copy.deepcopy(mlp)
    with torch.no_grad():
        for module in part.modules():
            fused = getattr(module, "gate_up_proj", None)
            if isinstance(fused, torch.nn.Parameter) and fused.dim() == 3:  # experts [E, 2I, H]
                inter = fused.shape[1] // 2
                keep = _shard_rows(inter, tp, rank)
                mask = torch.zeros(inter, dtype=torch.bool)
                mask[keep] = True
                fused[:, torch.cat([~mask, ~mask]), :] = 0
            for name in ("gate_proj", "up_proj"):
                linear = getattr(module, name, None)
                if isinstance(linear, torch.nn.Linear):
                    keep = _shard_rows(linear.weight.shape[0], tp, rank)
                    mask = torch.ones(linear.weight.shape[0], dtype=torch.bool)
                    mask[keep] = False
                    linear.weight[mask] = 0
    return part


def run_details(checkpoint: Path, prompts: list[list[int]], dtype: str, tp: int,
                threads: int | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Inside-the-layer tensors the diagnoses compare against, per prompt ``i``:

    * ``post_attention_<i>`` ``[L, T, H]``: layer ``l``'s residual after its
      attention (the input of ``post_attention_layernorm``; of
      ``pre_feedforward_layernorm`` in Gemma 3);
    * ``mlp_<i>`` ``[L, T, H]``: what layer ``l``'s MLP branch adds to the
      residual stream (``hs[l+1]`` minus the post-attention residual): the MLP
      output, or in Gemma 3 that output after ``post_feedforward_layernorm``
      (the metadata's ``mlp_what`` then names it);
    * ``partial_<i>`` ``[tp, L, T, H]`` (``tp > 1``): each TP rank's unreduced
      share of that MLP output (see :func:`_rank_mlp`).
    """
    import torch

    if threads is None:
        threads = 1
    if threads > 0:
        torch.set_num_threads(threads)
    model = _load(checkpoint, dtype)
    model.eval()
    _keep_inv_freq_fp32(model)
    decoder = decoder_of(model)[1]
    layers = list(decoder.layers)
    seen: dict[tuple[str, int], Any] = {}
    handles = []
    post_norm = _post_branch_norm(layers[0]) if layers else None

    def keep_mid(l: int) -> Any:
        def hook(_module: Any, args: tuple[Any, ...]) -> None:
            seen[("mid", l)] = args[0]
        return hook

    def keep_mlp(l: int) -> Any:
        def hook(_module: Any, args: tuple[Any, ...], out: Any) -> None:
            seen[("x", l)], seen[("mlp", l)] = args[0], out[0] if isinstance(out, tuple) else out
        return hook

    def keep_out(l: int) -> Any:
        def hook(_module: Any, _args: tuple[Any, ...], out: Any) -> None:
            seen[("out", l)] = out[0] if isinstance(out, tuple) else out
        return hook

    for l, layer in enumerate(layers):
        handles.append(getattr(layer, _mid_norm(layer)).register_forward_pre_hook(keep_mid(l)))
        handles.append(mlp_of(layer).register_forward_hook(keep_mlp(l)))
        handles.append(layer.register_forward_hook(keep_out(l)))
    if post_norm is not None:
        tp = 1  # a norm after the MLP: rank shares of its input are not shares of the branch
    ranks = [_rank_mlp(mlp_of(layer), tp, r) for layer in layers for r in range(tp)] if tp > 1 else []
    out: dict[str, Any] = {}
    try:
        with torch.no_grad():
            for i, ids in enumerate(prompts):
                seen.clear()
                model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
                key = f"{i:04d}"
                out[f"post_attention_{key}"] = torch.stack([seen[("mid", l)][0] for l in range(len(layers))])
                # What the MLP branch adds to the residual stream: the MLP output, or
                # (Gemma 3) that output after the post-feedforward norm.
                out[f"mlp_{key}"] = torch.stack([(seen[("out", l)] - seen[("mid", l)])[0]
                                                 for l in range(len(layers))])
                if tp > 1:
                    out[f"partial_{key}"] = torch.stack([
                        torch.stack([ranks[l * tp + r](seen[("x", l)])[0] for l in range(len(layers))])
                        for r in range(tp)
                    ])
    finally:
        for h in handles:
            h.remove()
    out = {k: v.to(torch.float32).contiguous() for k, v in out.items()}
    meta = {"dtype": dtype, "tp": str(tp), "num_layers": str(len(layers))}
    if post_norm is not None:
        meta["mlp_what"] = f"the MLP output of layer {{layer}} after its {post_norm}"
    return out, meta


def _mid_norm(layer: Any) -> str:
    """The norm whose input is the residual stream between attention and MLP:
    ``pre_feedforward_layernorm`` where the layer has post-branch norms (Gemma 3,
    transformers ``Gemma3DecoderLayer``), else ``post_attention_layernorm``."""
    return "pre_feedforward_layernorm" if _post_branch_norm(layer) else "post_attention_layernorm"


def _post_branch_norm(layer: Any) -> str | None:
    """``"post_feedforward_layernorm"`` when the MLP branch is normed before the
    residual add (Gemma 3), else ``None``."""
    return "post_feedforward_layernorm" if hasattr(layer, "post_feedforward_layernorm") else None


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from safetensors.torch import save_file

    data = json.loads(args.prompts.read_text(encoding="utf-8"))
    prompts = [list(map(int, p)) for p in data["prompts"]]
    if args.details_tp is not None:
        details, meta = run_details(args.checkpoint, prompts, args.dtype, args.details_tp, args.threads)
        save_file(details, str(args.out), metadata=meta)
        print(json.dumps({"ok": True, "prompts": len(prompts), **meta}))
        return 0
    tensors, meta = run(args.checkpoint, prompts, args.dtype, args.threads)
    save_file({f"prompt_{i:04d}": t for i, t in enumerate(tensors)}, str(args.out), metadata=meta)
    print(json.dumps({"ok": True, "prompts": len(tensors), **meta}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
