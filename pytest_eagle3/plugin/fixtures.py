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
from typing import TYPE_CHECKING, Any, Iterator

import pytest

from pytest_eagle3.plugin import session as eagle3_session
from pytest_eagle3.errors import Eagle3ConfigError
from pytest_eagle3.plugin.run import get_run, get_settings
from pytest_eagle3.plugin.validate import check_tp_divides
from pytest_eagle3.settings import Settings
from pytest_eagle3.target.spec import LocalTarget, TargetFacts, load_packaged_prompts, resolve_target
from pytest_eagle3.target.checkpoint import ensure_checkpoint
from pytest_eagle3.target.reference import ensure_reference
from pytest_eagle3.sglang_source import install as sglang_install
from pytest_eagle3.engine.lease import GpuLeaser
from pytest_eagle3.plugin.gpu_workers import leaser_for_run
from pytest_eagle3.engine.pool import EnginePool
from pytest_eagle3.plugin.plan import build_plan
from pytest_eagle3.planning.declare import NeedContext
from pytest_eagle3.planning.request import resolve, target_config
from pytest_eagle3.target.prompts import load_prompts as load_user_prompts
from pytest_eagle3.capture.runner import CaptureRunner
from pytest_eagle3.draft.validate import validate_draft
from pytest_eagle3.draft.random_draft import ensure_capture_draft

if TYPE_CHECKING:
    import torch

    from pytest_eagle3.planning.declare import EngineNeed, EngineRequest
    from pytest_eagle3.engine.config import EngineConfig
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.target.spec import TargetSpec

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
    """The run's resolved :class:`~pytest_eagle3.settings.Settings`."""
    return get_settings(pytestconfig)


@pytest.fixture(scope="session")
def eagle3_target(eagle3_settings: Settings) -> "TargetSpec | LocalTarget":
    """The target under test: a preset spec or a local checkpoint directory.

    Raises:
        Eagle3ConfigError: unknown preset, or a directory without config.json.
    """

    return resolve_target(eagle3_settings.target)


@pytest.fixture(scope="session")
def eagle3_checkpoint(eagle3_target: "TargetSpec | LocalTarget", eagle3_settings: Settings, pytestconfig: pytest.Config) -> Path:
    """Checkpoint directory: built once per machine into the cache for a preset,
    the user's directory as it is for a path."""

    if isinstance(eagle3_target, LocalTarget):
        return eagle3_target.path

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
        return load_user_prompts(eagle3_settings.prompts, vocab_size=eagle3_model_config.vocab_size,
                                 tokenizer_dir=eagle3_checkpoint)

    return load_packaged_prompts(vocab_size=eagle3_model_config.vocab_size)


@pytest.fixture(scope="session")
def eagle3_reference(eagle3_checkpoint: Path, eagle3_prompts: list[list[int]], pytestconfig: pytest.Config) -> "list[torch.Tensor]":
    """transformers' hidden states per prompt, ``[L+2, tokens, hidden]`` float32
    (``snapshots.py`` indexing), cached next to the checkpoint."""

    progress_writer(pytestconfig)("reference hidden states (transformers)")
    return ensure_reference(eagle3_checkpoint, eagle3_prompts)


@pytest.fixture(scope="session")
def eagle3_sglang(eagle3_settings: Settings) -> "SGLangInstall":
    """The installed SGLang and its server flags.

    Raises:
        Eagle3SGLangMissing: not installed, or ``launch_server --help`` fails.
    """

    return sglang_install.probe(eagle3_settings.cache_dir)


@pytest.fixture(scope="session")
def eagle3_gpu_lease(eagle3_settings: Settings, pytestconfig: pytest.Config,
                     request: pytest.FixtureRequest) -> Iterator["GpuLeaser | None"]:
    """This process's (xdist worker's) block of ``--tp`` GPUs, leased when its
    first engine starts and held for the session; ``None`` on cpu (no lease).
    See :mod:`pytest_eagle3.engine.lease`."""

    if eagle3_settings.device != "cuda":
        yield None
        return
    install = request.getfixturevalue("eagle3_sglang")
    leaser = leaser_for_run(eagle3_settings, pytestconfig, progress=progress_writer(pytestconfig),
                            nccl_port=install.has_arg("nccl_port"))
    yield leaser
    if leaser is not None:
        leaser.release()


@pytest.fixture(scope="session")
def eagle3_engine_pool(request: pytest.FixtureRequest, eagle3_settings: Settings, pytestconfig: pytest.Config,
                       tmp_path_factory: pytest.TempPathFactory, eagle3_gpu_lease: "GpuLeaser | None",
                       eagle3_sglang: "SGLangInstall") -> Iterator["EnginePool"]:
    """Running SGLang servers, one per engine config, reused across tests."""

    run = get_run(pytestconfig)

    def on_start(config: "EngineConfig", server: Any) -> None:
        run.record_engine(f"{config.name} ({config.describe()})", server.startup_seconds or 0.0, server.log_path)

    pool = EnginePool(
        log_dir=tmp_path_factory.mktemp("sglang-logs"),
        startup_timeout=eagle3_settings.startup_timeout,
        progress=progress_writer(pytestconfig),
        on_start=on_start,
        lease=eagle3_gpu_lease,
        upcoming=_engine_order(request.session, eagle3_settings, eagle3_sglang),
        sglang_location=str(eagle3_sglang.location) if eagle3_sglang.location else None,
    )
    run.pool = pool
    yield pool
    try:
        pool.close()
    except Exception as exc:  # teardown problems are warnings, not errors
        warnings.warn(f"pytest-eagle3: stopping SGLang engines failed: {exc}", stacklevel=1)


