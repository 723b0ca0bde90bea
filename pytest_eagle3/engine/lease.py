"""GPU leases: each pytest process (an xdist worker, or the one process without
xdist) runs its engines on a block of ``--tp`` GPUs no other process uses (the
blocks and their NCCL port windows: :mod:`pytest_eagle3.engine.gpu_blocks`; which
block a pytest process tries first and who it says it is:
:mod:`pytest_eagle3.plugin.gpu_workers`).

Locks.  One exclusive :class:`filelock.FileLock` per GPU, ``gpu-<id>.lock`` in
:func:`default_lock_dir`; a lease holds the locks of every GPU of its block.
Locking GPUs rather than blocks keeps two runs disjoint even when they cut the
GPUs differently (one at ``--tp 2``, another at ``--tp 4``, or with different
``CUDA_VISIBLE_DEVICES`` lists of physical ids).  A lease is taken without
blocking (all locks of a block or none, so two processes never deadlock on
each other's halves), trying the block of this worker's index first, then the
others; when none is free it polls until ``timeout``, reporting who holds what
every :data:`NOTE_INTERVAL_S`.  Next to each lock, ``gpu-<id>.owner`` records the
holder (pid, host, xdist worker, run, since when) for those messages.

Crashes.  The locks are ``flock`` locks: the kernel drops them when the holding
process dies, however it dies (SIGKILL included), so a crashed worker's GPUs are
free for the next lease at once; its stale owner file is overwritten by the next
holder.  The lock file descriptors are not inherited by the SGLang server (Python
opens them close-on-exec), so a server outliving a killed worker (it gets SIGTERM
through ``PR_SET_PDEATHSIG``, see :mod:`pytest_eagle3.engine.server`) may still
free its GPU memory while the next lease starts; a start that fails for memory
then names the engine in its log.

Lock directory.  ``$PYTEST_EAGLE3_GPU_LOCKS`` when set, else
``<tmpdir>/pytest-eagle3-<uid>/gpu-leases``: local to the machine (the GPUs are)
and shared by every pytest run of the user on it, not only the workers of one
run, so two concurrent runs do not share GPUs either.  Not under the eagle3
cache: that is often a home directory on NFS, shared by several machines whose
``GPU 0`` are different devices.  Runs of other users are not seen (separate
them with ``CUDA_VISIBLE_DEVICES``, or point ``$PYTEST_EAGLE3_GPU_LOCKS`` of
everyone at one directory they can all write).

CPU.  No lease: ``--device cpu`` engines use no GPU, and one worker runs at most
one engine at a time (:class:`~pytest_eagle3.engine.pool.EnginePool`);
``pytest -n auto`` runs one worker on CPU
(:func:`pytest_eagle3.plugin.gpu_workers.auto_num_workers`).

Nothing here imports torch or sglang.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pytest_eagle3.engine.gpu_blocks import MSG_TOO_FEW, GpuBlock, describe_blocks
from pytest_eagle3.errors import Eagle3ConfigError, Eagle3EngineError

ENV_LOCK_DIR = "PYTEST_EAGLE3_GPU_LOCKS"

#: How long a worker waits for a free block before its engine start fails.
WAIT_TIMEOUT_S = 7200.0
POLL_INTERVAL_S = 0.5
#: Seconds between "waiting for a block" progress lines.
NOTE_INTERVAL_S = 30.0

# Messages (tests import these).
MSG_WAITING = "waiting {waited:.0f} s for a free block of {tp} GPU(s) (blocks {blocks}): {holders}"
MSG_TIMEOUT = (
    "no block of {tp} GPU(s) became free in {timeout:.0f} s (blocks {blocks}; locks in {lock_dir}): "
    "{holders}. Another pytest run holds them, or -n exceeds the {n} block(s) of this run "
    "(use -n auto)"
)
MSG_HOLDER = "GPU {gpu} held by {owner}"
MSG_HOLDER_UNKNOWN = "GPU {gpu} held (no owner record)"
MSG_LEASED = "leased GPUs {gpus} (block {index}) for {owner}"


class Eagle3LeaseTimeout(Eagle3EngineError):
    """No GPU block became free in time (the message names the holders)."""


# --- lock directory, owners ---


def default_lock_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$PYTEST_EAGLE3_GPU_LOCKS``, else ``<tmpdir>/pytest-eagle3-<uid>/gpu-leases``."""
    env = os.environ if env is None else env
    if env.get(ENV_LOCK_DIR):
        return Path(env[ENV_LOCK_DIR]).expanduser()
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"pytest-eagle3-{uid}" / "gpu-leases"


