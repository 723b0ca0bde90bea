"""One SGLang HTTP server in a subprocess, with an explicit lifecycle.

SGLang is always hosted in a child process of the test process: a scheduler
exception makes SGLang kill its own process tree with SIGKILL, which must never
take pytest with it (docs/design.md, "SGLang facts").  The server is
``python -m sglang.launch_server`` from the environment's SGLang, so any fork
is tested through the same public entry point its users deploy.

Lifecycle: :meth:`SGLangServer.start` spawns the server in a new session with
its log in a file, then polls ``/health_generate`` while checking on every poll
that the child is still alive; it fails with the exit code and the log tail.
:meth:`SGLangServer.stop` terminates the whole process tree (psutil), waits,
then kills what is left (:mod:`pytest_eagle3.engine.process_tree`).  The class
is a context manager; its errors quote the log (:mod:`pytest_eagle3.engine.server_log`).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping

from pytest_eagle3.engine.inherited_env import engine_environ
from pytest_eagle3.engine.ports import free_port
from pytest_eagle3.engine.process_tree import die_with_parent, kill_group, kill_tree
from pytest_eagle3.engine.server_log import LOG_TAIL_LINES, log_tail, start_log, startup_cause
from pytest_eagle3.errors import Eagle3EngineError
from pytest_eagle3.reaper import spawn

STARTUP_FAILED = (
    "SGLang server {name} exited with code {code} during startup{cause} "
    "(log: {log})\n--- last {n} lines of the SGLang log ---\n{tail}"
)
STARTUP_TIMEOUT = (
    "SGLang server {name} was not ready after {timeout:.0f} s "
    "(raise --eagle3-startup-timeout; log: {log})\n"
    "--- last {n} lines of the SGLang log ---\n{tail}"
)
REQUEST_FAILED = (
    "SGLang request {path} failed: {error} (server {name}, log: {log})\n"
    "--- last {n} lines of the SGLang log ---\n{tail}"
)


#: Seconds a request that lost its connection waits for the server to exit (SGLang
#: kills its process tree after a scheduler exception).
EXIT_WAIT = 10.0


def _connection_lost(exc: BaseException) -> bool:
    """The server closed or refused the connection (a timeout or a bad body is not that)."""
    reason = getattr(exc, "reason", exc) if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, (ConnectionError, http.client.RemoteDisconnected))


#: Restarts on a new port when the chosen one was taken during startup.
PORT_RETRIES = 2


class SGLangServer:
    """An SGLang HTTP server started from ``argv`` with ``env``.

    Args:
        name: short label used in messages and log file names.
        server_args: SGLang server arguments as ``{field: value}``; booleans
            become bare flags, lists become repeated values.
        env: environment overrides for the server process.
        log_dir: where ``<name>.log`` is written.
        startup_timeout: seconds to wait for readiness.
        python: interpreter that runs SGLang (default: this one).

    Raises (from :meth:`start`):
        Eagle3EngineError: the server exited or timed out during startup; the
            message carries the exit code and the log tail.
    """

    def __init__(
        self,
        name: str,
        server_args: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        log_dir: Path,
        startup_timeout: float = 600.0,
        python: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.name = name
        self.server_args = dict(server_args)
        self.env = dict(env or {})
        self.log_path = Path(log_dir) / f"{name}.log"
        self.startup_timeout = startup_timeout
        self.python = python or sys.executable
        self.host = host
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        #: ``TMPDIR`` of the server's processes, made by :meth:`spawn` and removed by
        #: :meth:`stop`.  Short on purpose: SGLang names its ZMQ IPC sockets there, and
        #: a socket path longer than 107 characters fails (``sockaddr_un``).
        self.tmp_dir = Path(tempfile.gettempdir()) / f"eagle3-{name}"
        self.startup_seconds: float | None = None
        #: ``explain_exit(cause, start_log) -> (cause key, line) | None``: what a server that died
        #: under a request died of, set by the pool (:mod:`pytest_eagle3.engine.tbo_start`).
        self.explain_exit: Callable[[str, str], tuple[str, str] | None] | None = None
        #: ``(cause key, line)`` of this server's death under a request, once it died so.
        self.exit_explanation: tuple[str, str] | None = None

    # -- lifecycle ---------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self!r} is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def argv(self) -> list[str]:
        """The command line that starts the server (with the port once started)."""
        argv = [self.python, "-m", "sglang.launch_server"]
        args = dict(self.server_args)
        args.setdefault("host", self.host)
        if self.port is not None:
            args["port"] = self.port
        for key, value in args.items():
            flag = "--" + key.replace("_", "-")
            if value is None or value is False:
                continue
            if value is True:
                argv.append(flag)
            elif isinstance(value, (list, tuple)):
                argv.append(flag)
                argv.extend(str(v) for v in value)
            elif isinstance(value, dict):
                argv.extend([flag, json.dumps(value)])
            else:
                argv.extend([flag, str(value)])
        return argv

    def start(self, progress: Callable[[str], None] | None = None) -> "SGLangServer":
        """Spawn the server and wait until ``/health`` answers (see :meth:`spawn`,
        :meth:`wait_ready`)."""
        if self.alive:
            return self
        self.spawn()
        return self.wait_ready(progress)

    def spawn(self) -> "SGLangServer":
        """Start the server process without waiting for it (a no-op when it runs)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.startup_seconds = None
        self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # SGLang's temporary files (IPC socket names, configs a fork writes to
        # tempfile.gettempdir()) go to a folder of this server's, removed by stop().
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"eagle3-{self.name}-"))
        # A TMPDIR the config sets wins; no simulated acceptance (engine/inherited_env.py).
        env = engine_environ(os.environ, {"TMPDIR": str(self.tmp_dir), **self.env})
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()  # this start's output begins here (a retry appends)
            log.write(f"$ {' '.join(self.argv())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

        self._reaper = spawn(self.proc.pid)
        self._t0 = t0
        return self

    def wait_ready(self, progress: Callable[[str], None] | None = None) -> "SGLangServer":
        """Wait for a spawned server's ``/health``; ``startup_seconds`` counts from the spawn.

        Raises:
            Eagle3EngineError: the server exited or timed out (it is stopped).
        """
        if self.startup_seconds is not None and self.alive:
            return self
        if self.proc is None:
            raise RuntimeError(f"{self!r} was never spawned")
        first_t0 = self._t0
        for attempt in range(PORT_RETRIES + 1):
            try:
                # The startup timeout counts from the spawn, or from now for a server
                # spawned in the background long before anyone needed it (prefetch).
                self._wait_ready(max(self._t0, time.monotonic() - 1.0), progress)
                break
            except Eagle3EngineError:
                port = self.port
                self.stop()
                why = self.transient_failure(port)
                if attempt == PORT_RETRIES or why is None:
                    raise
                if progress is not None:
                    progress(f"SGLang server {self.name}: {why}; starting it again on another port")
                self.spawn()
            except BaseException:
                self.stop()
                raise
        self.startup_seconds = time.monotonic() - first_t0
        return self

    def start_log(self) -> str:
        """This start's part of the log (a retry appends to the same file)."""
        return start_log(self.log_path, getattr(self, "_log_offset", 0))

    def port_taken(self, port: int | None) -> bool:
        """Whether the log says the server could not bind its HTTP ``port``.

        Reads the last 1000 lines: after the bind error SGLang 0.5.23 still
        logs its warm-up request's failure, a traceback of 100+ lines."""
        return port is not None and f"('{self.host}', {port}): address already in use" in log_tail(
            self.log_path, lines=1000)

    def transient_failure(self, port: int | None) -> str | None:
        """Why a failed start is worth one more try (``None``: it is not).

        * the port was free when chosen, but SGLang binds it only after seconds
          of imports; another process (or another engine's internal port) took
          it meanwhile;
        * SGLang's own post-warmup ``/freeze_gc`` request to itself timed out
          after 10 s (``http_server.py`` ``_freeze_gc_after_server_warmup``) and
          the server exited: seen on 2 cores loaded by other work;
        * a port SGLang derives from its HTTP port for its own sockets was taken
          when it bound it (``zmq.error.ZMQError: Address already in use``; seen in
          CI: 0.5.23's ``DataParallelController._broadcast_ports_as_server`` under
          attention DP).
        """
        if self.port_taken(port):
            return f"port {port} was taken while it started"
        tail = log_tail(self.log_path)
        if "ZMQError: Address already in use" in log_tail(self.log_path, lines=1000):
            return "an internal port SGLang derives from its HTTP port was taken while it started"
        if "_freeze_gc_after_server_warmup" in tail and "Read timed out" in tail:
            return "its own warm-up request timed out (machine overloaded)"
        return None

    def _wait_ready(self, t0: float, progress: Callable[[str], None] | None) -> None:
        last_note = t0
        while True:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                cause = startup_cause(self.log_path, getattr(self, "_log_offset", 0))
                raise Eagle3EngineError(
                    STARTUP_FAILED.format(
                        name=self.name, code=code, log=self.log_path, cause=cause,
                        n=LOG_TAIL_LINES, tail=log_tail(self.log_path),
                    ),
                    cause=cause.removeprefix(": ") or None,
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            elapsed = time.monotonic() - t0
            if elapsed > self.startup_timeout:
                raise Eagle3EngineError(
                    STARTUP_TIMEOUT.format(
                        name=self.name, timeout=self.startup_timeout,
                        log=self.log_path, n=LOG_TAIL_LINES,
                        tail=log_tail(self.log_path),
                    )
                )
            if progress is not None and time.monotonic() - last_note >= 15:
                last_note = time.monotonic()
                progress(f"waiting for SGLang server {self.name}: {elapsed:.0f} s")
            time.sleep(0.5)

    def stop(self) -> int | None:
        """Stop the process tree; returns the server's exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            # No graceful shutdown: the server holds nothing worth saving, and a
            # SIGTERM makes SGLang drain, then wait 5 s on the "crashed" workers.
            kill_tree(self.proc.pid, graceful=False)
        # Workers re-parented after a crash of the server are still in its
        # session (start_new_session=True makes the server the group leader).
        kill_group(self.proc.pid)
        code = self.proc.wait()
        reaper = getattr(self, "_reaper", None)
        if reaper is not None:
            try:
                reaper.wait(timeout=5)  # it exits once the group is empty
            except subprocess.TimeoutExpired:
                reaper.kill()
                reaper.wait()
            self._reaper = None
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        return code

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        where = f" at {self.url}" if self.port is not None else ""
        return f"<SGLangServer {self.name} {state}{where}>"

    # -- requests ----------------------------------------------------------
    def request(
        self, path: str, payload: Mapping[str, Any] | None = None, *, timeout: float = 600.0
    ) -> Any:
        """POST ``payload`` (or GET when None) to ``path``; returns decoded JSON.

        Raises:
            Eagle3EngineError: HTTP error, dead server or timeout, with the log tail.
        """
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            self.url + path, data=data,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:2000]
            error = f"HTTP {exc.code}: {body}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if self._exited(wait=EXIT_WAIT if _connection_lost(exc) else 0.0):
                error += f" (server exited with code {self.proc.poll() if self.proc else None})"
                cause = startup_cause(self.log_path, getattr(self, "_log_offset", 0)).removeprefix(": ")
                if cause:
                    error += f"; it died of {cause}"
                    if self.explain_exit is not None:
                        self.exit_explanation = self.explain_exit(cause, self.start_log())
        message = REQUEST_FAILED.format(path=path, error=error, name=self.name, log=self.log_path,
                                        n=LOG_TAIL_LINES, tail=log_tail(self.log_path))
        explained = self.exit_explanation
        raise Eagle3EngineError(f"{explained[1]}\n{message}" if explained else message)

    def _exited(self, wait: float) -> bool:
        """Whether the server process has exited, waiting up to ``wait`` seconds for it
        (a server whose scheduler died closes the connection, then exits)."""
        if self.proc is None:
            return True
        if wait > 0:
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                return False
        return self.proc.poll() is not None

    def generate(self, payload: Mapping[str, Any], *, timeout: float = 600.0) -> Any:
        """POST ``/generate``; returns the response JSON (a list for batched input)."""
        return self.request("/generate", payload, timeout=timeout)

    def flush_cache(self, *, timeout: float = 30.0) -> None:
        """Empty SGLang's radix cache (``POST /flush_cache``), so the next send of a
        prompt is computed in full.  SGLang flushes only while no request is
        pending (``Scheduler.flush_cache`` in ``srt/managers/scheduler.py``); a
        refusal is retried until ``timeout`` seconds.

        Raises:
            Eagle3EngineError: the server kept refusing, or the request failed.
        """
        deadline = time.monotonic() + timeout
        while True:
            req = urllib.request.Request(self.url + "/flush_cache", data=b"", method="POST")
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    if resp.status == 200:
                        return
                    error = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                error = f"HTTP {exc.code}: {exc.read().decode('utf-8', 'replace')[:200]}"
            except (urllib.error.URLError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline or not self.alive:
                raise Eagle3EngineError(REQUEST_FAILED.format(
                    path="/flush_cache", error=error, name=self.name, log=self.log_path,
                    n=LOG_TAIL_LINES, tail=log_tail(self.log_path)))
            time.sleep(0.2)

    def server_info(self) -> dict[str, Any]:
        """GET ``/server_info`` (``/get_server_info`` on older versions)."""
        try:
            return self.request("/server_info", timeout=30)
        except Eagle3EngineError:
            return self.request("/get_server_info", timeout=30)
