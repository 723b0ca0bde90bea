"""The engine pool's prefetch: the run's next engine starts in the background
while the current one starts and serves, within the memory guard (stand-in
servers; the real engines prefetch in every e2e run on cpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_eagle3.engine import pool as pool_module
from pytest_eagle3.engine.config import EngineConfig
from pytest_eagle3.errors import Eagle3EngineError
from tests.unit.test_lease import FakeServer


def engine(key: str, tp: int = 1) -> EngineConfig:
    return EngineConfig(model_path="/m", tp=tp, device="cpu", server_args=(("tp_size", tp), ("x", key)), env=())


A, B, C = engine("a"), engine("b"), engine("c", tp=2)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pool_module, "SGLangServer", FakeServer)
    monkeypatch.setattr(pool_module, "enough_memory_for", lambda tp, also=0: True)
    FakeServer.started = []
    return FakeServer


def started(fake) -> list[str]:
    return [s.name for s in fake.started]


def test_the_next_engine_starts_while_the_current_one_starts(tmp_path: Path, fake) -> None:
    messages: list[str] = []
    pool = pool_module.EnginePool(log_dir=tmp_path, upcoming=[A, B, C], progress=messages.append)
    a = pool.get(A)
    assert started(fake) == [A.name, B.name]  # B spawned before A was waited for
    assert any("in the background (the next engine of this run)" in m and B.name in m for m in messages)
    pool.get(A)
    assert started(fake) == [A.name, B.name]  # reuse starts nothing
    b = pool.get(B)
    assert a.stopped and not b.stopped  # one engine serves at a time
    assert started(fake) == [A.name, B.name, C.name]
    pool.get(C)
    assert started(fake) == [A.name, B.name, C.name]
    pool.close()
    assert all(s.stopped for s in fake.started)


def test_no_prefetch_without_an_order_or_without_memory(tmp_path: Path, fake, monkeypatch) -> None:
    pool = pool_module.EnginePool(log_dir=tmp_path)
    pool.get(A)
    assert started(fake) == [A.name]
    monkeypatch.setattr(pool_module, "enough_memory_for", lambda tp, also=0: tp < 2)
    pool = pool_module.EnginePool(log_dir=tmp_path, upcoming=[A, B, C])
    pool.get(B)  # the next one is TP 2: not enough memory for it here
    assert started(fake) == [A.name, B.name]
    pool.close()


def test_no_prefetch_of_an_engine_whose_draft_is_not_built_yet(tmp_path: Path, fake) -> None:
    """A cold cache: the draft-path engine's random draft is built by its test, so
    starting it in the background would make SGLang look for a missing directory."""
    draft = tmp_path / "drafts" / "capture-x"
    D = EngineConfig(model_path="/m", tp=1, device="cpu",
                     server_args=(("speculative_draft_model_path", str(draft)), ("tp_size", 1)), env=())
    pool = pool_module.EnginePool(log_dir=tmp_path, upcoming=[A, D, B])
    pool.get(A)
    assert started(fake) == [A.name]
    draft.mkdir(parents=True)
    (draft / "config.json").write_text("{}")
    pool.get(D)  # built now: the one after it is prefetched as usual
    assert started(fake) == [A.name, D.name, B.name]
    pool.close()


def test_prefetched_engine_left_unused_is_stopped_at_close(tmp_path: Path, fake) -> None:
    pool = pool_module.EnginePool(log_dir=tmp_path, upcoming=[A, B])
    pool.get(A)
    pool.close()
    assert [s.stopped for s in fake.started] == [True, True]


def test_a_prefetched_engine_that_fails_fails_the_test_that_needs_it(tmp_path: Path, fake, monkeypatch) -> None:
    def wait_ready(self, progress=None):
        if self.server_args.get("x") == "b":
            raise Eagle3EngineError("SGLang server b exited with code 1 during startup")
        return self

    monkeypatch.setattr(FakeServer, "wait_ready", wait_ready)
    pool = pool_module.EnginePool(log_dir=tmp_path, upcoming=[A, B])
    pool.get(A)
    with pytest.raises(Eagle3EngineError, match="exited with code 1"):
        pool.get(B)
    with pytest.raises(Eagle3EngineError, match="failed to start \\(see the first test that used it\\)"):
        pool.get(B)


def test_memory_guard_follows_the_measured_engine_sizes(monkeypatch) -> None:
    monkeypatch.setattr(pool_module, "available_bytes", lambda: 8 * 2**30)
    assert pool_module.enough_memory_for(1) and pool_module.enough_memory_for(2)
    assert not pool_module.enough_memory_for(4) and not pool_module.enough_memory_for(8)
    # The engine that was only just spawned counts too: two TP 1 engines need 9.6 GiB.
    assert not pool_module.enough_memory_for(1, also=1)
    monkeypatch.setattr(pool_module, "available_bytes", lambda: 10 * 2**30)
    assert pool_module.enough_memory_for(1, also=1)


def test_an_engine_prefetched_for_a_test_that_did_not_come_is_stopped(tmp_path: Path, fake) -> None:
    pool = pool_module.EnginePool(log_dir=tmp_path, upcoming=[A, B, C])
    pool.get(A)  # B prefetched
    pool.get(C)  # B's tests were deselected or skipped: B must not keep running
    b = next(s for s in fake.started if s.name == B.name)
    assert b.stopped and started(fake) == [A.name, B.name, C.name]


def test_a_prefetched_server_that_is_healthy_is_used_however_long_ago_it_started(tmp_path: Path) -> None:
    """The startup timeout counts from when the run needs the server, not from its
    background spawn (a ready engine is never killed as a timeout)."""
    import http.server
    import subprocess
    import sys
    import threading
    import time

    from pytest_eagle3.engine.server import SGLangServer

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server = SGLangServer("prefetched", {}, log_dir=tmp_path, startup_timeout=5)
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server.port = httpd.server_address[1]
    server._t0 = time.monotonic() - 1000  # spawned long before it was needed
    try:
        assert server.wait_ready() is server and server.startup_seconds >= 1000
    finally:
        server.proc.kill()
        httpd.shutdown()


def test_a_server_whose_port_was_taken_during_startup_starts_again(tmp_path: Path, monkeypatch) -> None:
    """SGLang binds its HTTP port only after seconds of imports; when another
    process took it meanwhile (uvicorn: "[Errno 98] ... address already in use"),
    the server starts again on another port instead of failing the run."""
    from pytest_eagle3.engine import server as server_module

    srv = server_module.SGLangServer("s", {}, log_dir=tmp_path)
    spawns, waits = [], []

    def spawn(self):
        self.port = 40000 + len(spawns)
        self.proc = object()
        self._t0 = 0.0
        spawns.append(self.port)
        return self

    def wait(self, t0, progress):
        waits.append(self.port)
        if len(waits) == 1:
            self.log_path.write_text(f"ERROR: [Errno 98] error while attempting to bind on address "
                                     f"('127.0.0.1', {self.port}): address already in use\n")
            raise server_module.Eagle3EngineError("exited with code 3 during startup")

    monkeypatch.setattr(server_module.SGLangServer, "spawn", spawn)
    monkeypatch.setattr(server_module.SGLangServer, "_wait_ready", wait)
    monkeypatch.setattr(server_module.SGLangServer, "stop", lambda self: None)
    messages: list[str] = []
    srv.spawn()
    assert srv.wait_ready(messages.append) is srv
    assert spawns == [40000, 40001] and waits == [40000, 40001]
    assert messages == ["SGLang server s: port 40000 was taken while it started; starting it again on another port"]


def test_a_taken_port_is_found_behind_the_warmup_traceback(tmp_path: Path) -> None:
    """Seen with two pytest sessions on the 2 cores: the bind error, then SGLang's
    warm-up request failing with ConnectionResetError, a traceback of 100+ lines."""
    from pytest_eagle3.engine import server as server_module

    srv = server_module.SGLangServer("s", {}, log_dir=tmp_path)
    srv.log_path.write_text(
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 46595): address already in use\n"
        + "  File \".../requests/adapters.py\", line 696, in send\n" * 150
        + "requests.exceptions.ConnectionError: ('Connection aborted.', ConnectionResetError(104))\n")
    assert srv.port_taken(46595)


def test_a_server_whose_own_warmup_request_timed_out_starts_again(tmp_path: Path) -> None:
    """Seen in CI with the 2 cores loaded: SGLang's post-warmup /freeze_gc request to
    itself timed out after 10 s and the server exited with code 3."""
    from pytest_eagle3.engine import server as server_module

    srv = server_module.SGLangServer("s", {}, log_dir=tmp_path)
    srv.log_path.write_text(
        '  File ".../http_server.py", line 2561, in _freeze_gc_after_server_warmup\n'
        "requests.exceptions.ReadTimeout: HTTPConnectionPool(host='127.0.0.1', port=38011): "
        "Read timed out. (read timeout=10)\n")
    assert srv.transient_failure(38011) == "its own warm-up request timed out (machine overloaded)"
    srv.log_path.write_text("RuntimeError: something else\n")
    assert srv.transient_failure(38011) is None
    # Seen in CI under attention DP: the DP controller's own socket (the HTTP port + 13) was taken.
    srv.log_path.write_text("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:51986')\n")
    assert srv.transient_failure(51973) == ("an internal port SGLang derives from its HTTP port was taken "
                                            "while it started")


def test_other_startup_failures_are_not_retried(tmp_path: Path, monkeypatch) -> None:
    from pytest_eagle3.engine import server as server_module

    srv = server_module.SGLangServer("s", {}, log_dir=tmp_path)
    srv.port, srv.proc, srv._t0 = 40000, object(), 0.0
    srv.log_path.write_text("RuntimeError: something else\n")

    def wait(self, t0, progress):
        raise server_module.Eagle3EngineError("exited with code 1 during startup")

    monkeypatch.setattr(server_module.SGLangServer, "_wait_ready", wait)
    monkeypatch.setattr(server_module.SGLangServer, "stop", lambda self: None)
    with pytest.raises(server_module.Eagle3EngineError, match="code 1"):
        srv.wait_ready()


def test_startup_failure_names_the_first_error_and_where_in_sglang(tmp_path: Path) -> None:
    from pytest_eagle3.engine.server_log import first_error

    log = ("[2026-12-01] starting\n"
           "Traceback (most recent call last):\n"
           '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
           '  File "/v/lib/site-packages/sglang/srt/layers/quantization/fp8.py", line 100, in <module>\n'
           "    _mxfp8_to_block_fp8_required = mxfp8_block_convert_required()\n"
           '  File "/v/lib/site-packages/sglang/srt/utils/common.py", line 3614, in mxfp8_block_convert_required\n'
           "    cap = torch.cuda.get_device_capability()\n"
           '  File "/v/lib/site-packages/torch/cuda/__init__.py", line 410, in _lazy_init\n'
           "    torch._C._cuda_init()\n"
           "RuntimeError: Found no NVIDIA driver on your system.\n"
           "Traceback (most recent call last):\n"
           '  File "/v/lib/site-packages/sglang/srt/managers/scheduler.py", line 9, in run\n'
           "ValueError: a later error\n")
    assert first_error(log) == ("RuntimeError: Found no NVIDIA driver on your system.",
                                "sglang/srt/utils/common.py:3614")
    assert first_error("Killed\nexit -9\n") is None
    assert first_error("Traceback (most recent call last):\n  File \"/x/y.py\", line 1, in f\nKeyError: 'k'\n") == \
        ("KeyError: 'k'", None)


def test_a_server_s_temporary_folder_is_removed_when_it_stops(tmp_path: Path) -> None:
    import sys

    from pytest_eagle3.engine.server import SGLangServer

    server = SGLangServer("t", {}, log_dir=tmp_path, python=sys.executable)
    server.argv = lambda: [sys.executable, "-c",  # type: ignore[method-assign]
                           "import os, tempfile, time; open(os.path.join(tempfile.gettempdir(), 'left'), 'w');"
                           " print(tempfile.gettempdir(), flush=True); time.sleep(60)"]
    server.spawn()
    import time

    deadline = time.monotonic() + 20
    while not (server.tmp_dir / "left").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (server.tmp_dir / "left").exists()
    server.stop()
    assert not server.tmp_dir.exists()


def test_first_error_reads_sglang_s_own_traceback_lines() -> None:
    from pytest_eagle3.engine.server_log import first_error

    scheduler = ("[2026-12-01 20:51:25 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
                 '  File "/v/site-packages/sglang/srt/managers/scheduler.py", line 3000, in run_scheduler_process\n'
                 "    scheduler = Scheduler(...)\n"
                 '  File "/v/site-packages/sglang/srt/model_executor/model_runner.py", line 42, in __init__\n'
                 "    raise ValueError('bad config')\n"
                 "ValueError: bad config\n\n"
                 "Traceback (most recent call last):\n"
                 '  File "/v/site-packages/sglang/srt/entrypoints/http_server.py", line 99, in launch\n'
                 "RuntimeError: Initialization failed. Please see the error messages above.\n")
    assert first_error(scheduler) == ("ValueError: bad config", "sglang/srt/model_executor/model_runner.py:42")
    odd = ("Traceback (most recent call last):\n"
           '  File "/home/u/sglang/.venv/lib/site-packages/torch/nn/modules/module.py", line 1, in f\n'
           "torch._dynamo.exc.Unsupported: no\n")
    assert first_error(odd) == ("Unsupported: no", None)
    cut = "Traceback (most recent call last):\n  File \"/x.py\", line 1, in f\n[log] something else\n"
    assert first_error(cut) is None


def test_a_server_s_temporary_folder_is_short_enough_for_ipc_sockets(tmp_path: Path) -> None:
    """SGLang's ZMQ IPC sockets live in TMPDIR; a path over 107 characters fails
    (seen with pytester's deep temporary folders)."""
    import sys

    from pytest_eagle3.engine.server import SGLangServer

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    server = SGLangServer("tp1-cpu-479ec8fcfa", {}, log_dir=deep, python=sys.executable)
    server.argv = lambda: [sys.executable, "-c", "import time; time.sleep(60)"]  # type: ignore[method-assign]
    server.spawn()
    try:
        assert len(str(server.tmp_dir / "tmp3phbf9k3")) < 90, server.tmp_dir
    finally:
        server.stop()
    assert not server.tmp_dir.exists()


# --- one failure per root cause of failed starts (engine/start_failures.py) ---

MOE_CAUSE = "TypeError: forward() got an unexpected keyword argument 'x' (sglang/srt/layers/moe/ep_moe/layer.py:42)"


def ids_engine(ids: tuple[int, ...], tp: int = 1, draft: str | None = None) -> EngineConfig:
    args = [("tp_size", tp), ("return_aux_hidden_state_layer_ids", ids)]
    if draft:
        args.append(("speculative_draft_model_path", draft))
    return EngineConfig(model_path="/m", tp=tp, device="cpu", server_args=tuple(sorted(args)), env=())


def test_one_cause_of_failed_starts_is_reported_once(tmp_path: Path, fake, monkeypatch) -> None:
    from pytest_eagle3.errors import Eagle3StartCauseSeen

    def wait_ready(self, progress=None):
        raise Eagle3EngineError(f"SGLang server {self.name} exited with code 1 during startup: {MOE_CAUSE}\n"
                                "--- last 60 lines of the SGLang log ---\n...", cause=MOE_CAUSE)

    monkeypatch.setattr(FakeServer, "wait_ready", wait_ready)
    first, same_path, tp2, other_draft = (ids_engine((0, 3, 5)), ids_engine((1, 3, 4)), ids_engine((0, 3, 5), tp=2),
                                          ids_engine((0, 3, 5), draft="/d"))
    pool = pool_module.EnginePool(log_dir=tmp_path, upcoming=[first, same_path, tp2, other_draft])
    with pytest.raises(Eagle3EngineError) as full:
        pool.get(first, who="test_a")
    assert not isinstance(full.value, Eagle3StartCauseSeen) and "last 60 lines" in str(full.value)
    # Same startup path (only the ids differ): not started again to find out.
    with pytest.raises(Eagle3StartCauseSeen) as skipped:
        pool.get(same_path, who="test_b")
    assert "was not started" in str(skipped.value) and "test_a" in str(skipped.value)
    assert "return_aux_hidden_state_layer_ids" in str(skipped.value) and "\n" not in str(skipped.value)
    # Another startup path: started, and its failure with the same cause is one line.
    for config, who in ((tp2, "test_c"), (other_draft, "test_d")):
        with pytest.raises(Eagle3StartCauseSeen) as same:
            pool.get(config, who=who)
        assert MOE_CAUSE in str(same.value) and "test_a" in str(same.value) and "\n" not in str(same.value)
    # same_path was prefetched while `first` started; stopped once `first` failed.
    assert [s.name for s in fake.started] == [first.name, same_path.name, tp2.name, other_draft.name]
    assert all(s.stopped for s in fake.started if s.name == same_path.name)
    assert pool.start_failures.summary_lines(pool.configurations()) == [
        f"SGLang could not start on this tier: {MOE_CAUSE}, in 4 of 4 engine configurations",
        "  1 of them not started: same startup path as one that failed",
        "  full error and log tail: test_a",
    ]


def test_start_failures_without_a_traceback_are_never_merged(tmp_path: Path, fake, monkeypatch) -> None:
    from pytest_eagle3.errors import Eagle3StartCauseSeen

    def wait_ready(self, progress=None):
        raise Eagle3EngineError(f"SGLang server {self.name} was not ready after 600 s")

    monkeypatch.setattr(FakeServer, "wait_ready", wait_ready)
    a, b = ids_engine((0, 3, 5)), ids_engine((1, 3, 4))
    pool = pool_module.EnginePool(log_dir=tmp_path)
    for config in (a, b):
        with pytest.raises(Eagle3EngineError) as err:
            pool.get(config)
        assert not isinstance(err.value, Eagle3StartCauseSeen)
    assert pool.start_failures.summary_lines(2) == []