def holder_label(who: str = "pytest", run: str | None = None) -> str:
    """Who holds a lease, for messages: ``"pytest (pid 123 on host)"``, or
    ``"<who> (pid 123 on host, run <run>)"`` (the names of a pytest process:
    :func:`pytest_eagle3.plugin.gpu_workers.owner_label`)."""
    suffix = f", run {run}" if run is not None else ""
    return f"{who} (pid {os.getpid()} on {socket.gethostname()}{suffix})"


# --- leases ---


@dataclass
class Lease:
    """A held block: exclusive until :meth:`release` (or the process dies).

    A context manager; :meth:`release` is idempotent.
    """

    block: GpuBlock
    lock_dir: Path
    owner: str
    _locks: list[Any] = field(default_factory=list, repr=False)
    _owner_files: list[Path] = field(default_factory=list, repr=False)
    _next_port: int = field(default=0, repr=False)

    @property
    def held(self) -> bool:
        return bool(self._locks)

    def env(self) -> dict[str, str]:
        """Environment for an engine on this block (``CUDA_VISIBLE_DEVICES``)."""
        return self.block.env()

    def nccl_port(self, host: str = "") -> int | None:
        """A free port from the block's window, a different one each call while
        others are free (a port just released may linger); ``None`` if all are taken."""
        window = self.block.ports
        for step in range(len(window)):
            port = window[(self._next_port + step) % len(window)]
            if _port_free(port, host):
                self._next_port = (self._next_port + step + 1) % len(window)
                return port
        return None

    def release(self) -> None:
        """Drop the owner records, then the locks."""
        for path in self._owner_files:
            try:
                path.unlink()
            except OSError:
                pass
        self._owner_files.clear()
        while self._locks:
            lock = self._locks.pop()
            try:
                lock.release(force=True)
            except Exception:  # noqa: BLE001 - releasing must not mask the test's outcome
                pass

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"<Lease GPUs {self.block.label} (block {self.block.index}) {state} by {self.owner}>"


