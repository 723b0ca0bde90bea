"""pytest-eagle3's fixtures: a chain of small, overridable session fixtures.

The chain follows the data path; a fork's ``conftest.py`` can replace any link
(e.g. ``eagle3_checkpoint`` to point at a prepared directory)::

    eagle3_settings -> eagle3_target -> eagle3_checkpoint -> eagle3_model_config
                                     \\-> eagle3_prompts -> eagle3_reference
    eagle3_sglang (installed SGLang, flags) -> eagle3_engine_pool <- eagle3_gpu_lease (cuda)
    eagle3_tp + all of the above -> eagle3_capture (per test)

Nothing here imports torch, transformers or sglang at import time.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import pytest

from pytest_eagle3.plugin import session as eagle3_session
from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.plugin.options import Settings, check_tp_divides, get_settings

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.capture.api import Captures
    from pytest_eagle3.capture.draft_path import DraftPathCaptures
    from pytest_eagle3.planning.declare import EngineNeed, EngineRequest
    from pytest_eagle3.engine.config import EngineConfig
    from pytest_eagle3.engine.install import SGLangInstall
    from pytest_eagle3.engine.lease import GpuLeaser
    from pytest_eagle3.engine.pool import EnginePool
    from pytest_eagle3.engine.recordings import Record
    from pytest_eagle3.target.spec import LocalTarget, TargetFacts, TargetSpec

logger = logging.getLogger("pytest_eagle3")


def progress_writer(config: pytest.Config):
    """A callable printing progress lines on the terminal (and to the log)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def write(message: str) -> None:
        logger.info(message)
        if reporter is None or config.get_verbosity() < 0:
            return
        # Fixtures run under output capture: suspend it so the line reaches the terminal.
        if capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"[eagle3] {message}")
        else:
            reporter.write_line(f"[eagle3] {message}")

    return write


@pytest.fixture(scope="session")
def eagle3_settings(pytestconfig: pytest.Config) -> Settings:
    """The run's resolved :class:`~pytest_eagle3.plugin.options.Settings`."""
    return get_settings(pytestconfig)


@pytest.fixture(scope="session")
def eagle3_target(eagle3_settings: Settings) -> "TargetSpec | LocalTarget":
    """The target under test: a preset spec or a local checkpoint directory.

    Raises:
        Eagle3ConfigError: unknown preset, or a directory without config.json.
    """
    from pytest_eagle3.target.spec import resolve_target

    return resolve_target(eagle3_settings.target)


@pytest.fixture(scope="session")
def eagle3_checkpoint(eagle3_target: "TargetSpec | LocalTarget", eagle3_settings: Settings, pytestconfig: pytest.Config) -> Path:
    """Checkpoint directory: built once per machine into the cache for a preset,
    the user's directory as it is for a path."""
    from pytest_eagle3.target.spec import LocalTarget

    if isinstance(eagle3_target, LocalTarget):
        return eagle3_target.path
    from pytest_eagle3.target.checkpoint import ensure_checkpoint

    progress_writer(pytestconfig)(f"checkpoint {eagle3_target.name}: cache {eagle3_settings.cache_dir}")
    return ensure_checkpoint(eagle3_target, eagle3_settings.cache_dir, rebuild=eagle3_settings.rebuild)


@pytest.fixture(scope="session")
def eagle3_model_config(eagle3_checkpoint: Path, eagle3_settings: Settings) -> "TargetFacts":
    """The target's :class:`~pytest_eagle3.target.spec.TargetFacts`, from the
    checkpoint's ``config.json`` (so an overridden ``eagle3_checkpoint`` is read
    as it is); checks ``--tp`` divides the heads.

    Raises:
        Eagle3ConfigError: ``--tp`` does not divide ``num_attention_heads``.
    """
    from pytest_eagle3.target.spec import TargetFacts

    facts = TargetFacts.from_config(json.loads((eagle3_checkpoint / "config.json").read_text()))
    problem = check_tp_divides(eagle3_settings.tp, facts.num_attention_heads)
    if problem:
        raise Eagle3ConfigError(problem)
    return facts


@pytest.fixture(scope="session")
def eagle3_prompts(eagle3_model_config: "TargetFacts", eagle3_settings: Settings,
                   eagle3_checkpoint: Path) -> list[list[int]]:
    """Token-id prompts: ``--eagle3-prompts FILE`` (text tokenized by the target's
    tokenizer), else the packaged ``fixtures/prompts.json`` (ids spread over every
    vocab shard).

    Raises:
        Eagle3ConfigError: a bad prompts file (normally caught before the run).
    """
    if eagle3_settings.prompts is not None:
        from pytest_eagle3.target.prompts import load_prompts as load_user_prompts

        return load_user_prompts(eagle3_settings.prompts, vocab_size=eagle3_model_config.vocab_size,
                                 tokenizer_dir=eagle3_checkpoint)
    from pytest_eagle3.target.spec import load_prompts

    return load_prompts(vocab_size=eagle3_model_config.vocab_size)


