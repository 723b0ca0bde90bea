"""The transformers reference: ground-truth residual-stream snapshots, cached.

:func:`ensure_reference` returns, per prompt, a float32 tensor
``[L+2, tokens, hidden]`` indexed as in :mod:`pytest_eagle3.verdicts.snapshots`:
``0..L`` = transformers ``output_hidden_states`` ``hs[0..L]`` (``hs[L]`` is
after the final norm), ``L+1`` = ``final_prenorm``.

transformers runs in a subprocess (:mod:`pytest_eagle3.target.reference_worker`,
like SGLang's ``HFRunner``) with ``HF_HUB_OFFLINE=1``, so the test process
never imports transformers and a crash there cannot take pytest down. Results
are cached as safetensors, keyed by the checkpoint's identity, the prompts,
the dtype and the transformers/torch versions; written atomically under a
FileLock, so pytest-xdist workers compute each reference once.

torch is imported inside functions only (to load the cached tensors).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pytest_eagle3.libversions import module_version
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_eagle3.errors import Eagle3ConfigError, Eagle3Error
import pytest_eagle3
from pytest_eagle3.reaper import die_with_parent as _die

if TYPE_CHECKING:
    import torch

#: Bump when the worker's output for the same inputs changes.
REFERENCE_VERSION = "1"
DTYPES = ("float32", "bfloat16", "float16")
#: Default location of the reference cache inside a checkpoint directory
#: (loaders ignore subdirectories; a checkpoint rebuild drops it with the entry).
REFERENCE_SUBDIR = "reference"
#: Lines of the worker's output quoted in :class:`ReferenceFailed`.
LOG_TAIL_LINES = 25
DEFAULT_TIMEOUT_S = 900.0

#: ``{what}``, ``{checkpoint}``, ``{log}``, ``{tail}``.
FAILED_MSG = (
    "transformers reference {what} for {checkpoint}; full log: {log}\n"
    "--- last lines of the reference worker ---\n{tail}"
)
#: ``{path}``, ``{error}``.
UNWRITABLE_MSG = (
    "cannot write the reference cache at {path} ({error}); "
    "pass cache_dir= a writable directory (the plugin uses its --eagle3-cache)"
)


class ReferenceFailed(Eagle3Error):
    """The transformers reference worker failed; the message quotes its log tail."""


def _dist_version(name: str) -> str:
    """The version of the importable module ``name`` (its owning distribution may
    be named otherwise: transformers-kt), ``"missing"`` when absent."""
    return module_version(name, missing="missing")


def checkpoint_identity(checkpoint_dir: Path) -> str:
    """A hash that changes whenever the checkpoint's bytes change.

    A built checkpoint has ``manifest.json`` (sizes + sha256 of every file): its
    hash is used. Otherwise name, size and mtime of every top-level file.
    """
    checkpoint_dir = Path(checkpoint_dir)
    manifest = checkpoint_dir / "manifest.json"
    h = hashlib.sha256()
    if manifest.is_file():
        h.update(b"manifest:" + manifest.read_bytes())
    else:
        h.update(str(checkpoint_dir.resolve()).encode())
        for p in sorted(checkpoint_dir.iterdir()):
            if p.is_file():
                st = p.stat()
                h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def reference_key(checkpoint_dir: Path, prompts: list[list[int]], dtype: str) -> str:
    """Hex sha256 of everything that determines the reference tensors."""
    material = {
        "version": REFERENCE_VERSION,
        "checkpoint": checkpoint_identity(checkpoint_dir),
        "prompts": [list(map(int, p)) for p in prompts],
        "dtype": dtype,
        "transformers": _dist_version("transformers"),
        "torch": _dist_version("torch"),
    }
    blob = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def reference_path(
    checkpoint_dir: Path, prompts: list[list[int]], *, dtype: str = "float32",
    cache_dir: Path | None = None,
) -> Path:
    """Where :func:`ensure_reference` caches this reference (may not exist yet)."""
    base = Path(cache_dir) if cache_dir is not None else Path(checkpoint_dir) / REFERENCE_SUBDIR
    key = reference_key(checkpoint_dir, prompts, dtype)
    return base / f"reference-{dtype}-{key[:16]}.safetensors"


def _load(path: Path, prompts: list[list[int]]) -> list[torch.Tensor] | None:
    """The cached tensors, or ``None`` if the file is missing, corrupt or does not fit."""
    from safetensors.torch import load_file

    try:
        data = load_file(str(path))
    except Exception:  # noqa: BLE001 - any unreadable file is simply recomputed
        return None
    out = []
    for i, ids in enumerate(prompts):
        t = data.get(f"prompt_{i:04d}")
        if t is None or t.dim() != 3 or t.shape[1] != len(ids):
            return None
        out.append(t)
    if len(data) != len(prompts):
        return None
    return out


def _tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


def worker_env() -> dict[str, str]:
    """The worker's environment: offline Hugging Face, this package importable."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )

    pkg_parent = str(Path(pytest_eagle3.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH", "")) if p)
    return env


def die_with_parent() -> None:
    """SIGKILL the worker when pytest dies (see :func:`pytest_eagle3.reaper.die_with_parent`)."""

    _die()


def _remove_leftovers(path: Path) -> None:
    """Remove what a killed worker left half-written for ``path`` (its ``.tmp-``
    output and prompts file).  Called while holding ``path``'s lock, so no other
    process is writing them."""
    for leftover in path.parent.glob(f".{path.name}.tmp-*"):
        leftover.unlink(missing_ok=True)


def _run_worker(
    checkpoint_dir: Path, prompts: list[list[int]], dtype: str, out: Path, log: Path,
    timeout_s: float, extra: list[str] | None = None,
) -> None:
    prompts_file = out.with_name(out.name + ".prompts.json")
    prompts_file.write_text(json.dumps({"prompts": prompts}), encoding="ascii")
    cmd = [
        sys.executable, "-m", "pytest_eagle3.target.reference_worker",
        "--checkpoint", str(checkpoint_dir), "--prompts", str(prompts_file),
        "--dtype", dtype, "--out", str(out), *(extra or []),
    ]
    try:
        with log.open("w", encoding="utf-8") as log_f:
            log_f.write("$ " + " ".join(cmd) + "\n")
            log_f.flush()
            proc = subprocess.run(
                cmd, stdout=log_f, stderr=subprocess.STDOUT, env=worker_env(),
                timeout=timeout_s, check=False, preexec_fn=die_with_parent,
            )
    except subprocess.TimeoutExpired:
        raise ReferenceFailed(
            FAILED_MSG.format(what=f"timed out after {timeout_s:.0f} s",
                              checkpoint=checkpoint_dir, log=log, tail=_tail(log))
        ) from None
    finally:
        prompts_file.unlink(missing_ok=True)
    if proc.returncode != 0 or not out.is_file():
        raise ReferenceFailed(
            FAILED_MSG.format(what=f"failed (exit status {proc.returncode})",
                              checkpoint=checkpoint_dir, log=log, tail=_tail(log))
        )


def ensure_reference(
    checkpoint_dir: Path,
    prompts: list[list[int]],
    *,
    dtype: str = "float32",
    cache_dir: Path | None = None,
    rebuild: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[torch.Tensor]:
    """Reference snapshots of ``prompts`` on ``checkpoint_dir``, computed once and cached.

    Args:
        checkpoint_dir: a Hugging Face checkpoint directory (built or local).
        prompts: token-id lists (no tokenizer involved).
        dtype: ``float32`` (the CPU tier), ``bfloat16`` or ``float16``; rotary
            ``inv_freq`` stays float32 in every case.
        cache_dir: where to cache; default ``<checkpoint_dir>/reference``. Pass a
            directory of your own for a read-only (user) checkpoint.
        rebuild: recompute even if a cached result exists.
        timeout_s: the worker's wall-clock limit.

    Returns:
        One float32 CPU tensor per prompt, ``[L+2, len(prompt), hidden]``:
        ``[i]`` = ``hs[i]`` for ``0 <= i <= L``, ``[L+1]`` = ``final_prenorm``.

    Raises:
        ValueError: unknown ``dtype`` or an empty prompt list/prompt.
        Eagle3ConfigError: the cache directory cannot be written.
        ReferenceFailed: the worker failed or timed out; the message names the
            log file and quotes its last lines.
    """
    from filelock import FileLock, Timeout

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    prompts = [[int(t) for t in p] for p in prompts]
    checkpoint_dir = Path(checkpoint_dir)
    path = reference_path(checkpoint_dir, prompts, dtype=dtype, cache_dir=cache_dir)
    if not rebuild:
        cached = _load(path, prompts) if path.is_file() else None
        if cached is not None:
            return cached
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock")
        lock.acquire(timeout=timeout_s + 60)
    except Timeout:  # a TimeoutError, hence an OSError: test it first
        raise ReferenceFailed(
            f"timed out waiting for another process computing {path}; "
            f"remove {path}.lock if no pytest is running"
        ) from None
    except OSError as exc:
        error = " ".join(str(exc).split())
        raise Eagle3ConfigError(UNWRITABLE_MSG.format(path=path.parent, error=error)) from None
    try:
        if not rebuild and path.is_file():
            cached = _load(path, prompts)
            if cached is not None:
                return cached
        _remove_leftovers(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        log = path.with_name(path.stem + ".log")
        try:
            _run_worker(checkpoint_dir, prompts, dtype, tmp, log, timeout_s)
            os.chmod(tmp, 0o644)  # safetensors creates files 0600
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    finally:
        lock.release()
    result = _load(path, prompts)
    if result is None:
        raise ReferenceFailed(
            FAILED_MSG.format(what="wrote an unreadable result", checkpoint=checkpoint_dir,
                              log=log, tail=_tail(log))
        )
    return result


def reference_details_path(
    checkpoint_dir: Path, prompts: list[list[int]], tp: int, *, dtype: str = "float32",
    cache_dir: Path | None = None,
) -> Path:
    """Where :func:`ensure_reference_details` caches its tensors."""
    base = Path(cache_dir) if cache_dir is not None else Path(checkpoint_dir) / REFERENCE_SUBDIR
    key = reference_key(checkpoint_dir, prompts, dtype)
    return base / f"details-{DETAILS_VERSION}-{dtype}-tp{tp}-{key[:16]}.safetensors"


#: Bump when the details worker's output for the same inputs changes.
DETAILS_VERSION = "2"


def ensure_reference_details(
    checkpoint_dir: Path,
    prompts: list[list[int]],
    tp: int,
    *,
    dtype: str = "float32",
    cache_dir: Path | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[dict[str, "torch.Tensor"]]:
    """Inside-the-layer reference tensors for the diagnoses, computed once and cached.

    Per prompt a dict: ``post_attention`` ``[L, T, H]`` (each layer's residual
    after attention), ``mlp`` ``[L, T, H]`` (what each layer's MLP branch adds
    to the residual stream), ``mlp_what`` (a str, only where that is not the
    plain MLP output: Gemma 3's post-feedforward norm) and, for ``tp > 1``
    without such a norm, ``partial`` ``[tp, L, T, H]`` (each TP rank's unreduced share of
    the MLP output, SGLang's contiguous intermediate shards).  Only failing
    comparisons ask for these (:mod:`pytest_eagle3.verdicts.diagnose`).

    Raises:
        ReferenceFailed, Eagle3ConfigError: as :func:`ensure_reference`.
    """
    from filelock import FileLock, Timeout
    from safetensors import safe_open
    from safetensors.torch import load_file

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    prompts = [[int(t) for t in p] for p in prompts]
    checkpoint_dir = Path(checkpoint_dir)
    path = reference_details_path(checkpoint_dir, prompts, tp, dtype=dtype, cache_dir=cache_dir)

    def load() -> list[dict[str, "torch.Tensor"]] | None:
        try:
            data = load_file(str(path))
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
        except Exception:  # noqa: BLE001 - unreadable: recompute
            return None
        # No rank shares where a norm follows the MLP (Gemma 3): the worker writes tp 1.
        names = ("post_attention", "mlp") + (("partial",) if meta.get("tp", str(tp)) != "1" else ())
        out = []
        for i, ids in enumerate(prompts):
            entry = {n: data.get(f"{n}_{i:04d}") for n in names}
            if any(t is None or t.shape[-2] != len(ids) for t in entry.values()):
                return None
            if meta.get("mlp_what"):
                entry["mlp_what"] = meta["mlp_what"]
            out.append(entry)
        return out

    if path.is_file() and (cached := load()) is not None:
        return cached
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock")
        lock.acquire(timeout=timeout_s + 60)
    except Timeout:
        raise ReferenceFailed(f"timed out waiting for another process computing {path}") from None
    except OSError as exc:
        raise Eagle3ConfigError(UNWRITABLE_MSG.format(path=path.parent, error=" ".join(str(exc).split()))) from None
    log = path.with_name(path.stem + ".log")
    try:
        if path.is_file() and (cached := load()) is not None:
            return cached
        _remove_leftovers(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            _run_worker(checkpoint_dir, prompts, dtype, tmp, log, timeout_s, ["--details-tp", str(tp)])
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    finally:
        lock.release()
    result = load()
    if result is None:
        raise ReferenceFailed(FAILED_MSG.format(what="wrote unreadable details", checkpoint=checkpoint_dir,
                                                log=log, tail=_tail(log)))
    return result
