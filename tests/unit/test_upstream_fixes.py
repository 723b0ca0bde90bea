"""worker/upstream_fixes.py without an engine: the switch and the Gemma 3 fix's arithmetic.

On the real engine: ``tests/e2e/test_family_suites.py::test_gemma3_passes_with_the_upstream_fix_applied``.
"""

from __future__ import annotations

import pytest

from pytest_eagle3.worker import upstream_fixes
from pytest_eagle3.worker.upstream_fixes import CATALOG, FIX_ENV, UpstreamFixError, read_fix


def test_off_unless_named() -> None:
    assert read_fix({}) is None and read_fix({FIX_ENV: " "}) is None
    assert read_fix({FIX_ENV: "gemma3-capture-residual"}) == "gemma3-capture-residual"
    with pytest.raises(UpstreamFixError, match="unknown fix; known: gemma3-capture-residual"):
        read_fix({FIX_ENV: "nope"})
    assert all("PR #" in source or "PRs" in source or "issue #" in source for _, source in CATALOG.values())


def test_header_and_report_name_the_fix_the_engines_inherit(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_eagle3.plugin import header, report

    monkeypatch.delenv(FIX_ENV, raising=False)
    assert header._fix_line() is None and report._upstream_fix() is None
    monkeypatch.setenv(FIX_ENV, "gemma3-capture-residual")
    line = header._fix_line()
    assert line is not None and line.startswith(
        "eagle3: UPSTREAM FIX ON (PYTEST_EAGLE3_UPSTREAM_FIX=gemma3-capture-residual; every engine runs it")
    assert line.endswith("[SGLang PR #39286 (Gemma 3 captures omit the residual)]")
    assert report._upstream_fix() == "gemma3-capture-residual"
    monkeypatch.setenv(FIX_ENV, "nope")
    assert header._fix_line() == "eagle3: PYTEST_EAGLE3_UPSTREAM_FIX='nope': unknown fix; known: " + ", ".join(CATALOG)


def test_gemma3_fix_captures_the_stream_and_keeps_the_forward() -> None:
    """A layer returning (branch, residual) returns (branch + residual, 0); the
    next norm's ``x + residual`` is unchanged, and the input it got is a copy."""
    torch = pytest.importorskip("torch")
    seen = {}

    def layer_forward(layer, *, hidden_states, residual, **kwargs):
        seen["input"] = hidden_states
        if residual is None:
            residual = hidden_states
        branch = hidden_states * 2.0
        return branch, residual + 1.0

    h, r = torch.randn(3, 4), torch.randn(3, 4)
    out, res = upstream_fixes._around_gemma3_layer(layer_forward, None, hidden_states=h, residual=r)
    given = seen["input"]
    branch, residual = layer_forward(None, hidden_states=h, residual=r)
    assert torch.equal(out, branch + residual) and torch.equal(res, torch.zeros_like(residual))
    assert torch.equal(out + res, branch + residual)  # what the next layer's fused add forms
    assert given is not h and torch.equal(given, h)