@pytest.fixture(scope="session")
def eagle3_reference(eagle3_checkpoint: Path, eagle3_prompts: list[list[int]], pytestconfig: pytest.Config) -> "list[torch.Tensor]":
    """transformers' hidden states per prompt, ``[L+2, tokens, hidden]`` float32
    (``snapshots.py`` indexing), cached next to the checkpoint."""
    from pytest_eagle3.target.reference import ensure_reference

    progress_writer(pytestconfig)("reference hidden states (transformers)")
    return ensure_reference(eagle3_checkpoint, eagle3_prompts)


@pytest.fixture(scope="session")
def eagle3_sglang(eagle3_settings: Settings) -> "SGLangInstall":
    """The installed SGLang and its server flags.

    Raises:
        Eagle3SGLangMissing: not installed, or ``launch_server --help`` fails.
    """
    from pytest_eagle3.engine.install import probe

    return probe(eagle3_settings.cache_dir)


@pytest.fixture(scope="session")
def eagle3_gpu_lease(eagle3_settings: Settings, pytestconfig: pytest.Config,
                     request: pytest.FixtureRequest) -> Iterator["GpuLeaser | None"]:
    """This process's (xdist worker's) block of ``--tp`` GPUs, leased when its
    first engine starts and held for the session; ``None`` on cpu (no lease).
    See :mod:`pytest_eagle3.engine.lease`."""
    from pytest_eagle3.engine.lease import GpuLeaser

    if eagle3_settings.device != "cuda":
        yield None
        return
    install = request.getfixturevalue("eagle3_sglang")
    leaser = GpuLeaser.for_run(eagle3_settings, pytestconfig, progress=progress_writer(pytestconfig),
                               nccl_port=install.has_arg("nccl_port"))
    yield leaser
    if leaser is not None:
        leaser.release()


@pytest.fixture(scope="session")
def eagle3_engine_pool(request: pytest.FixtureRequest, eagle3_settings: Settings, pytestconfig: pytest.Config,
                       tmp_path_factory: pytest.TempPathFactory, eagle3_gpu_lease: "GpuLeaser | None",
                       eagle3_sglang: "SGLangInstall") -> Iterator["EnginePool"]:
    """Running SGLang servers, one per engine config, reused across tests."""
    from pytest_eagle3.engine.pool import EnginePool

    run = eagle3_session.get_session(pytestconfig)

    def on_start(config: "EngineConfig", server: Any) -> None:
        run.record_engine(f"{config.name} ({config.describe()})", server.startup_seconds or 0.0, server.log_path)

    pool = EnginePool(
        log_dir=tmp_path_factory.mktemp("sglang-logs"),
        startup_timeout=eagle3_settings.startup_timeout,
        progress=progress_writer(pytestconfig),
        on_start=on_start,
        lease=eagle3_gpu_lease,
        upcoming=_engine_order(request.session, eagle3_settings, eagle3_sglang),
    )
    yield pool
    try:
        pool.close()
    except Exception as exc:  # teardown problems are warnings, not errors
        warnings.warn(f"pytest-eagle3: stopping SGLang engines failed: {exc}", stacklevel=1)


def _engine_order(session: pytest.Session, settings: Settings, install: "SGLangInstall") -> "list[EngineConfig]":
    """The run's engines in the order its (engine-sorted) tests use them, from the
    same mapping ``--eagle3-plan`` prints; empty (no prefetch) on cuda, under
    pytest-xdist (a worker runs only some of the items) or with ``--eagle3-no-prefetch``."""
    if not settings.prefetch or settings.device != "cpu" or hasattr(session.config, "workerinput"):
        return []
    from pytest_eagle3.plugin.plan import build_plan

    return [engine.config for engine in build_plan(session.items, settings, install=install).engines]


@pytest.fixture
def eagle3_tp(request: pytest.FixtureRequest) -> int:
    """TP size of this test: its ``tp(...)`` parameter, else ``--tp``."""
    return eagle3_session.item_tp(request.node)


