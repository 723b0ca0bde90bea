"""The transformers reference on tiny-dsv3, and the separability that docs/design.md,
"Reduced-layer targets that can tell layers apart", relies on."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from pytest_eagle3.target import reference
from pytest_eagle3.verdicts import snapshots
from pytest_eagle3.target.checkpoint import ensure_checkpoint
from pytest_eagle3.target.reference import ReferenceFailed, ensure_reference
from pytest_eagle3.target.spec import TargetSpec, load_packaged_prompts

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

#: docs/design.md, "Reduced-layer targets that can tell layers apart": any two
#: snapshots of a prompt must differ by at least this relative L2.
MIN_SEPARATION = 0.4


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """tiny-dsv3 checkpoint (same session cache as test_checkpoint.py) and its reference."""
    spec = TargetSpec.preset("tiny-dsv3")
    ckpt = ensure_checkpoint(spec, tmp_path_factory.getbasetemp() / "eagle3-cache")
    prompts = load_packaged_prompts(vocab_size=spec.facts.vocab_size)
    start = time.perf_counter()
    refs = ensure_reference(ckpt, prompts)
    return {"spec": spec, "ckpt": ckpt, "prompts": prompts, "refs": refs,
            "seconds": time.perf_counter() - start}


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model.safetensors"))


def rel_l2(a, b) -> float:
    """``||a - b|| / ||b||`` in float64 (compare.py's rel.err)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def test_reference_shapes(tiny: dict, record_property) -> None:
    spec, refs, prompts = tiny["spec"], tiny["refs"], tiny["prompts"]
    record_property("reference_seconds", round(tiny["seconds"], 2))
    assert len(refs) == len(prompts)
    for ids, ref in zip(prompts, refs):
        assert ref.dtype == torch.float32
        assert tuple(ref.shape) == (spec.facts.num_layers + 2, len(ids), spec.facts.hidden_size)
        assert torch.isfinite(ref).all()


def test_hs0_is_the_embedding(tiny: dict) -> None:
    embed = _weights(tiny["ckpt"])["model.embed_tokens.weight"]
    for ids, ref in zip(tiny["prompts"], tiny["refs"]):
        assert torch.equal(ref[0], embed[torch.tensor(ids)])


def test_hs_l_is_final_norm_of_final_prenorm(tiny: dict) -> None:
    spec = tiny["spec"]
    L, eps = spec.facts.num_layers, spec.config["rms_norm_eps"]
    weight = _weights(tiny["ckpt"])["model.norm.weight"]
    for ref in tiny["refs"]:
        pre = ref[snapshots.prenorm_index(L)]
        normed = pre * torch.rsqrt(pre.pow(2).mean(-1, keepdim=True) + eps) * weight
        assert rel_l2(normed, ref[L]) < 1e-5


def test_snapshots_are_pairwise_separable(tiny: dict, record_property) -> None:
    spec = tiny["spec"]
    L = spec.facts.num_layers
    worst = (float("inf"), "")
    for ids, ref in zip(tiny["prompts"], tiny["refs"]):
        for i, j in itertools.permutations(range(L + 2), 2):
            err = rel_l2(ref[i], ref[j])
            if err < worst[0]:
                worst = (err, f"{snapshots.label(i, L)} vs {snapshots.label(j, L)}, {len(ids)} tokens")
    record_property("min_pairwise_rel_l2", round(worst[0], 4))
    record_property("min_pairwise_pair", worst[1])
    assert worst[0] >= MIN_SEPARATION, worst


def test_reference_matches_the_builders_own_forward(tiny: dict) -> None:
    """An independent fp32 MLA/MoE/yarn implementation agrees with transformers."""
    from pytest_eagle3.target.checkpoint.dsv3_config import Dims
    from pytest_eagle3.target.checkpoint.dsv3_forward import forward_hidden_states

    sd = _weights(tiny["ckpt"])
    dims = Dims.from_config(tiny["spec"].config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: OpenMP on shared cores is 50x slower
    try:
        with torch.no_grad():
            mine = [forward_hidden_states(sd, dims, torch.tensor([ids])) for ids in tiny["prompts"]]
    finally:
        torch.set_num_threads(threads)
    for ids, ref, snaps in zip(tiny["prompts"], tiny["refs"], mine):
        for k, snap in enumerate(snaps):
            assert rel_l2(snap[0], ref[k]) < 1e-4, (len(ids), snapshots.full_label(k, dims.layers))


def test_reference_is_cached(tiny: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_worker(*args, **kwargs):
        raise AssertionError("the worker ran again")

    monkeypatch.setattr(reference, "_run_worker", no_worker)
    again = ensure_reference(tiny["ckpt"], tiny["prompts"])
    assert all(torch.equal(a, b) for a, b in zip(again, tiny["refs"]))
    path = reference.reference_path(tiny["ckpt"], tiny["prompts"])
    assert path.is_file() and path.parent == tiny["ckpt"] / reference.REFERENCE_SUBDIR
    other = reference.reference_path(tiny["ckpt"], tiny["prompts"][:1])
    assert other != path


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="dtype"):
        ensure_reference(Path("."), [[1]], dtype="int8")
    with pytest.raises(ValueError, match="non-empty"):
        ensure_reference(Path("."), [[]])


def test_worker_failure_quotes_its_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "hidden_size": "x"}))
    with pytest.raises(ReferenceFailed) as info:
        ensure_reference(broken, [[1, 2, 3]], cache_dir=tmp_path / "refs")
    msg = str(info.value)
    assert msg.startswith(f"transformers reference failed (exit status 1) for {broken}")
    assert "Traceback" in msg or "Error" in msg
    assert not list((tmp_path / "refs").glob("*.safetensors"))


def test_killed_workers_leftovers_go_with_the_next_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker killed mid-write (SIGKILL of pytest) leaves ``.<name>.tmp-*`` files;
    the next build of that entry, holding its lock, removes them."""
    path = reference.reference_path(tmp_path, [[1, 2, 3]], cache_dir=tmp_path / "refs")
    path.parent.mkdir(parents=True)
    stale = [path.with_name(f".{path.name}.tmp-99999-deadbeef"),
             path.with_name(f".{path.name}.tmp-99999-deadbeef.prompts.json")]
    for p in stale:
        p.write_text("half")
    other = path.with_name(".other.safetensors.tmp-1-x")  # another entry's: not ours to remove
    other.write_text("half")

    def worker(checkpoint_dir, prompts, dtype, out, log, timeout_s, extra=None):
        assert not any(p.exists() for p in stale), "leftovers still there when the worker ran"
        raise ReferenceFailed("stop here")

    monkeypatch.setattr(reference, "_run_worker", worker)
    with pytest.raises(ReferenceFailed, match="stop here"):
        ensure_reference(tmp_path, [[1, 2, 3]], cache_dir=tmp_path / "refs")
    assert other.exists()
