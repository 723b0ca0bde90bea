"""Exceptions raised by pytest-eagle3.

Every message is one line that says what went wrong and what to do about it;
the plugin turns :class:`Eagle3ConfigError` into ``pytest.UsageError`` or a
setup error without a traceback into the library.
"""

from __future__ import annotations


class Eagle3Error(Exception):
    """Base class of every error pytest-eagle3 raises on purpose."""


class Eagle3ConfigError(Eagle3Error):
    """The run is misconfigured: unknown preset, bad path, unwritable cache, ..."""


class Eagle3EngineError(Eagle3Error):
    """SGLang failed to start, exited, or a request to it failed (message has the log tail).

    ``cause``: for a failed start, the first exception of the engine's log and the
    deepest SGLang frame it came through (``"TypeError: ... (sglang/srt/x.py:12)"``);
    ``None`` when the log holds no complete traceback or the error is not a start.
    """

    def __init__(self, message: str = "", *, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class Eagle3StartCauseSeen(Eagle3EngineError):
    """An engine configuration failed to start (or was not started) for a cause an
    earlier configuration of this run already reported in full: the message is one
    line naming that cause and the test that shows it with the log tail."""


class Eagle3SGLangMissing(Eagle3ConfigError):
    """SGLang is not installed in this environment or fails to import."""


class Eagle3ContractError(Eagle3ConfigError):
    """A training contract or draft checkpoint is invalid: unknown stack, ids out of
    range or duplicated, an ``fc`` width that disagrees with the ids, a bad human form."""