class CaptureRunner:
    """Start (or reuse) an engine configured to capture, and read its captures.

    Call it as ``eagle3_capture(layer_ids)``; see :meth:`__call__`.
    """

    def __init__(self, *, request: pytest.FixtureRequest, pool: "EnginePool", install: "SGLangInstall",
                 checkpoint: Path, settings: Settings, tp: int, prompts: list[list[int]],
                 facts: "TargetFacts | None" = None) -> None:
        self.request = request
        self.facts = facts
        self.pool = pool
        self.install = install
        self.checkpoint = checkpoint
        self.settings = settings
        self.tp = tp
        self.prompts = prompts
        self.last_config: "EngineConfig | None" = None

    def engine_config(self, layer_ids: Sequence[int] | None, extra_args: Mapping[str, Any] | None = None,
                      draft: str | None = None) -> "EngineConfig":
        """The engine for ``layer_ids`` and ``extra_args`` (the one ``--eagle3-plan`` prints);
        with ``draft``, the draft-path engine loading it (ids from its ``config.json``)."""
        from pytest_eagle3.capture.api import engine_config

        return engine_config(self.install, self.settings, model_path=str(self.checkpoint), tp=self.tp,
                             ids=layer_ids, extra_args=extra_args, facts=self.facts, draft=draft)

    def run(self, request: "EngineRequest") -> "list[Captures]":
        """Captures of the suite prompts for a declared :class:`EngineRequest`
        (its ids, server args and request shape); the last of ``request.repeat`` sends."""
        runs = [self(request.ids, decode_steps=request.decode_steps, extra_args=request.extra_args,
                     batch=request.batch, draft=request.draft) for _ in range(max(1, request.repeat))]
        return runs[-1]

    def server_info(self, request: "EngineRequest") -> dict[str, Any]:
        """``/server_info`` of ``request``'s engine: the server args as SGLang
        resolved them plus its scheduler info (read once per engine)."""
        server = self._server(request.ids, request.extra_args, request.draft)
        key = ("server_info", self.last_config)
        if key not in self.pool.results:
            self.pool.results[key] = server.server_info()
        return self.pool.results[key]

    def speculate(self, request: "EngineRequest", prompts: Sequence[Sequence[int]],
                  max_new_tokens: Sequence[int]) -> "list[DraftPathCaptures]":
        """Greedy speculative decoding of ``prompts`` on the engine of ``request``
        (which loads a draft): each request's output, captures and speculative
        metrics (:mod:`pytest_eagle3.capture.draft_path`).  Run once per engine,
        prompts and lengths in a session; later calls return the same results.

        Raises:
            Eagle3Error: the engine did not run speculative decoding (no metrics).
        """
        from pytest_eagle3.capture.draft_path import capture_draft_path

        assert request.draft is not None, "speculate() needs a request that loads a draft"
        server = self._server(request.ids, request.extra_args, request.draft)
        assert self.last_config is not None
        # Greedy decoding on one engine is deterministic: the tests that read the
        # same run (the gate, its power check) share it instead of decoding twice.
        key = ("speculate", self.last_config, tuple(map(tuple, prompts)), tuple(int(n) for n in max_new_tokens))
        if key not in self.pool.results:
            out = []
            for prompt, n in zip(prompts, max_new_tokens):
                out += capture_draft_path(server, [prompt], decode_steps=max(0, int(n) - 1))
            self.pool.results[key] = out
        return list(self.pool.results[key])

    def __call__(self, layer_ids: Sequence[int] | None, *, prompts: Sequence[Sequence[int]] | None = None,
                 decode_steps: int = 0, extra_args: Mapping[str, Any] | None = None,
                 batch: bool = False, draft: str | None = None) -> "list[Captures]":
        """Captures of ``prompts`` (default: the suite prompts) with draft ids ``layer_ids``.

        ``layer_ids=None`` leaves SGLang's default list; ``batch`` sends all
        prompts in one request.  The engine's log is attached to the test report
        if the test fails.

        Raises:
            Eagle3CaptureUnsupported: this SGLang cannot return captures without a draft.
            Eagle3EngineError: the engine failed to start or answer (with its log tail).
        """
        from pytest_eagle3.capture.api import capture

        server = self._server(layer_ids, extra_args, draft)
        return capture(server, self.prompts if prompts is None else prompts, decode_steps=decode_steps,
                       batch=batch)

    def _server(self, layer_ids: Sequence[int] | None, extra_args: Mapping[str, Any] | None,
                draft: str | None = None) -> Any:
        config = self.engine_config(layer_ids, extra_args, draft)
        self.last_config = config
        entry = ("eagle3_engine", f"{config.name} ({config.describe()})")
        if entry not in self.request.node.user_properties:
            self.request.node.user_properties.append(entry)
        eagle3_session.attach_log(self.request.node, config.name, self.pool.log_path(config))
        return self.pool.get(config, who=self.request.node.nodeid)

    def with_ranks(self, layer_ids: Sequence[int] | None, *, prompts: Sequence[Sequence[int]] | None = None,
                   decode_steps: int = 0, extra_args: Mapping[str, Any] | None = None,
                   fault: Mapping[str, Any] | None = None,
                   draft: str | None = None) -> "tuple[list[Captures], dict[int, list[Record]]]":
        """Like calling the runner, plus what every TP rank captured: per rank, the
        prefill rows of each prompt's request, in prompt order
        (:func:`pytest_eagle3.engine.recordings.prefill_records`).

        ``fault`` (self-tests only) makes one rank's recorder store a wrong copy:
        see :data:`pytest_eagle3.engine.recorder_hook.FAULTS`.

        Raises:
            Eagle3Error: a rank recorded nothing (the SGLang plugin is not loaded).
        """
        from pytest_eagle3.capture.api import capture
        from pytest_eagle3.engine.recordings import Recorder, prefill_records

        server = self._server(layer_ids, extra_args, draft)
        assert self.last_config is not None
        recorder = Recorder(self.pool.record_dir(self.last_config))
        with recorder.recording(fault=fault):
            captures = capture(server, self.prompts if prompts is None else prompts, decode_steps=decode_steps)
            records = recorder.read(self.tp)
        # Only the test's own requests, one prefill record per prompt in order
        # (a readiness probe's or another client's forward never shifts them).
        return captures, prefill_records(records, [c.rid for c in captures])


