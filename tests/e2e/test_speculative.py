"""End to end on CPU: EAGLE-3 speculative decoding in the real SGLang, captures through the draft path.

Per TP size (1; ``PYTEST_EAGLE3_SPEC_TP=1,2`` adds 2), engines run one at a time:

* ``capture-only``: no draft, ``--enable-return-aux-hidden-states`` with the
  draft's own ids: the plain greedy baseline (no speculation) and the
  capture-only captures;
* ``accepted``: EAGLE-3 with a draft SGLang accepts (the packaged synthetic
  draft, or a quick memorising one built once per cache; see
  ``tests/draft_files.py``), loaded through ``--speculative-draft-model-path``
  with ``--enable-return-hidden-states``;
* ``random`` (TP 1 only): EAGLE-3 with a random-weights draft (almost nothing
  accepted).

The draft path must give the same tokens as greedy decoding, report its
speculative metrics, and return the same aux hidden states as the capture-only
API and the transformers reference.  About 6-8 minutes on 2 shared cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_eagle3.capture.api import capture, capture_server_args
from pytest_eagle3.capture.draft_path import (
    DraftPathCaptures,
    capture_draft_path,
    draft_path_server_args,
)
from pytest_eagle3.capture.spec_metrics import aggregate
from pytest_eagle3.verdicts.paths import compare_captures
from pytest_eagle3.contracts.draft import eagle_config_ids, read_draft_config
from pytest_eagle3.engine.config import build_engine_config
from pytest_eagle3.sglang_source.install import probe
from pytest_eagle3.engine.server import SGLangServer
from pytest_eagle3.settings import default_cache_dir
from pytest_eagle3.target.checkpoint import ensure_checkpoint
from pytest_eagle3.target.spec import TargetSpec, load_packaged_prompts
from tests.draft_files import draft_prompts, shipped_or_memorised_draft, write_draft

pytestmark = pytest.mark.e2e

#: Generated tokens per request (decode rows = NEW_TOKENS - 1).
NEW_TOKENS = 16
STEPS, TOPK, DRAFT_TOKENS = 3, 1, 4
STARTUP_TIMEOUT_S = 600
MAX_PROMPTS = 3


@dataclass
class EngineRun:
    """What one engine answered for the prompts."""

    name: str
    startup_s: float
    results: list[Any]  # Captures (capture-only) or DraftPathCaptures


@dataclass
class TpRuns:
    tp: int
    prompts: list[list[int]]
    ids: list[int] | None
    continuations: list[list[int]] | None
    runs: dict[str, EngineRun] = field(default_factory=dict)


@pytest.fixture(scope="module")
def cache_root() -> Path:
    root = os.environ.get("PYTEST_EAGLE3_CACHE") or str(default_cache_dir()[0])
    return Path(root)


@pytest.fixture(scope="module")
def install(cache_root: Path):
    return probe(cache_root)


@pytest.fixture(scope="module")
def target(cache_root: Path) -> Path:
    return ensure_checkpoint(TargetSpec.preset("tiny-dsv3"), cache_root)


@pytest.fixture(scope="module")
def drafts(cache_root: Path, target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | None]:
    import json
    import time

    t0 = time.monotonic()
    accepted = shipped_or_memorised_draft(cache_root)
    print(f"accepted draft {accepted} ready in {time.monotonic() - t0:.1f} s")
    ids = eagle_config_ids(read_draft_config(accepted)) if accepted is not None else [0, 3, 6]
    cfg = json.loads((target / "config.json").read_text())
    random = write_draft(tmp_path_factory.mktemp("random-draft"), cfg, ids, seed=1)
    return {"accepted": accepted, "random": random}


def _start(install, target: Path, tp: int, name: str, test_args: dict[str, Any], log_dir: Path) -> SGLangServer:
    cfg = build_engine_config(install, model_path=str(target), tp=tp, device="cpu", test_args=test_args)
    server = SGLangServer(f"{name}-{cfg.name}", cfg.args(), env=cfg.env_dict(), log_dir=log_dir,
                          startup_timeout=STARTUP_TIMEOUT_S)
    return server.start()


#: TP sizes of this file's engines.  TP 2 (speculative output = greedy, the
#: draft path's captures) is covered by the packaged suite in the main job
#: (test_acceptance at --tp 2, tests/e2e/test_suite_on_cpu.py); PYTEST_EAGLE3_SPEC_TP=1,2 adds it here.
SPEC_TPS = [int(x) for x in os.environ.get("PYTEST_EAGLE3_SPEC_TP", "1").split(",")]


@pytest.fixture(scope="module", params=SPEC_TPS, ids=lambda tp: f"tp{tp}")
def tp_runs(request, install, target: Path, drafts, tmp_path_factory) -> TpRuns:
    tp = request.param
    log_dir = tmp_path_factory.mktemp(f"spec-tp{tp}")
    accepted = drafts["accepted"]
    learned = draft_prompts(accepted) if accepted is not None else None
    # Prompts whose learnt continuation covers every generated token, at most MAX_PROMPTS.
    learned = [e for e in learned or [] if len(e["continuation"]) >= NEW_TOKENS][:MAX_PROMPTS]
    if learned:
        prompts = [e["prompt"] for e in learned]
        continuations = [e["continuation"] for e in learned]
    else:
        prompts, continuations = load_packaged_prompts()[:3], None
    ids = eagle_config_ids(read_draft_config(accepted if accepted is not None else drafts["random"]))
    out = TpRuns(tp=tp, prompts=prompts, ids=ids, continuations=continuations)

    server = _start(install, target, tp, "capture-only", capture_server_args(install, ids), log_dir)
    try:
        out.runs["capture-only"] = EngineRun("capture-only", server.startup_seconds or 0.0,
                                             capture(server, prompts, decode_steps=NEW_TOKENS - 1))
    finally:
        server.stop()
    kinds = ["accepted", "random"] if tp == 1 else ["accepted"]
    for kind in kinds:
        draft = drafts[kind]
        if draft is None:
            continue
        args = draft_path_server_args(install, draft, steps=STEPS, topk=TOPK, num_draft_tokens=DRAFT_TOKENS)
        server = _start(install, target, tp, f"eagle3-{kind}", args, log_dir)
        try:
            out.runs[kind] = EngineRun(kind, server.startup_seconds or 0.0,
                                       capture_draft_path(server, prompts, decode_steps=NEW_TOKENS - 1))
        finally:
            server.stop()
    for run in out.runs.values():
        print(f"[tp{tp}] engine {run.name} started in {run.startup_s:.1f} s")
    return out


def _spec(runs: TpRuns, kind: str) -> list[DraftPathCaptures]:
    if kind not in runs.runs:
        pytest.skip(f"no {kind} draft available (needs pytest_eagle3.draft or fixtures/drafts/tiny-dsv3)")
    return runs.runs[kind].results


@pytest.mark.parametrize("kind", ["accepted", "random"])
def test_speculative_output_equals_greedy(tp_runs: TpRuns, kind: str) -> None:
    if kind == "random" and tp_runs.tp != 1:
        pytest.skip("the random draft runs at TP 1 only")
    spec = _spec(tp_runs, kind)
    greedy = tp_runs.runs["capture-only"].results
    for i, (s, g) in enumerate(zip(spec, greedy)):
        assert len(s.output_ids) == NEW_TOKENS
        assert s.output_ids == g.output_ids, f"prompt {i}: speculative {s.output_ids} != greedy {g.output_ids}"
        if tp_runs.continuations:
            n = min(NEW_TOKENS, len(tp_runs.continuations[i]))
            assert s.output_ids[:n] == tp_runs.continuations[i][:n], f"prompt {i}: not the reference's greedy tokens"


def test_metrics_read_and_accepted_draft_is_accepted(tp_runs: TpRuns) -> None:
    spec = _spec(tp_runs, "accepted")
    for s in spec:
        m = s.metrics
        assert m.completion_tokens == NEW_TOKENS and m.verify_count > 0
        assert m.accept_length == pytest.approx(m.completion_tokens / m.verify_count)
        assert m.proposed_drafts in (None, m.verify_count * STEPS)
    total = aggregate([s.metrics for s in spec])
    print(f"[tp{tp_runs.tp}] accepted draft: {total.describe()}")
    # 16 tokens: the prefill's, then 4 verify forwards of 4 (the last one cut to 3).
    assert total.accept_length >= 3.5, total.describe()
    assert total.accept_rate is not None and total.accept_rate >= 0.9, total.describe()


def test_random_draft_metrics(tp_runs: TpRuns) -> None:
    if tp_runs.tp != 1:
        pytest.skip("the random draft runs at TP 1 only")
    spec = _spec(tp_runs, "random")
    total = aggregate([s.metrics for s in spec])
    print(f"[tp{tp_runs.tp}] random draft: {total.describe()}")
    assert 1.0 <= total.accept_length < 1.5, total.describe()


@pytest.mark.parametrize("kind", ["accepted", "random"])
def test_draft_path_rows_equal_capture_only(tp_runs: TpRuns, kind: str) -> None:
    if kind == "random" and tp_runs.tp != 1:
        pytest.skip("the random draft runs at TP 1 only")
    spec = _spec(tp_runs, kind)
    only = tp_runs.runs["capture-only"].results
    for i, (s, c) in enumerate(zip(spec, only)):
        cap = s.captures
        assert cap.prefill.shape[0] == len(tp_runs.prompts[i])
        assert cap.decode.shape[0] == NEW_TOKENS - 1
        agreement = compare_captures(cap, c)
        print(f"[tp{tp_runs.tp}] {kind} prompt {i}: {agreement.describe()}")
        assert agreement.ok(rel_tol=1e-4), agreement.describe()


def test_draft_path_equals_reference(tp_runs: TpRuns, install, target: Path) -> None:
    import json

    import torch

    from pytest_eagle3.target.reference import ensure_reference
    from pytest_eagle3.suite.outcome import fail_if_bad
    from pytest_eagle3.verdicts.compare import compare_slots
    from pytest_eagle3.conventions import predict

    spec = _spec(tp_runs, "accepted")
    cfg = json.loads((target / "config.json").read_text())
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    expected = list(predict(tp_runs.ids, L, install.id_rule()).snapshots)
    seqs = [list(p) + s.output_ids[: NEW_TOKENS - 1] for p, s in zip(tp_runs.prompts, spec)]
    refs = ensure_reference(target, seqs)
    for s, ref in zip(spec, refs):
        rows = torch.cat([s.captures.prefill, s.captures.decode])
        fail_if_bad(compare_slots(rows, ref, expected=expected, num_layers=L, hidden_size=H, tol=1e-3))
