"""GPU leases (engine/gpu_blocks.py, engine/lease.py, plugin/gpu_workers.py):
blocks of simulated GPUs, concurrent xdist workers that never share a GPU, a
crashed worker's lease reclaimed, waiting with a message naming the holders, the
pool's lease at the first start, ``-n auto``.

No GPU is needed: the blocks are cut from simulated ids and the locks are plain
files in a temporary directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_eagle3.plugin import hooks as plugin
from pytest_eagle3.plugin import resolve
from pytest_eagle3.settings import GpuProbe, Settings, default_cache_dir
from pytest_eagle3.plugin import gpu_workers, workers
from pytest_eagle3.engine import lease
from pytest_eagle3.engine.gpu_blocks import PORT_BASE, PORT_STRIDE, gpu_blocks, visible_gpu_ids
from pytest_eagle3.engine.config import EngineConfig
from pytest_eagle3.errors import Eagle3ConfigError

pytestmark = pytest.mark.usefixtures("clean_eagle3_env")

#: The user's cache (read before clean_eagle3_env hides it), for the SGLang flag list.
USER_CACHE = str(default_cache_dir()[0])


def ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def cuda_settings(gpus: int, tp: int) -> Settings:
    return Settings(tp=tp, device="cuda", gpu=GpuProbe(gpus, f"simulated {gpus} GPUs"))


# --- blocks ---


@pytest.mark.parametrize(
    ("gpus", "tp", "expected"),
    [
        (8, 2, [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]),
        (8, 8, [tuple(ids(8))]),
        (8, 4, [("0", "1", "2", "3"), ("4", "5", "6", "7")]),
        (8, 1, [(str(i),) for i in range(8)]),
        (6, 4, [("0", "1", "2", "3")]),  # GPUs 4 and 5 left over, unused
        (1, 1, [("0",)]),
    ],
)
def test_blocks_of_simulated_gpus(gpus: int, tp: int, expected: list[tuple[str, ...]]) -> None:
    blocks = gpu_blocks(visible_gpu_ids(gpus, env={}), tp)
    assert [b.gpus for b in blocks] == expected
    assert [b.index for b in blocks] == list(range(len(expected)))
    # Port windows of distinct blocks never overlap.
    windows = [set(b.ports) for b in blocks]
    assert all(not (a & b) for i, a in enumerate(windows) for b in windows[i + 1:])


def test_blocks_are_of_the_cuda_visible_devices_list() -> None:
    visible = visible_gpu_ids(4, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    blocks = gpu_blocks(visible, 2)
    assert [b.gpus for b in blocks] == [("4", "5"), ("6", "7")]
    assert blocks[1].env() == {"CUDA_VISIBLE_DEVICES": "6,7"}
    # The port window follows the physical id, so another run seeing GPUs 0-3 gets other ports.
    assert blocks[0].ports.start == PORT_BASE + 4 * PORT_STRIDE


def test_uuid_ids_are_kept_and_lock_names_are_safe(tmp_path: Path) -> None:
    visible = visible_gpu_ids(2, env={"CUDA_VISIBLE_DEVICES": "GPU-aa/1,MIG-bb:2"})
    blocks = gpu_blocks(visible, 1)
    assert blocks[0].env() == {"CUDA_VISIBLE_DEVICES": "GPU-aa/1"}
    with lease.acquire(blocks, lock_dir=tmp_path, owner="me") as held:
        assert held.block.gpus == ("GPU-aa/1",)
    assert {p.name for p in tmp_path.iterdir()} <= {"gpu-GPU-aa_1.lock", "gpu-MIG-bb_2.lock"}


def test_tp_above_visible_gpus_is_refused() -> None:
    with pytest.raises(Eagle3ConfigError, match=r"--tp 8 needs 8 GPUs on --device cuda but 4 are visible"):
        gpu_blocks(ids(4), 8)


def test_tp_above_visible_gpus_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve, "detect_gpus", lambda env=None: GpuProbe(4, "simulated 4 GPUs"))
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--device", "cuda", "--tp", "8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tp 8 needs 8 GPUs on --device cuda but 4 are visible (simulated 4 GPUs)*"])


def test_cpu_has_no_lease() -> None:
    assert gpu_workers.leaser_for_run(Settings(device="cpu", tp=4)) is None


def test_header_names_the_blocks(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve, "detect_gpus", lambda env=None: GpuProbe(8, "simulated 8 GPUs"))
    monkeypatch.setenv(lease.ENV_LOCK_DIR, str(pytester.path / "locks"))
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--device", "cuda", "--tp", "2")
    result.stdout.fnmatch_lines([f"eagle3: gpu blocks of 2: 0,1 | 2,3 | 4,5 | 6,7 (*locks in {pytester.path / 'locks'})"])


# --- -n auto ---


@pytest.mark.parametrize(
    ("gpus", "args", "expected"),
    [
        (8, ["--device", "cuda", "--tp", "2"], 4),
        (8, ["--device", "cuda", "--tp", "8"], 1),
        (8, ["--device", "cuda", "--tp", "1"], 8),
        (2, ["--device", "cuda", "--tp", "4"], 1),  # refused later by validation; never 0 workers
        (8, ["--device", "cpu", "--tp", "2"], 1),
        (0, ["--tp", "4"], 1),  # device auto -> cpu
        (8, ["--eagle3-target", "tiny-dsv3", "--tp", "2"], 4),  # device auto -> cuda
        (8, [], None),  # not an eagle3 run: xdist's own default
    ],
)
def test_auto_num_workers(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                          gpus: int, args: list[str], expected: int | None) -> None:
    monkeypatch.setattr(resolve, "detect_gpus", lambda env=None: GpuProbe(gpus, f"simulated {gpus} GPUs"))
    config = pytester.parseconfig(*args)
    assert plugin.pytest_xdist_auto_num_workers(config) == expected


def test_auto_num_workers_for_the_packaged_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve, "detect_gpus", lambda env=None: GpuProbe(8, "simulated"))
    config = pytester.parseconfig("--pyargs", "pytest_eagle3.suite", "--tp", "4")
    assert plugin.pytest_xdist_auto_num_workers(config) == 2


def test_xdist_env_override_wins(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve, "detect_gpus", lambda env=None: GpuProbe(8, "simulated"))
    monkeypatch.setenv(workers.ENV_XDIST_AUTO, "3")
    assert plugin.pytest_xdist_auto_num_workers(pytester.parseconfig("--device", "cuda", "--tp", "2")) is None


def test_n_auto_runs_one_worker_on_cpu(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-n", "auto", "--device", "cpu", "--tp", "2")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*1 worker [[]1 item[]]*"])


def test_more_workers_than_blocks_warns() -> None:
    settings = cuda_settings(8, 2)
    assert gpu_workers.oversubscription(settings, 4) is None
    message = gpu_workers.oversubscription(settings, 6)
    assert message == gpu_workers.MSG_OVERSUBSCRIBED.format(n=6, blocks=4, tp=2, gpus="0,1 | 2,3 | 4,5 | 6,7", waiting=2)
    assert gpu_workers.oversubscription(Settings(device="cpu"), 6) is None


# --- exclusive, waiting, crash ---


def test_lease_is_exclusive_and_released(tmp_path: Path) -> None:
    blocks = gpu_blocks(ids(4), 2)
    first = lease.acquire(blocks, lock_dir=tmp_path, owner="A")
    second = lease.acquire(blocks, lock_dir=tmp_path, owner="B")
    assert {first.block.gpus, second.block.gpus} == {("0", "1"), ("2", "3")}
    record = json.loads((tmp_path / "gpu-0.owner").read_text())
    assert record["owner"] == "A" and record["pid"] == os.getpid() and record["gpus"] == ["0", "1"]
    with pytest.raises(lease.Eagle3LeaseTimeout):
        lease.acquire(blocks, lock_dir=tmp_path, owner="C", timeout=0.2, poll=0.05)
    first.release()
    first.release()  # idempotent
    assert not (tmp_path / "gpu-0.owner").exists()
    third = lease.acquire(blocks, lock_dir=tmp_path, owner="C", timeout=1)
    assert third.block.gpus == ("0", "1")
    for held in (second, third):
        held.release()


def test_prefer_spreads_workers_over_blocks(tmp_path: Path) -> None:
    blocks = gpu_blocks(ids(8), 2)
    with lease.acquire(blocks, lock_dir=tmp_path, prefer=3) as held:
        assert held.block.gpus == ("6", "7")
    with lease.acquire(blocks, lock_dir=tmp_path, prefer=5) as held:  # 5 % 4 blocks -> block 1
        assert held.block.gpus == ("2", "3")


def test_blocks_cut_differently_never_share_a_gpu(tmp_path: Path) -> None:
    # One run at --tp 2 holds GPUs 2,3; another at --tp 4 must not take 0-3.
    with lease.acquire(gpu_blocks(ids(8), 2), lock_dir=tmp_path, prefer=1, owner="tp2 run"):
        with lease.acquire(gpu_blocks(ids(8), 4), lock_dir=tmp_path, owner="tp4 run", timeout=1) as held:
            assert held.block.gpus == ("4", "5", "6", "7")
        with pytest.raises(lease.Eagle3LeaseTimeout, match="GPU 2 held by tp2 run"):
            lease.acquire(gpu_blocks(ids(4), 4), lock_dir=tmp_path, owner="x", timeout=0.2, poll=0.05)


def test_waiting_times_out_with_a_clear_message(tmp_path: Path) -> None:
    blocks = gpu_blocks(ids(4), 2)
    holders = [lease.acquire(blocks, lock_dir=tmp_path, owner=f"xdist worker gw{i}") for i in range(2)]
    notes: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(lease.Eagle3LeaseTimeout) as excinfo:
        lease.acquire(blocks, lock_dir=tmp_path, owner="gw2", timeout=1.0, poll=0.1, note_every=0.3,
                      progress=notes.append)
    assert 1.0 <= time.monotonic() - t0 < 3.0
    message = str(excinfo.value)
    assert message.startswith("no block of 2 GPU(s) became free in 1 s (blocks 0,1 | 2,3; locks in ")
    for gpu, worker in (("0", "gw0"), ("1", "gw0"), ("2", "gw1"), ("3", "gw1")):
        assert f"GPU {gpu} held by xdist worker {worker} since " in message
    assert "use -n auto" in message
    assert notes and all(n.startswith("waiting ") and "GPU 0 held by xdist worker gw0" in n for n in notes)
    for held in holders:
        held.release()


def test_waiting_ends_when_a_block_is_released(tmp_path: Path) -> None:
    blocks = gpu_blocks(ids(2), 2)
    holder = lease.acquire(blocks, lock_dir=tmp_path, owner="first")
    timer = threading.Timer(0.5, holder.release)
    timer.start()
    t0 = time.monotonic()
    with lease.acquire(blocks, lock_dir=tmp_path, owner="second", timeout=10, poll=0.05) as held:
        waited = time.monotonic() - t0
        assert held.block.gpus == ("0", "1")
    timer.join()
    assert 0.4 <= waited < 5


HOLD_AND_SLEEP = """
import sys, time
from pathlib import Path
from pytest_eagle3.engine import lease
from pytest_eagle3.engine.gpu_blocks import gpu_blocks
held = lease.acquire(gpu_blocks(["0", "1"], 2), lock_dir=Path(sys.argv[1]), owner="doomed worker")
print("held", flush=True)
time.sleep(120)
"""


def test_a_crashed_workers_lease_is_reclaimed(tmp_path: Path) -> None:
    blocks = gpu_blocks(ids(2), 2)
    proc = subprocess.Popen([sys.executable, "-c", HOLD_AND_SLEEP, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(lease.Eagle3LeaseTimeout, match="GPU 0 held by doomed worker"):
            lease.acquire(blocks, lock_dir=tmp_path, owner="next", timeout=0.3, poll=0.05)
        proc.send_signal(signal.SIGKILL)  # no cleanup runs; the kernel drops the flock
        proc.wait(timeout=10)
        t0 = time.monotonic()
        with lease.acquire(blocks, lock_dir=tmp_path, owner="next", timeout=10, poll=0.05) as held:
            assert time.monotonic() - t0 < 1.0
            # The stale owner record was replaced by the new holder's.
            assert json.loads((tmp_path / "gpu-0.owner").read_text())["owner"] == "next"
            assert held.block.gpus == ("0", "1")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- concurrent xdist workers ---


CONCURRENT_TEST = """
import json, os, time
import pytest
from pytest_eagle3.plugin import gpu_workers
from pytest_eagle3.settings import GpuProbe, Settings

