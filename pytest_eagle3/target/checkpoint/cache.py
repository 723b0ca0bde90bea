"""The keyed, atomic, xdist-safe checkpoint cache.

Layout under ``cache_root``::

    checkpoints/
      <name>-<key[:16]>/          a complete entry: config.json, model.safetensors,
        manifest.json             build_info.json, and manifest.json written last
      <name>-<key[:16]>.lock      FileLock serialising builders of that entry
      .<name>-<key[:16]>.tmp-*    a build in progress (removed if left by a crash)

An entry is valid when ``manifest.json`` exists and every file it lists has
the recorded size and sha256. Anything else (no manifest, truncated or edited
file) is rebuilt. Builds go into a temporary sibling that is renamed into
place, so readers never see a half-written entry; the lock makes concurrent
pytest-xdist workers build once and the others reuse.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.target.checkpoint import builder
from pytest_eagle3.target.checkpoint.builder import BUILDER_VERSION

if TYPE_CHECKING:
    from pytest_eagle3.target.spec import TargetSpec

MANIFEST_FILE = "manifest.json"
#: ``{file: mtime_ns}`` at manifest time (a dot file: not part of the entry's manifest).
STAMPS_FILE = ".stamps.json"
MANIFEST_VERSION = 1
#: ``{path}``: the directory; ``{error}``: the OS error, one line.
UNWRITABLE_MSG = (
    "cannot write the checkpoint cache at {path} ({error}); "
    "pass a writable directory with --eagle3-cache DIR or fix its permissions"
)
#: How long a builder waits for another one holding the lock (seconds).
LOCK_TIMEOUT_S = 1800.0


def cache_key(spec: TargetSpec) -> str:
    """Hex sha256 of the spec's canonical JSON (:attr:`TargetSpec.canonical_json`,
    everything that determines the checkpoint bytes) plus
    :data:`~pytest_eagle3.target.checkpoint.builder.BUILDER_VERSION`."""

    material = f"{spec.canonical_json}|builder_version={BUILDER_VERSION}"
    return hashlib.sha256(material.encode("ascii")).hexdigest()


def entry_dir(spec: TargetSpec, cache_root: Path) -> Path:
    """``cache_root/checkpoints/<name>-<key[:16]>`` (may not exist yet)."""
    return Path(cache_root) / "checkpoints" / f"{spec.name}-{cache_key(spec)[:16]}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path, key: str) -> None:
    """Record size and sha256 of every regular file in ``directory`` (not subdirectories).

    Written to a temporary name and renamed, so it appears complete or not at all.
    """
    files = {}
    for p in sorted(directory.iterdir()):
        if p.is_file() and p.name != MANIFEST_FILE and not p.name.startswith("."):
            files[p.name] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    data = {"version": MANIFEST_VERSION, "key": key, "files": files}
    # Modification times go in a file of their own (the manifest's bytes stay
    # deterministic): check_entry trusts a file whose size and time are unchanged.
    stamps = {name: directory.joinpath(name).stat().st_mtime_ns for name in files}
    (directory / STAMPS_FILE).write_text(json.dumps(stamps, sort_keys=True), encoding="ascii")
    tmp = directory / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="ascii")
    os.replace(tmp, directory / MANIFEST_FILE)


def check_entry(directory: Path, key: str | None = None, *, full: bool = False) -> str | None:
    """Why ``directory`` is not a complete entry, or ``None`` if it is.

    A file whose size and modification time (ns) equal the manifest's is
    trusted without re-hashing, so a GPU preset's gigabytes are not read at
    every session start; any other file is hashed.

    Args:
        directory: a cache entry.
        key: if given, the manifest must record this cache key.
        full: hash every file, whatever its size and time.

    Returns:
        A short reason ("no manifest.json", "model.safetensors: size 12 != 39305976", ...)
        or ``None``.
    """
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        return f"no {MANIFEST_FILE}"
    try:
        data = json.loads(manifest.read_text(encoding="ascii"))
        files = data["files"]
        if data.get("version") != MANIFEST_VERSION:
            return f"manifest version {data.get('version')!r}"
        if key is not None and data.get("key") != key:
            return "manifest key differs"
        if not files:
            return "manifest lists no files"
        try:
            stamps = {} if full else json.loads((directory / STAMPS_FILE).read_text(encoding="ascii"))
        except (OSError, ValueError):
            stamps = {}
        for name, meta in files.items():
            path = directory / name
            if not path.is_file():
                return f"{name}: missing"
            st = path.stat()
            if st.st_size != meta["size"]:
                return f"{name}: size {st.st_size} != {meta['size']}"
            if stamps.get(name) == st.st_mtime_ns:
                continue
            if _sha256(path) != meta["sha256"]:
                return f"{name}: sha256 mismatch"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest ({exc})"
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


def ensure_checkpoint(spec: TargetSpec, cache_root: Path, *, rebuild: bool = False) -> Path:
    """The directory of ``spec``'s checkpoint in ``cache_root``, building it if needed.

    Args:
        spec: the target spec; its :func:`cache_key` names the entry.
        cache_root: the cache root (e.g. ``~/.cache/pytest-eagle3``); created if missing.
        rebuild: build again even if a valid entry exists. Under pytest-xdist pass
            it from one process only, or every worker rebuilds in turn.

    Returns:
        ``cache_root/checkpoints/<name>-<key[:16]>``, a complete, verified entry.

    Raises:
        Eagle3ConfigError: the cache root cannot be created or written (one-line
            message naming the path; nothing half-written is left behind), or the
            spec's config is not supported by the builder.
    """
    from filelock import FileLock, Timeout

    key = cache_key(spec)
    final = entry_dir(spec, cache_root)
    parent = final.parent
    if not rebuild and check_entry(final, key) is None:
        return final
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"[Errno 13] Permission denied: '{parent}'")
    except OSError as exc:
        raise Eagle3ConfigError(UNWRITABLE_MSG.format(path=parent, error=_one_line(exc))) from None

    tmp = parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    trash = parent / f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with FileLock(str(parent / f"{final.name}.lock"), timeout=LOCK_TIMEOUT_S):
            if not rebuild and check_entry(final, key) is None:
                return final  # another worker built it while we waited
            # We hold the lock: anything temporary for this entry is a crash leftover.
            for leftover in parent.glob(f".{final.name}.*"):
                _remove(leftover)
            try:
                builder.build_checkpoint(spec, tmp)
                for p in tmp.iterdir():
                    os.chmod(p, 0o644)
                write_manifest(tmp, key)
                if final.exists():
                    os.rename(final, trash)
                os.rename(tmp, final)
            finally:
                _remove(tmp)
                _remove(trash)
    except Timeout:
        raise Eagle3ConfigError(
            f"timed out after {LOCK_TIMEOUT_S:.0f} s waiting for another process building "
            f"{final}; remove {final}.lock if no pytest is running"
        ) from None
    except OSError as exc:
        raise Eagle3ConfigError(UNWRITABLE_MSG.format(path=parent, error=_one_line(exc))) from None
    return final
