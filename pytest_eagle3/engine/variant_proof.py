"""Whether an engine really took a path variant's path, from SGLang's
``/server_info`` (its resolved server args): the prefill rows the engine
returns for a prompt (:func:`prefill_rows`), a path SGLang resolved away
(:func:`path_not_taken`) and a row-shaping path no prompt reached
(:func:`path_not_exercised`).  The variants are :mod:`pytest_eagle3.engine.variants`.

A radix-cache hit returns only the uncached rows: the matched prefix is capped
at ``T - 1`` tokens (``Req._compute_max_prefix_len``) and rounded down to
``page_size`` (the ``repeat`` request field of :mod:`pytest_eagle3.engine.variants`).

Chunked prefill returns only the last chunk (measured on CPU, sglang 0.5.23):
middle chunks' rows are not stored (``batch_result_processor`` commits output
only when ``req.inflight_middle_chunks <= 0``), so a ``T``-token prompt with
chunk size ``C`` returns ``T - C * ((T - 1) // C)`` rows, positions
``C * ((T - 1) // C) .. T - 1``.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def prefill_rows(prompt_len: int, server_info: Mapping[str, Any], *, repeat: int = 1) -> int:
    """Prefill rows SGLang returns for the last of ``repeat`` sends of a
    ``prompt_len``-token prompt, from the engine's own resolved settings
    (``/server_info``: ``chunked_prefill_size``, ``disable_radix_cache``,
    ``page_size``), as measured on sglang 0.5.23 (module docstring; the ``repeat``
    request field of :mod:`pytest_eagle3.engine.variants`):

    * a radix-cache hit (cache on, ``repeat > 1``) returns the uncached tail:
      the matched prefix is ``page_size * ((T - 1) // page_size)`` tokens
      (``Req._compute_max_prefix_len``); on a hybrid linear-attention model
      whose cache keeps no extra mamba buffer (``uses_mamba_radix_cache`` with
      ``mamba_radix_cache_strategy`` ``no_buffer``) a prefix matches only where
      the cache holds the recurrent state, which chunked prefill leaves at each
      chunk boundary: ``C * ((T - 1) // C)`` tokens (measured on
      tiny-qwen3-next, chunk 16: 5 tokens return 5 rows, 23 tokens 7; without
      chunking no boundary is kept, so nothing matches: not measured);
    * chunked prefill returns the last chunk: ``T - C * ((T - 1) // C)`` rows;
    * otherwise all ``T`` rows.
    """
    T = int(prompt_len)
    page = max(1, int(server_info.get("page_size") or 1))
    chunk = server_info.get("chunked_prefill_size")
    chunk = int(chunk) if chunk is not None and int(chunk) > 0 else 0
    if repeat > 1 and not server_info.get("disable_radix_cache", True):
        if server_info.get("uses_mamba_radix_cache") and server_info.get("mamba_radix_cache_strategy") == "no_buffer":
            return T - (chunk * ((T - 1) // chunk) if chunk else 0)
        return T - page * ((T - 1) // page)
    if chunk:
        return T - chunk * ((T - 1) // chunk)
    return T


MSG_PATH_OFF = ("{variant}: path not taken: the engine was started with {asked}, but SGLang's "
                "/server_info reports {got} (it resolved the flag away; nothing was verified)")


MSG_NOT_ENGAGED = ("{variant}: path not taken: SGLang's /server_info reports {key}={got!r}, "
                   "the path needs {op} {value!r} (nothing was verified)")


def path_not_taken(variant: str, server_args: Mapping[str, Any], server_info: Mapping[str, Any],
                   engaged: Sequence[tuple[str, str, Any]] = ()) -> str | None:
    """Why the engine did not enter the variant's path, from ``/server_info``
    (SGLang's resolved server args, ``build_server_info`` in
    ``srt/utils/common.py``), or ``None`` when every server arg the variant set
    is in effect and every ``engaged`` rule holds (:attr:`Variant.engaged`).
    An arg or key ``/server_info`` does not report is not judged."""
    for name, asked in server_args.items():
        if name not in server_info:
            continue
        got = server_info[name]
        if got != asked and not (isinstance(asked, bool) and bool(got) == asked):
            return MSG_PATH_OFF.format(variant=variant, asked=f"{name}={asked!r}", got=f"{name}={got!r}")
    for key, op, value in engaged:
        node: Any = server_info
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, Mapping) else _ABSENT
        if node is _ABSENT:
            continue
        if (node == value) != (op == "=="):
            return MSG_NOT_ENGAGED.format(variant=variant, key=key, got=node, op=op, value=value)
    return None


_ABSENT = object()


MSG_NOT_EXERCISED = ("{variant}: path not exercised: with SGLang's resolved {settings}, every prompt "
                     "({lengths} tokens) returns all its rows, as without the path (nothing was verified)")


def path_not_exercised(variant: str, server_args: Mapping[str, Any], repeat: int, prompt_lens: Sequence[int],
                       server_info: Mapping[str, Any]) -> str | None:
    """Why a row-shaping path (chunked prefill, a radix-cache hit) changed no
    prompt's rows, or ``None``: e.g. every prompt fits in one chunk, or the KV
    page (``page_size``, 64 with trtllm_mla) is longer than every prompt."""
    chunk = server_args.get("chunked_prefill_size")
    if repeat <= 1 and not (chunk is not None and int(chunk) > 0):
        return None  # not a row-shaping path (no chunks; chunked_prefill_size=-1 turns them off)
    if any(prefill_rows(T, server_info, repeat=repeat) < T for T in prompt_lens):
        return None
    settings = ", ".join(f"{k}={server_info.get(k)!r}" for k in ("chunked_prefill_size", "page_size"))
    return MSG_NOT_EXERCISED.format(variant=variant, settings=settings,
                                    lengths=f"{min(prompt_lens)}..{max(prompt_lens)}")