def _port_free(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _lock_path(lock_dir: Path, gpu: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in gpu)
    return lock_dir / f"gpu-{safe}.lock"


def _owner_path(lock_dir: Path, gpu: str) -> Path:
    return _lock_path(lock_dir, gpu).with_suffix(".owner")


def _file_lock(path: Path) -> Any:
    """A non-blocking :class:`filelock.FileLock` that is always an ``flock`` lock.

    filelock 4 falls back to a marker-file ("soft") lock where ``flock`` is not
    supported; a soft lock outlives a crashed holder, which would defeat the
    reclaiming of a crashed worker's lease, so the fallback is refused (an
    ``OSError`` names the file system instead).
    """
    import inspect

    from filelock import FileLock

    kwargs: dict[str, Any] = {"timeout": 0, "thread_local": False}
    if "fallback_to_soft" in inspect.signature(FileLock.__init__).parameters:
        kwargs["fallback_to_soft"] = False
    return FileLock(str(path), **kwargs)


def _try_block(block: GpuBlock, lock_dir: Path, owner: str) -> Lease | None:
    """Take every lock of ``block`` without waiting, or none of them."""
    from filelock import Timeout

    taken = []
    for gpu in block.gpus:
        lock = _file_lock(_lock_path(lock_dir, gpu))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            for held in reversed(taken):
                held.release(force=True)
            return None
        taken.append(lock)
    lease = Lease(block, lock_dir, owner, _locks=taken)
    record = {"owner": owner, "pid": os.getpid(), "host": socket.gethostname(),
              "gpus": list(block.gpus), "since": time.strftime("%H:%M:%S")}
    for gpu in block.gpus:
        path = _owner_path(lock_dir, gpu)
        try:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
            lease._owner_files.append(path)
        except OSError:
            pass
    return lease


def holders(lock_dir: Path, blocks: Sequence[GpuBlock]) -> str:
    """Who holds the GPUs of ``blocks``, one clause per held GPU (read from the owner
    records; a GPU whose lock is free right now is left out)."""
    from filelock import Timeout

    clauses = []
    for block in blocks:
        for gpu in block.gpus:
            lock = _file_lock(_lock_path(lock_dir, gpu))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                clauses.append(_holder_clause(lock_dir, gpu))
            else:
                lock.release(force=True)
    return "; ".join(clauses) or "no GPU is held right now"


def _holder_clause(lock_dir: Path, gpu: str) -> str:
    try:
        record = json.loads(_owner_path(lock_dir, gpu).read_text())
        owner = f"{record['owner']} since {record.get('since', '?')}"
    except (OSError, ValueError, KeyError, TypeError):
        return MSG_HOLDER_UNKNOWN.format(gpu=gpu)
    return MSG_HOLDER.format(gpu=gpu, owner=owner)


def acquire(
    blocks: Sequence[GpuBlock],
    *,
    lock_dir: Path | None = None,
    owner: str | None = None,
    prefer: int = 0,
    timeout: float = WAIT_TIMEOUT_S,
    poll: float = POLL_INTERVAL_S,
    note_every: float = NOTE_INTERVAL_S,
    progress: Callable[[str], None] | None = None,
) -> Lease:
    """Lease one of ``blocks``, trying ``blocks[prefer % len(blocks)]`` first.

    Args:
        lock_dir: where the locks live (default :func:`default_lock_dir`; created).
        owner: who asks, for other processes' messages (default :func:`holder_label`).
        prefer: index of the block to try first (the xdist worker index), so workers
            of one run usually get distinct blocks without contention.
        timeout: seconds to wait for a free block.
        poll: seconds between attempts while waiting.
        note_every: seconds between ``progress`` lines while waiting.
        progress: called with :data:`MSG_WAITING` lines while waiting.

    Raises:
        Eagle3LeaseTimeout: nothing became free within ``timeout`` (names the holders).
    """
    if not blocks:
        raise Eagle3ConfigError(MSG_TOO_FEW.format(tp="?", count=0, gpus="none"))
    lock_dir = Path(lock_dir) if lock_dir is not None else default_lock_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    owner = owner or holder_label()
    start = prefer % len(blocks)
    order = list(blocks[start:]) + list(blocks[:start])
    t0 = last_note = time.monotonic()
    while True:
        for block in order:
            lease = _try_block(block, lock_dir, owner)
            if lease is not None:
                return lease
        waited = time.monotonic() - t0
        if waited >= timeout:
            raise Eagle3LeaseTimeout(
                MSG_TIMEOUT.format(tp=len(blocks[0].gpus), timeout=timeout, blocks=describe_blocks(blocks),
                                   lock_dir=lock_dir, holders=holders(lock_dir, blocks), n=len(blocks))
            )
        if progress is not None and time.monotonic() - last_note >= note_every:
            last_note = time.monotonic()
            progress(MSG_WAITING.format(waited=waited, tp=len(blocks[0].gpus), blocks=describe_blocks(blocks),
                                        holders=holders(lock_dir, blocks)))
        time.sleep(min(poll, timeout - waited))


class GpuLeaser:
    """One process's lease, taken on first use and held until :meth:`release`.

    The engine pool asks it for :meth:`engine_overrides` before each engine start;
    the first call leases a block (waiting if none is free), later calls reuse it.

    Args:
        blocks: the blocks of this run (:func:`pytest_eagle3.engine.gpu_blocks.settings_blocks`;
            :func:`pytest_eagle3.plugin.gpu_workers.leaser_for_run` makes the leaser of a pytest process).
        lock_dir, owner, prefer, timeout, progress: as in :func:`acquire`.
        nccl_port: pass ``--nccl-port`` from the block's window (when the installed
            SGLang has the flag).
    """

    def __init__(
        self,
        blocks: Sequence[GpuBlock],
        *,
        lock_dir: Path | None = None,
        owner: str | None = None,
        prefer: int = 0,
        timeout: float = WAIT_TIMEOUT_S,
        progress: Callable[[str], None] | None = None,
        nccl_port: bool = True,
    ) -> None:
        self.blocks = list(blocks)
        self.lock_dir = Path(lock_dir) if lock_dir is not None else default_lock_dir()
        self.owner = owner or holder_label()
        self.prefer = prefer
        self.timeout = timeout
        self.progress = progress
        self.use_nccl_port = nccl_port
        self.lease: Lease | None = None

    def acquire(self) -> Lease:
        """The held lease (leased now if not yet)."""
        if self.lease is None or not self.lease.held:
            self.lease = acquire(self.blocks, lock_dir=self.lock_dir, owner=self.owner, prefer=self.prefer,
                                 timeout=self.timeout, progress=self.progress)
            if self.progress is not None:
                self.progress(MSG_LEASED.format(gpus=self.lease.block.label, index=self.lease.block.index,
                                                owner=self.owner))
        return self.lease

    def engine_overrides(self) -> tuple[dict[str, Any], dict[str, str]]:
        """``(server args, env)`` an engine on this process's block gets:
        ``CUDA_VISIBLE_DEVICES`` and, when enabled, ``nccl_port``."""
        lease = self.acquire()
        args: dict[str, Any] = {}
        if self.use_nccl_port:
            port = lease.nccl_port()
            if port is not None:
                args["nccl_port"] = port
        return args, lease.env()

    def describe(self) -> str:
        """``"GPUs 2,3"`` once leased, else ``"no GPUs leased yet"``."""
        if self.lease is None or not self.lease.held:
            return "no GPUs leased yet"
        return f"GPUs {self.lease.block.label}"

    def release(self) -> None:
        """Release the lease (idempotent)."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None