@pytest.fixture
def eagle3_capture(request: pytest.FixtureRequest, eagle3_engine_pool: "EnginePool", eagle3_sglang: "SGLangInstall",
                   eagle3_checkpoint: Path, eagle3_settings: Settings, eagle3_tp: int,
                   eagle3_prompts: list[list[int]], eagle3_model_config: "TargetFacts") -> CaptureRunner:
    """A :class:`CaptureRunner` for this test's TP size."""
    return CaptureRunner(request=request, pool=eagle3_engine_pool, install=eagle3_sglang,
                         checkpoint=eagle3_checkpoint, settings=eagle3_settings, tp=eagle3_tp,
                         prompts=eagle3_prompts, facts=eagle3_model_config)


@pytest.fixture
def eagle3_need(request: pytest.FixtureRequest) -> "EngineNeed":
    """The :class:`~pytest_eagle3.planning.declare.EngineNeed` this test was
    generated for (``@pytest.mark.eagle3_engines(...)``).

    Raises:
        Eagle3ConfigError: the test requests it without declaring its engines.
    """
    raise Eagle3ConfigError(
        f"{request.node.nodeid} uses eagle3_need but declares no engines: add "
        "@pytest.mark.eagle3_engines(*needs) (pytest_eagle3.planning.declare)"
    )


@pytest.fixture
def eagle3_engine_request(eagle3_need: "EngineNeed", eagle3_tp: int, eagle3_settings: Settings,
                          eagle3_sglang: "SGLangInstall", eagle3_model_config: "TargetFacts",
                          record_property: Any) -> "EngineRequest":
    """The declared need resolved for this target and SGLang
    (:func:`pytest_eagle3.planning.declare.resolve`, as ``--eagle3-plan`` does)."""
    from pytest_eagle3.planning.declare import NeedContext, resolve

    request = resolve(eagle3_need, NeedContext(eagle3_settings, eagle3_tp, eagle3_sglang, eagle3_model_config))
    if eagle3_need.acceptance and request.draft is not None:
        # A draft that cannot fit the target: one line (Eagle3DraftError) before any engine starts.
        from pytest_eagle3.draft.validate import validate_draft

        validate_draft(request.draft, eagle3_model_config.hidden_size, eagle3_model_config.vocab_size)
    if request.draft is not None and not eagle3_need.acceptance:
        # The draft path's random draft for this id list, built once per machine.
        from pytest_eagle3.planning.declare import target_config
        from pytest_eagle3.draft.random_draft import ensure_capture_draft

        ensure_capture_draft(eagle3_settings.cache_dir, target_config(eagle3_model_config), request.ids)
        record_property("eagle3_capture_method", "eagle3-draft")
    record_property("eagle3_ids", list(request.ids) if request.ids is not None else None)
    if request.note:
        record_property("eagle3_note", request.note)
    return request