SETTINGS = Settings(tp=2, device="cuda", gpu=GpuProbe(4, "simulated 4 GPUs"))


@pytest.fixture(scope="session")
def leaser(pytestconfig):
    return gpu_workers.leaser_for_run(SETTINGS, pytestconfig, nccl_port=False)


@pytest.mark.parametrize("n", range(16))
def test_hold(n, leaser, pytestconfig):
    held = leaser.acquire()
    start = time.time()
    time.sleep(0.15)
    end = time.time()
    worker = gpu_workers.worker_id(pytestconfig)
    leaser.release()
    line = json.dumps({"worker": worker, "gpus": list(held.block.gpus), "start": start, "end": end})
    with open(os.environ["INTERVALS"], "a") as fh:
        fh.write(line + "\\n")
"""


def test_concurrent_workers_never_share_a_gpu(pytester: pytest.Pytester, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("xdist")
    intervals = tmp_path / "intervals.jsonl"
    monkeypatch.setenv("INTERVALS", str(intervals))
    monkeypatch.setenv(lease.ENV_LOCK_DIR, str(tmp_path / "locks"))
    pytester.makepyfile(test_concurrent=CONCURRENT_TEST)
    # 4 workers, 2 blocks of 2 simulated GPUs: two workers always wait.
    result = pytester.runpytest_subprocess("-n", "4")
    result.assert_outcomes(passed=16)
    records = [json.loads(line) for line in intervals.read_text().splitlines()]
    assert len(records) == 16
    assert len({r["worker"] for r in records}) >= 2
    for i, a in enumerate(records):
        for b in records[i + 1:]:
            overlap = a["start"] < b["end"] and b["start"] < a["end"]
            if overlap:
                assert not set(a["gpus"]) & set(b["gpus"]), (a, b)
    # Both blocks were in use at once at some point: the workers really ran concurrently.
    assert any(a["start"] < b["end"] and b["start"] < a["end"] for i, a in enumerate(records) for b in records[i + 1:])


# --- the pool takes the lease at the first start ---


class FakeServer:
    started: list["FakeServer"] = []

    def __init__(self, name, server_args, *, env=None, log_dir, startup_timeout=600.0):
        self.name, self.server_args, self.env = name, dict(server_args), dict(env or {})
        self.log_path = Path(log_dir) / f"{name}.log"
        self.startup_seconds = 0.0
        self.stopped = False

    @property
    def alive(self) -> bool:
        return not self.stopped

    def spawn(self):
        FakeServer.started.append(self)
        return self

    def wait_ready(self, progress=None):
        return self

    def stop(self):
        self.stopped = True
        return 0


def engine(tp: int, key: str) -> EngineConfig:
    return EngineConfig(model_path="/m", tp=tp, device="cuda", server_args=(("tp_size", tp), ("x", key)), env=())


def test_pool_leases_at_first_start_and_releases_at_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_eagle3.engine import pool as pool_module

    monkeypatch.setattr(pool_module, "SGLangServer", FakeServer)
    FakeServer.started = []
    blocks = gpu_blocks(ids(4), 2)
    locks = tmp_path / "locks"
    other = lease.acquire(blocks, lock_dir=locks, owner="another worker")  # holds 0,1
    leaser = lease.GpuLeaser(blocks, lock_dir=locks, owner="this worker")
    messages: list[str] = []
    pool = pool_module.EnginePool(log_dir=tmp_path / "logs", lease=leaser, progress=messages.append)
    assert leaser.lease is None  # nothing leased before an engine starts
    first = pool.get(engine(2, "a"))
    assert first.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert first.server_args["nccl_port"] in blocks[1].ports
    second = pool.get(engine(1, "b"))  # same block for the whole session, another port
    assert second.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert second.server_args["nccl_port"] in blocks[1].ports
    assert second.server_args["nccl_port"] != first.server_args["nccl_port"]
    assert any(m.startswith("starting SGLang tp=2 device=cuda on GPUs 2,3") for m in messages)
    other.release()
    with pytest.raises(lease.Eagle3LeaseTimeout):
        lease.acquire(blocks[1:], lock_dir=locks, owner="x", timeout=0.1, poll=0.05)
    pool.close()
    assert first.stopped and second.stopped
    with lease.acquire(blocks[1:], lock_dir=locks, owner="x", timeout=0.5):
        pass


def test_nccl_port_skips_busy_ports(tmp_path: Path) -> None:
    blocks = gpu_blocks(ids(2), 2)
    with lease.acquire(blocks, lock_dir=tmp_path) as held:
        window = blocks[0].ports
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
            try:
                busy.bind(("", window.start))
            except OSError:
                pytest.skip(f"port {window.start} is in use on this machine")
            busy.listen()
            assert held.nccl_port() == window.start + 1
        assert held.nccl_port() == window.start + 2


WIRING_TEST = """
def test_wiring(eagle3_gpu_lease, eagle3_engine_pool, eagle3_settings):
    if eagle3_settings.device == "cpu":
        assert eagle3_gpu_lease is None and eagle3_engine_pool.lease is None
        return
    assert eagle3_engine_pool.lease is eagle3_gpu_lease
    assert [b.gpus for b in eagle3_gpu_lease.blocks] == [("0", "1"), ("2", "3")]
    assert eagle3_gpu_lease.lease is None  # leased at the first engine start, not before
    assert eagle3_gpu_lease.use_nccl_port  # this SGLang has --nccl-port
"""


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_fixtures_give_the_pool_a_lease_on_cuda_only(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                     device: str) -> None:
    monkeypatch.setattr(resolve, "detect_gpus", lambda env=None: GpuProbe(4, "simulated 4 GPUs"))
    pytester.makepyfile(test_wiring=WIRING_TEST)
    result = pytester.runpytest("--device", device, "--tp", "2", f"--eagle3-cache={USER_CACHE}")
    result.assert_outcomes(passed=1)
