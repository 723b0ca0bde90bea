"""Start (or reuse) SGLang engines configured to capture, and read what they capture.

:class:`CaptureRunner` joins the run's engine pool (:mod:`pytest_eagle3.engine.pool`),
the engine configs (:func:`pytest_eagle3.capture.api.engine_config`) and the three
ways to read captures: the capture-only API (:func:`pytest_eagle3.capture.api.capture`),
the draft path (:func:`pytest_eagle3.capture.draft_path.capture_draft_path`) and the
per-TP-rank recorder (:mod:`pytest_eagle3.engine.recordings`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from pytest_eagle3.capture.api import capture, engine_config
from pytest_eagle3.engine.config import attention_dp_size
from pytest_eagle3.engine.draft_inputs import read_draft_inputs
from pytest_eagle3.capture.recorded import RankCaptures, SpecRecording
from pytest_eagle3.worker.env import FUSION_ENV, ID_SWITCH_ENV
from pytest_eagle3.worker.id_switch import APPLIED_FILE, IDS_FILE
from pytest_eagle3.settings import Settings
from pytest_eagle3.capture.draft_path import capture_draft_path
from pytest_eagle3.engine.standin_proof import NOT_TAKEN, configured, not_taken
from pytest_eagle3.engine.recordings import (
    Recorder, decode_records, prefill_records, request_forwards, served_requests,
)
from pytest_eagle3.errors import Eagle3EngineError
from pytest_eagle3.sglang_source.pp_code import read_pp_code

#: An engine that switches ids did not apply a request's ids on every rank.
IDS_NOT_SWITCHED = (
    "SGLang engine {engine}: TP rank {rank} did not switch its aux layer ids to {ids} before the "
    "request (it last applied {applied}); the captures would be another list's "
    "(pytest_eagle3/worker/id_switch.py; --eagle3-no-id-switch starts one engine per list; log: {log})"
)

if TYPE_CHECKING:
    from pytest_eagle3.capture.draft_path import DraftPathCaptures
    from pytest_eagle3.capture.response import Captures
    from pytest_eagle3.engine.config import EngineConfig
    from pytest_eagle3.sglang_source.install import SGLangInstall
    from pytest_eagle3.engine.pool import EnginePool
    from pytest_eagle3.engine.recordings import Record
    from pytest_eagle3.target.spec import TargetFacts


class CaptureRequest(Protocol):
    """One engine and request shape a test declared
    (:class:`pytest_eagle3.planning.declare.EngineRequest` is one).

    Attributes:
        ids: the draft's aux layer ids, ``None`` for SGLang's default.
        extra_args: server arguments of the path variant.
        draft: a draft directory the engine loads, or ``None``.
        decode_steps: decode steps per request after the prefill.
        batch: all prompts in one request.
        repeat: how many times the prompts are sent (the last send is read).
    """

    ids: Sequence[int] | None
    extra_args: Mapping[str, Any]
    draft: str | None
    decode_steps: int
    batch: bool
    repeat: int


class CaptureRunner:
    """Start (or reuse) an engine configured to capture, and read its captures.

    Call it as ``runner(layer_ids)``; see :meth:`__call__`.  The fixture
    ``eagle3_capture`` is one, for the test's TP size.

    Args:
        pool: the run's engines (:class:`~pytest_eagle3.engine.pool.EnginePool`).
        install: the installed SGLang.
        checkpoint: the target checkpoint directory.
        options: the run's device, fault and extra server arguments.
        tp: the TP size of every engine this runner starts.
        prompts: the default prompts, token ids.
        facts: the target's ``config.json`` facts.
        who: who asks for engines (a test id), for the pool's bookkeeping.
        on_engine: called with each engine's config and log path before the
            engine is used (the plugin attaches the log to the test report).
    """

    def __init__(self, *, pool: "EnginePool", install: "SGLangInstall", checkpoint: Path,
                 options: Settings, tp: int, prompts: list[list[int]],
                 facts: "TargetFacts | None" = None, who: str = "",
                 on_engine: "Callable[[EngineConfig, Path], None] | None" = None) -> None:
        self.who = who
        self.on_engine = on_engine
        self.facts = facts
        self.pool = pool
        self.install = install
        self.checkpoint = checkpoint
        self.options = options
        self.tp = tp
        self.prompts = prompts
        self.last_config: "EngineConfig | None" = None

    @property
    def fused_allreduce(self) -> bool:
        """Whether this runner's engines fuse each MLP all-reduce into the next
        norm: the CPU tier's all-reduce fusion path is in their env
        (:data:`pytest_eagle3.worker.cpu.allreduce_fusion.FUSION_ENV`)."""
        config = self.last_config or self.engine_config(None)
        return config.env_dict().get(FUSION_ENV) == "1"

    @property
    def pp_stages(self) -> tuple[tuple[int, int], ...]:
        """``((start, end), ...)`` per pipeline stage of this runner's engines (end exclusive),
        by the installed SGLang's own ``get_pp_indices``; ``()`` at PP 1 or where it is unknown."""
        pp = int(self.options.pp or 1)
        if pp < 2 or self.facts is None or not self.install.location:
            return ()
        stages = read_pp_code(self.install.location).stages(self.facts.num_layers, pp)
        return tuple(stages or ())

    def engine_config(self, layer_ids: Sequence[int] | None, extra_args: Mapping[str, Any] | None = None,
                      draft: str | None = None) -> "EngineConfig":
        """The engine for ``layer_ids`` and ``extra_args`` (the one ``--eagle3-plan`` prints);
        with ``draft``, the draft-path engine loading it (ids from its ``config.json``)."""

        return engine_config(self.install, self.options, model_path=str(self.checkpoint), tp=self.tp,
                             ids=layer_ids, extra_args=extra_args, facts=self.facts, draft=draft)

    def run(self, request: "CaptureRequest") -> "list[Captures]":
        """Captures of the suite prompts for a declared :class:`CaptureRequest`
        (its ids, server args and request shape); the last of ``request.repeat`` sends."""
        return self.sends(request)[-1]

    def sends(self, request: "CaptureRequest") -> "list[list[Captures]]":
        """Every one of ``request.repeat`` sends of the suite prompts, in order: the
        first computed in full (the radix cache flushed before it), the later ones
        hitting the cache where the engine has it on."""
        first = self(request.ids, decode_steps=request.decode_steps, extra_args=request.extra_args,
                     batch=request.batch, draft=request.draft)
        return [first] + [self(request.ids, decode_steps=request.decode_steps, extra_args=request.extra_args,
                               batch=request.batch, draft=request.draft, fresh=False)
                          for _ in range(max(1, request.repeat) - 1)]

    def server_info(self, request: "CaptureRequest") -> dict[str, Any]:
        """``/server_info`` of ``request``'s engine: the server args as SGLang
        resolved them plus its scheduler info (read once per engine)."""
        server = self._server(request.ids, request.extra_args, request.draft)
        key = ("server_info", self.last_config)
        if key not in self.pool.results:
            self.pool.results[key] = server.server_info()
        return self.pool.results[key]

    def log_text(self, request: "CaptureRequest") -> tuple[str, str]:
        """(the log of ``request``'s engine so far, its path); ``""`` when unreadable."""
        self._server(request.ids, request.extra_args, request.draft)
        assert self.last_config is not None
        path = self.pool.log_path(self.last_config)
        try:
            return path.read_text(encoding="utf-8", errors="replace"), str(path)
        except OSError:
            return "", str(path)

    def recorded(self, request: "CaptureRequest") -> "tuple[list[Captures], dict[int, list[Record]]]":
        """The suite prompts sent as ``request`` sends them (batch, decode steps) with
        the per-rank recorder on: the API's captures and every TP rank's forwards
        holding their rows, each restricted to those rows
        (:func:`pytest_eagle3.engine.recordings.request_forwards`).  Under attention
        DP each DP rank holds the forwards of the requests it served.

        Raises:
            Eagle3Error: a rank recorded nothing (the SGLang plugin is not loaded).
        """
        server = self._server(request.ids, request.extra_args, request.draft)
        assert self.last_config is not None
        dp = attention_dp_size(dict(self.last_config.server_args))
        recorder = Recorder(self.pool.record_dir(self.last_config))
        self._flush(server)
        with recorder.recording():
            captures = capture(server, self.prompts, decode_steps=request.decode_steps, batch=request.batch)
            records = recorder.read(self.tp, even=dp == 1)
        rids = [c.rid for c in self._count_send(captures, request.batch)]
        return captures, request_forwards(records, rids)

    def speculate(self, request: "CaptureRequest", prompts: Sequence[Sequence[int]],
                  max_new_tokens: Sequence[int]) -> "list[DraftPathCaptures]":
        """Greedy speculative decoding of ``prompts`` on the engine of ``request``
        (which loads a draft): each request's output, captures and speculative
        metrics (:mod:`pytest_eagle3.capture.draft_path`).  Run once per engine,
        prompts and lengths in a session; later calls return the same results.

        Raises:
            Eagle3Error: the engine did not run speculative decoding (no metrics).
        """

        assert request.draft is not None, "speculate() needs a request that loads a draft"
        server = self._server(request.ids, request.extra_args, request.draft)
        assert self.last_config is not None
        # Greedy decoding on one engine is deterministic: the tests that read the
        # same run (the gate, its power check) share it instead of decoding twice.
        key = ("speculate", self.last_config, tuple(map(tuple, prompts)), tuple(int(n) for n in max_new_tokens))
        if key not in self.pool.results:
            self._flush(server)
            self.pool.results[key] = _decode_each(server, prompts, max_new_tokens)
        self._prove_standin_paths(server)
        return list(self.pool.results[key])

    def speculate_ranks(self, request: "CaptureRequest", prompts: Sequence[Sequence[int]],
                        max_new_tokens: Sequence[int]) -> "tuple[list[DraftPathCaptures], dict[int, list[Record]]]":
        """:meth:`speculate` once more with the per-rank recorder on: each request's
        output and, per rank, every forward holding the requests' rows (prefill,
        verify), in order (:func:`pytest_eagle3.engine.recordings.request_forwards`;
        the requests carry no rid of ours, so every forward of the run is kept).
        Under attention DP each DP rank holds the forwards of the requests it served.
        The run is :meth:`speculate_recorded`'s, shared with the tests that read it.

        Raises:
            Eagle3Error: a rank recorded nothing.
        """
        run = self.speculate_recorded(request, prompts, max_new_tokens)
        return list(run.runs), run.records

    def speculate_recorded(self, request: "CaptureRequest", prompts: Sequence[Sequence[int]],
                           max_new_tokens: Sequence[int]) -> SpecRecording:
        """Greedy speculative decoding of ``prompts`` with the per-rank recorder and the
        draft's input recorder on (:mod:`pytest_eagle3.engine.draft_inputs`): run once
        per engine, prompts and lengths in a session; later calls return the same run.

        Raises:
            Eagle3Error: a rank recorded nothing.
        """
        assert request.draft is not None, "speculate_recorded() needs a request that loads a draft"
        server = self._server(request.ids, request.extra_args, request.draft)
        assert self.last_config is not None
        key = ("recorded", self.last_config, tuple(map(tuple, prompts)), tuple(int(n) for n in max_new_tokens))
        if key not in self.pool.results:
            dp = attention_dp_size(dict(self.last_config.server_args))
            recorder = Recorder(self.pool.record_dir(self.last_config))
            self._flush(server)
            with recorder.recording():
                out = _decode_each(server, prompts, max_new_tokens)
                records = recorder.read(self.tp, even=dp == 1)
                draft = read_draft_inputs(recorder.directory, self.tp)
            self._prove_standin_paths(server)
            self._count_send([run.captures for run in out])  # its order on the engine, for the diagnosis
            self.pool.results[key] = SpecRecording(tuple(out), records, draft)
        return self.pool.results[key]

    def __call__(self, layer_ids: Sequence[int] | None, *, prompts: Sequence[Sequence[int]] | None = None,
                 decode_steps: int = 0, extra_args: Mapping[str, Any] | None = None,
                 batch: bool = False, draft: str | None = None, fresh: bool = True) -> "list[Captures]":
        """Captures of ``prompts`` (default: the suite prompts) with draft ids ``layer_ids``.

        ``layer_ids=None`` leaves SGLang's default list; ``batch`` sends all
        prompts in one request.  ``fresh``: on an engine with the radix cache on,
        flush it first, so every row is computed (``False``: a repeat that may hit
        the cache).  The engine's log is attached to the test report if the test fails.

        Raises:
            Eagle3CaptureUnsupported: this SGLang cannot return captures without a draft.
            Eagle3EngineError: the engine failed to start or answer (with its log tail).
        """

        server = self._server(layer_ids, extra_args, draft)
        if fresh:
            self._flush(server)
        out = capture(server, self.prompts if prompts is None else prompts, decode_steps=decode_steps,
                      batch=batch)
        self._prove_ids_switched(layer_ids)
        self._prove_standin_paths(server)
        return self._count_send(out, batch)

    def _count_send(self, out: "list[Captures]", batch: bool = False) -> "list[Captures]":
        """Mark ``out`` with which send of its engine's life it was, from 0, the
        engine's name (:attr:`~pytest_eagle3.capture.response.Captures.order`) and
        how many requests it held together (``batch``: all of ``out`` in one request)."""
        config = self.last_config
        key = ("sends", config)
        order = self.pool.results.get(key, 0)
        self.pool.results[key] = order + 1
        for i, cap in enumerate(out):
            cap.order, cap.engine, cap.index = order, config.name if config is not None else "", i
            cap.batch = len(out) if batch else 1
        return out

    def _flush(self, server: Any) -> None:
        """Empty the radix cache of an engine that has it on (the capture engine,
        :func:`pytest_eagle3.engine.variants.shared_engine_args`): a prompt an earlier
        test sent would otherwise return only its uncached rows."""
        config = self.last_config
        if config is not None and config.args().get("disable_radix_cache") is False:
            server.flush_cache()

    def _prove_standin_paths(self, server: Any) -> None:
        """Fail when the engine runs a CPU-tier stand-in path (in-place norms,
        all-reduce fusion, single-batch overlap's stream) that did not run on every TP rank (its log, read
        once per engine: :mod:`pytest_eagle3.engine.standin_proof`)."""
        config = self.last_config
        paths = (configured(config.env_dict(), config.args() if config.device == "cpu" else None)
                 if config is not None else [])
        if not paths:
            return
        key = ("standin-proof", config)
        if key not in self.pool.results:
            try:
                text = Path(server.log_path).read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                self.pool.results[key] = (paths[0], f"its log could not be read ({exc})")
            else:
                self.pool.results[key] = next(((p, why) for p in paths
                                               if (why := not_taken(text, p, config.tp)) is not None), None)
        failed = self.pool.results[key]
        if failed is not None:
            path, why = failed
            raise Eagle3EngineError(NOT_TAKEN.format(engine=config.name, path=path.name,
                                                     env="=".join(map(str, path.env)), what=why, log=server.log_path))

    def _server(self, layer_ids: Sequence[int] | None, extra_args: Mapping[str, Any] | None,
                draft: str | None = None) -> Any:
        config = self.engine_config(layer_ids, extra_args, draft)
        self.last_config = config
        if self.on_engine is not None:
            self.on_engine(config, self.pool.log_path(config))
        server = self.pool.get(config, who=self.who)
        if config.env_dict().get(ID_SWITCH_ENV) == "1":
            # The ids the next request captures (worker/id_switch.py), written while idle.
            directory = self.pool.record_dir(config)
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / (IDS_FILE + ".tmp")
            tmp.write_text(json.dumps(list(layer_ids) if layer_ids is not None else None))
            os.replace(tmp, directory / IDS_FILE)
        return server

    def _prove_ids_switched(self, layer_ids: Sequence[int] | None) -> None:
        """On an engine that switches ids, every TP rank must have applied ``layer_ids``
        (its ``IDS.applied.rank<r>``), else the captures are another list's.

        Raises:
            Eagle3EngineError: a rank did not apply them (:data:`IDS_NOT_SWITCHED`).
        """
        config = self.last_config
        if config is None or config.env_dict().get(ID_SWITCH_ENV) != "1":
            return
        want = list(layer_ids) if layer_ids is not None else None
        directory = self.pool.record_dir(config)
        for rank in range(config.tp):
            path = directory / APPLIED_FILE.format(rank=rank)
            try:
                applied = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                applied = {"ids": f"nothing readable ({exc})"}
            if applied.get("ids") != want:
                raise Eagle3EngineError(IDS_NOT_SWITCHED.format(
                    engine=config.name, rank=rank, ids=want, applied=applied.get("ids"),
                    log=self.pool.log_path(config)))

    def with_ranks(self, layer_ids: Sequence[int] | None, *, prompts: Sequence[Sequence[int]] | None = None,
                   decode_steps: int = 0, extra_args: Mapping[str, Any] | None = None,
                   fault: Mapping[str, Any] | None = None,
                   draft: str | None = None) -> "tuple[list[Captures], dict[int, list[Record]]]":
        """Like calling the runner, plus what every TP rank captured: per rank, the
        prefill rows of each prompt's request, in prompt order
        (:func:`pytest_eagle3.engine.recordings.prefill_records`); :meth:`ranks`
        gives the decode rows and every forward too.

        ``fault`` (self-tests only) makes one rank's recorder store a wrong copy:
        see :data:`pytest_eagle3.worker.recorder_hook.FAULTS`.

        Raises:
            Eagle3Error: a rank recorded nothing (the SGLang plugin is not loaded).
        """
        got = self.ranks(layer_ids, prompts=prompts, decode_steps=decode_steps, extra_args=extra_args,
                         fault=fault, draft=draft)
        return got.captures, got.prefill

    def ranks(self, layer_ids: Sequence[int] | None, *, prompts: Sequence[Sequence[int]] | None = None,
              decode_steps: int = 0, extra_args: Mapping[str, Any] | None = None,
              fault: Mapping[str, Any] | None = None, draft: str | None = None) -> "RankCaptures":
        """The captures of the suite prompts and what every TP rank captured for
        them, per forward mode (:class:`RankCaptures`); without a ``fault``, recorded
        once per engine, ids, prompts and decode steps in a session.

        Raises:
            Eagle3Error: a rank recorded nothing (the SGLang plugin is not loaded).
        """
        server = self._server(layer_ids, extra_args, draft)
        assert self.last_config is not None
        # One recording per engine, ids, prompts and decode steps: the per-rank tests that
        # read the same requests share it (greedy decoding on one engine is deterministic).
        key = ("ranks", self.last_config, tuple(layer_ids) if layer_ids is not None else None,
               tuple(map(tuple, self.prompts if prompts is None else prompts)), int(decode_steps))
        if fault is None and key in self.pool.results:
            return self.pool.results[key]
        got = self._ranks(server, layer_ids, prompts, decode_steps, fault)
        if fault is None:
            self.pool.results[key] = got
        return got

    def _ranks(self, server: Any, layer_ids: Sequence[int] | None, prompts: Sequence[Sequence[int]] | None,
               decode_steps: int, fault: Mapping[str, Any] | None) -> "RankCaptures":
        assert self.last_config is not None
        dp = attention_dp_size(dict(self.last_config.server_args))
        recorder = Recorder(self.pool.record_dir(self.last_config))
        self._flush(server)
        with recorder.recording(fault=fault):
            # Under attention DP one batch, which SGLang's DP controller spreads over the DP ranks.
            captures = capture(server, self.prompts if prompts is None else prompts, decode_steps=decode_steps,
                               batch=dp > 1)
            records = recorder.read(self.tp, even=dp == 1)
        self._prove_ids_switched(layer_ids)
        self._prove_standin_paths(server)
        # Only the test's own requests, in prompt order (a readiness probe's or
        # another client's forward never shifts them).
        rids = [c.rid for c in self._count_send(captures, dp > 1)]
        if dp == 1:
            return RankCaptures(captures, prefill_records(records, rids),
                                decode_records(records, rids) if decode_steps else {},
                                request_forwards(records, rids))
        # Attention DP: each rank holds the requests its DP rank served.
        served = served_requests(records, [str(r) for r in rids])
        mine = {rank: {rank: records[rank]} for rank in records}
        pick = {rank: [rids[i] for i in served[rank]] for rank in records}
        return RankCaptures(captures, {r: prefill_records(mine[r], pick[r])[r] for r in records},
                            {r: decode_records(mine[r], pick[r]).get(r, []) for r in records} if decode_steps else {},
                            request_forwards(records, rids), served)


def _decode_each(server: Any, prompts: Sequence[Sequence[int]],
                 max_new_tokens: Sequence[int]) -> "list[DraftPathCaptures]":
    """Greedy speculative decoding of each prompt alone, ``max_new_tokens[i]`` tokens."""
    out: "list[DraftPathCaptures]" = []
    for prompt, n in zip(prompts, max_new_tokens):
        out += capture_draft_path(server, [prompt], decode_steps=max(0, int(n) - 1))
    return out