def _engine_order(session: pytest.Session, settings: Settings, install: "SGLangInstall") -> "list[EngineConfig]":
    """The run's engines in the order its (engine-sorted) tests use them, from the
    same mapping ``--eagle3-plan`` prints; empty (no prefetch) on cuda, under
    pytest-xdist (a worker runs only some of the items) or without ``--eagle3-prefetch``."""
    if not settings.prefetch or settings.device != "cpu" or hasattr(session.config, "workerinput"):
        return []

    return [engine.config for engine in build_plan(session.items, settings, install=install).engines]


@pytest.fixture
def eagle3_tp(request: pytest.FixtureRequest) -> int:
    """TP size of this test: its ``tp(...)`` parameter, else ``--tp``."""
    return eagle3_session.item_tp(request.node)


@pytest.fixture
def eagle3_capture(request: pytest.FixtureRequest, eagle3_engine_pool: "EnginePool", eagle3_sglang: "SGLangInstall",
                   eagle3_checkpoint: Path, eagle3_settings: Settings, eagle3_tp: int,
                   eagle3_prompts: list[list[int]], eagle3_model_config: "TargetFacts") -> CaptureRunner:
    """A :class:`~pytest_eagle3.capture.runner.CaptureRunner` for this test's TP size;
    each engine it uses is listed in the test's ``user_properties`` and its log is
    attached to the report if the test fails."""
    node = request.node

    def on_engine(config: "EngineConfig", log_path: Path) -> None:
        entry = ("eagle3_engine", f"{config.name} ({config.describe()})")
        if entry not in node.user_properties:
            node.user_properties.append(entry)
        eagle3_session.attach_log(node, config.name, log_path)

    return CaptureRunner(pool=eagle3_engine_pool, install=eagle3_sglang, checkpoint=eagle3_checkpoint,
                         options=eagle3_settings, tp=eagle3_tp, prompts=eagle3_prompts,
                         facts=eagle3_model_config, who=node.nodeid, on_engine=on_engine)


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
def eagle3_engine_set(eagle3_need: "EngineNeed", eagle3_engine_request: "EngineRequest", eagle3_tp: int,
                      eagle3_settings: Settings, eagle3_sglang: "SGLangInstall",
                      eagle3_model_config: "TargetFacts") -> "dict[str, EngineRequest]":
    """The test's engine set resolved: name -> :class:`~pytest_eagle3.planning.declare.EngineRequest`
    (``main``: ``eagle3_engine_request``; the others from the need's ``also``,
    :meth:`~pytest_eagle3.planning.declare.EngineNeed.engine_set`), the engines
    ``--eagle3-plan`` lists for the test."""
    ctx = NeedContext(eagle3_settings, eagle3_tp, eagle3_sglang, eagle3_model_config)
    return {name: (eagle3_engine_request if member is eagle3_need else resolve(member, ctx))
            for name, member in eagle3_need.engine_set().items()}


@pytest.fixture
def eagle3_engine_request(eagle3_need: "EngineNeed", eagle3_tp: int, eagle3_settings: Settings,
                          eagle3_sglang: "SGLangInstall", eagle3_model_config: "TargetFacts",
                          record_property: Any) -> "EngineRequest":
    """The declared need resolved for this target and SGLang
    (:func:`pytest_eagle3.planning.request.resolve`, as ``--eagle3-plan`` does)."""

    request = resolve(eagle3_need, NeedContext(eagle3_settings, eagle3_tp, eagle3_sglang, eagle3_model_config))
    if eagle3_need.acceptance and request.draft is not None:
        # A draft that cannot fit the target: one line (Eagle3DraftError) before any engine starts.

        validate_draft(request.draft, eagle3_model_config.hidden_size, eagle3_model_config.vocab_size,
                       target_mla={"kv_lora_rank": eagle3_model_config.kv_lora_rank,
                                   "qk_rope_head_dim": eagle3_model_config.qk_rope_head_dim},
                       sglang_location=eagle3_sglang.location)
    if request.draft is not None and not eagle3_need.acceptance:
        # The draft path's random draft for this id list, built once per machine.

        ensure_capture_draft(eagle3_settings.cache_dir, target_config(eagle3_model_config), request.ids)
        record_property("eagle3_capture_method", "eagle3-draft")
    record_property("eagle3_ids", list(request.ids) if request.ids is not None else None)
    if request.note:
        record_property("eagle3_note", request.note)
    return request
