"""pytest_eagle3.worker.post_import: callbacks run once, right after a module executes."""

from __future__ import annotations

import sys

import pytest

from pytest_eagle3.worker import post_import


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("eagle3_postimport_")]:
        del sys.modules[name]


def test_callback_runs_after_the_module_executes(module_dir):
    (module_dir / "eagle3_postimport_a.py").write_text("VALUE = 1\n")
    seen = []
    post_import.when_imported("eagle3_postimport_a", lambda m: seen.append(m.VALUE))
    assert seen == []
    import eagle3_postimport_a  # noqa: F401

    assert seen == [1]
    import eagle3_postimport_a  # noqa: F401,F811  (a second import runs nothing)

    assert seen == [1]


def test_already_imported_module_runs_at_once(module_dir):
    (module_dir / "eagle3_postimport_b.py").write_text("VALUE = 2\n")
    import eagle3_postimport_b  # noqa: F401

    seen = []
    post_import.when_imported("eagle3_postimport_b", lambda m: seen.append(m.VALUE))
    assert seen == [2]


def test_callback_registered_by_a_callback_of_the_same_module_runs(module_dir):
    """The import hook loader registers fixes for the very module that triggered it
    (sglang.srt.server_args): they must run, not wait for an import that never comes."""
    (module_dir / "eagle3_postimport_c.py").write_text("VALUE = 3\n")
    seen = []

    def first(module):
        seen.append("first")
        post_import.when_imported("eagle3_postimport_c", lambda m: seen.append(("second", m.VALUE)))

    post_import.when_imported("eagle3_postimport_c", first)
    import eagle3_postimport_c  # noqa: F401

    assert seen == ["first", ("second", 3)]


def test_a_module_mid_import_that_cannot_be_hooked_is_an_error(module_dir):
    """A module whose import began before the hook existed cannot be hooked at its end:
    refusing is better than a fix that silently never runs."""
    (module_dir / "eagle3_postimport_e.py").write_text("import eagle3_postimport_f\n")
    (module_dir / "eagle3_postimport_f.py").write_text(
        "from pytest_eagle3.worker import post_import\n"
        "try:\n"
        "    post_import.when_imported('eagle3_postimport_e', lambda m: None)\n"
        "    OUTCOME = 'registered'\n"
        "except RuntimeError as exc:\n"
        "    OUTCOME = str(exc)\n")
    import eagle3_postimport_e  # noqa: F401
    import eagle3_postimport_f

    assert "cannot hook eagle3_postimport_e" in eagle3_postimport_f.OUTCOME
