"""Two-batch overlap without an engine: the installed code's TBO facts
(sglang_source/tbo_code.py), the worker's proof line (worker/tbo_proof.py), the
``[tbo-no-a2a]`` explanation (engine/tbo_start.py) and a server that dies under
a request naming it (engine/server.py).

On the real engine: ``tests/e2e/test_tbo.py``.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_eagle3.engine import tbo_start
from pytest_eagle3.engine.config import EngineConfig
from pytest_eagle3.engine.server import SGLangServer
from pytest_eagle3.errors import Eagle3EngineError
from pytest_eagle3.sglang_source.install import sglang_location_and_version
from pytest_eagle3.sglang_source.tbo_code import read_tbo_code
from pytest_eagle3.worker import tbo_proof

LOCATION, _ = sglang_location_and_version()
needs_tbo_file = pytest.mark.skipif(
    LOCATION is None or not (LOCATION / "srt/batch_overlap/two_batch_overlap.py").is_file(),
    reason="needs an installed SGLang with srt/batch_overlap/two_batch_overlap.py (0.5.23)")

CAUSE = "TypeError: object of type 'NoneType' has no len() (sglang/srt/layers/dp_attention.py:92)"
TRACEBACK = """[2026-12-05 DP0 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/x/site-packages/sglang/srt/batch_overlap/two_batch_overlap.py", line 998, in model_forward_stages
    return execute_overlapped_operations(
  File "/x/site-packages/sglang/srt/layers/dp_attention.py", line 92, in dp_slot_in
    if len(per_rank) == 1:
TypeError: object of type 'NoneType' has no len()
"""


class _Ids:
    def __init__(self, n: int) -> None:
        self.shape = (n,)


def _batch(tokens: int, split: int | None, children: tuple[int, int] = (0, 0), mode: str = "EXTEND"):
    return SimpleNamespace(tbo_split_seq_index=split, forward_mode=SimpleNamespace(name=mode),
                           input_ids=_Ids(tokens),
                           tbo_children=[SimpleNamespace(input_ids=_Ids(n)) for n in children] if split is not None
                           else None)


def _config(**args: object) -> EngineConfig:
    return EngineConfig(model_path="/m", tp=2, device="cpu", env=(),
                        server_args=tuple({"tp_size": 2, "enable_dp_attention": True, **args}.items()))


@needs_tbo_file
def test_the_installed_tbo_facts_are_found() -> None:
    code = read_tbo_code(LOCATION)
    assert code.needs_a2a  # DeepseekV2MoE's TBO ops dispatch through an EP all-to-all backend only
    assert code.children_counts is not None and code.children_counts.file.endswith("two_batch_overlap.py")
    assert code.children_packer is not None and code.check is not None
    assert code.stages_call is not None and code.stages_capture is False  # the capture gap, read


def test_a_directory_without_sglang_reads_as_not_found(tmp_path: Path) -> None:
    code = read_tbo_code(tmp_path)
    assert not code.needs_a2a and code.children_counts is None and code.stages_capture is None


def test_the_proof_line_is_logged_once_per_mode(caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tbo_proof, "_seen", set())
    model = SimpleNamespace(start_layer=0, end_layer=6, first_k_dense_replace=1)
    with caplog.at_level(logging.WARNING, logger="pytest_eagle3.tbo_proof"):
        tbo_proof.before_forward(model, None, None, _batch(12, None))  # no TBO: nothing
        tbo_proof.before_forward(model, None, None, _batch(12, 1, (5, 7)))
        tbo_proof.before_forward(model, None, None, forward_batch=_batch(12, 1, (5, 7)))  # once per mode
        tbo_proof.before_forward(model, None, None, _batch(2, 1, (1, 1), mode="DECODE"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    found = tbo_proof.PROOF.search(lines[0])
    assert found and (found["mode"], found["tokens"], found["seq"], found["a"], found["b"]) == \
        ("EXTEND", "12", "1", "5", "7")
    assert (found["first"], found["last"]) == ("1", "5")
    assert "DECODE batch of 2 token(s)" in lines[1]
    # SGLang splits only from first_k_dense_replace inside the stage, or all layers when it lies before
    assert tbo_proof._split_layers(SimpleNamespace(start_layer=0, end_layer=6, first_k_dense_replace=0)) is None
    assert tbo_proof._split_layers(SimpleNamespace(start_layer=4, end_layer=8, first_k_dense_replace=1)) == (4, 7)
    assert tbo_proof.before_forward(object(), None, None, object()) is None  # never raises inside a forward


def test_the_proof_text_sums_up_the_ranks() -> None:
    log = "\n".join(tbo_proof.PROOF_LINE.format(mode=m, tokens=t, seq=0, a=a, b=b, first=1, last=7, pid=p)
                    for m, t, a, b, p in (("EXTEND", 8, 4, 4, 1), ("IDLE", 0, 0, 0, 2), ("EXTEND", 8, 4, 4, 3)))
    assert tbo_start.proof_text(log) == ("the TBO path ran (EXTEND 8 tokens -> 4 + 4; IDLE 0 tokens -> 0 + 0; "
                                         "layers 1-7 in model_forward_stages)")
    assert "model_forward_stages in the traceback" in tbo_start.proof_text(TRACEBACK)
    one = tbo_proof.PROOF_LINE.format(mode="EXTEND", tokens=1, seq=0, a=0, b=1, first=1, last=7, pid=1)
    assert "EXTEND 1 token -> 0 + 1;" in tbo_start.proof_text(one)


@needs_tbo_file
def test_tbo_without_an_a2a_backend_is_named() -> None:
    config = _config(enable_two_batch_overlap=True)
    key, line = tbo_start.explain_start(config, CAUSE, TRACEBACK, str(LOCATION))
    assert line.startswith("[tbo-no-a2a] two-batch overlap with DP attention and no EP all-to-all backend")
    assert CAUSE in line and "two_batch_overlap.py:" in line and "deepseek_v2.py:" in line
    assert "--moe-a2a-backend deepep" in line and "PR #32680" in line
    assert "--eagle3-sglang-arg moe_a2a_backend=deepep" in line and "not a capture defect" in line.splitlines()[0]
    assert key.startswith("[tbo-no-a2a]") and CAUSE not in key  # one cause, whatever the rank's message
    for other in (_config(), _config(enable_two_batch_overlap=True, moe_a2a_backend="deepep")):
        assert tbo_start.explain_start(other, CAUSE, TRACEBACK, str(LOCATION)) is None
    assert tbo_start.explain_start(config, CAUSE, "no TBO frame here", str(LOCATION)) is None
    proof_only = tbo_proof.PROOF_LINE.format(mode="EXTEND", tokens=8, seq=0, a=4, b=4, first=1, last=7, pid=1)
    assert tbo_start.explain_start(config, CAUSE, proof_only, str(LOCATION)) is None  # a frame, not the proof
    assert tbo_start.explain_start(config, "RuntimeError: x (sglang/srt/y.py:1)", TRACEBACK, str(LOCATION)) is None
    assert tbo_start.explain_start(config, CAUSE, TRACEBACK, None) is None


def test_a_server_that_dies_under_a_request_names_its_cause(tmp_path: Path) -> None:
    server = SGLangServer("tbo", {}, log_dir=tmp_path)
    server.log_path.write_text(TRACEBACK)
    server.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    server.proc.wait()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        server.port = s.getsockname()[1]
    seen: list[tuple[str, str]] = []
    server.explain_exit = lambda cause, log: seen.append((cause, log)) or ("[x]", "[x] named")
    with pytest.raises(Eagle3EngineError) as info:
        server.request("/generate", {})
    assert seen == [(CAUSE, TRACEBACK)]
    message = str(info.value)
    assert message.startswith("[x] named\nSGLang request /generate failed")
    assert f"(server exited with code 0); it died of {CAUSE}" in message
    assert server.exit_explanation == ("[x]", "[x] named")


def test_an_engine_that_died_of_a_named_cause_is_not_restarted(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_eagle3.engine import pool as pool_module
    from pytest_eagle3.errors import Eagle3StartCauseSeen
    from tests.unit.test_lease import FakeServer

    monkeypatch.setattr(pool_module, "SGLangServer", FakeServer)
    FakeServer.started = []
    pool = pool_module.EnginePool(log_dir=tmp_path)
    config = _config(enable_two_batch_overlap=True)
    server = pool.get(config, who="test_a")
    assert server.explain_exit is not None  # the pool explains a death under a request
    server.exit_explanation, server.stopped = ("[tbo-no-a2a] key", "[tbo-no-a2a] line\ndetails"), True
    with pytest.raises(Eagle3StartCauseSeen) as info:
        pool.get(config, who="test_b")
    assert str(info.value) == f"SGLang engine {config.name} died under a request (see test_a): [tbo-no-a2a] line"
    with pytest.raises(Eagle3StartCauseSeen):
        pool.get(config, who="test_c")
    assert len(FakeServer.started) == 1  # never restarted to die again
    assert any("[tbo-no-a2a] key" in line for line in pool.start_failures.summary_lines(1))


def test_sbo_streams_gives_the_hooks_a_stream_only_inside_forward_normal(caplog: pytest.LogCaptureFixture) -> None:
    import types

    import torch

    from pytest_eagle3.worker.cpu import patches

    if torch.cuda.is_available():
        pytest.skip("a no-op where CUDA is available")
    module = types.ModuleType("fake_deepseek_v2")
    module.torch = torch
    seen: list[object] = []

    class DeepseekV2MoE:
        _fuse_shared_experts_inside_sbo, alt_stream = True, None

        def forward_normal(self, x):  # SGLang's pre-combine hook, reduced to its stream calls
            self.alt_stream.wait_stream(module.torch.cuda.current_stream())
            with module.torch.cuda.stream(self.alt_stream):
                seen.append(self.alt_stream)
            return module.torch.zeros(x)

    module.DeepseekV2MoE = DeepseekV2MoE
    patches.sbo_streams(module)
    moe = DeepseekV2MoE()
    with caplog.at_level(logging.WARNING, logger="pytest_eagle3.cpu"):
        assert moe.forward_normal(2).shape == (2,)  # every other torch attribute is torch's own
    assert isinstance(seen[0], patches.CpuStream) and moe.alt_stream is None  # only for the call
    assert any("SBO stand-in: alt_stream.wait_stream called" in r.getMessage() for r in caplog.records)
    other = DeepseekV2MoE()
    other._fuse_shared_experts_inside_sbo = False
    with pytest.raises(AttributeError):  # a layer that does not fuse into SBO is left as SGLang made it
        other.forward_normal(2)
