"""Reading an SGLang server's log: its tail, and the first real error of a failed start."""

from __future__ import annotations

import os
import re
from pathlib import Path

#: Lines of SGLang's log quoted in startup and request errors.
LOG_TAIL_LINES = 60

#: The first real error of a failed start, on the message's first line.
STARTUP_CAUSE = ": {error} ({where})"
STARTUP_CAUSE_NO_FRAME = ": {error}"

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
_TRACEBACK = "Traceback (most recent call last):"


def _package_frame(path: str, line: str, package: str) -> str | None:
    """``sglang/srt/x.py:12`` when ``path`` is a file of the installed ``package``."""
    path = path.replace("\\", "/")
    marker = f"/{package}/"
    if marker not in path:
        return None
    inside = path.rsplit(marker, 1)[1]
    if "site-packages/" in inside or "/." in "/" + inside:
        return None  # e.g. a virtualenv inside a folder named sglang
    return f"{package}/{inside}:{line}"


def first_error(text: str, *, package: str = "sglang") -> tuple[str, str | None] | None:
    """The first Python exception in a log: ``("RuntimeError: message", "sglang/srt/x.py:100")``.

    The location is the deepest frame of that traceback inside ``package`` (where
    SGLang's own code called what failed), ``None`` when no frame is.  A
    traceback may follow a log prefix on its line (SGLang's scheduler logs
    ``"... Scheduler hit an exception: Traceback (most recent call last):"``).
    A log without a complete traceback gives ``None``.
    """
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if _TRACEBACK not in line:
            continue
        where = None
        for follow in lines[start + 1:]:
            frame = _FRAME.match(follow)
            if frame:
                where = _package_frame(frame.group("file"), frame.group("line"), package) or where
                continue
            if follow.startswith((" ", "\t")) or not follow.strip():
                continue  # a source line or a caret line of the frame above
            if _TRACEBACK in follow:
                break  # a new traceback began before this one ended
            found = _EXCEPTION.match(follow.strip())
            if not found:
                break  # a log line: this traceback was cut off
            msg = (found.group("msg") or "").strip()
            error = found.group("type").rsplit(".", 1)[-1] + (f": {msg}" if msg else "")
            return (error if len(error) <= 300 else error[:297] + "..."), where
    return None


#: What a scheduler process logs before the exception that ends it (``srt/managers/scheduler.py``
#: ``run_scheduler_process``, 0.5.x): the root cause, where the launcher's own follow-up errors
#: (its warm-up request to a server that is going down) may be logged first.
SCHEDULER_EXCEPTION = "Scheduler hit an exception"


def start_log(path: Path, offset: int = 0) -> str:
    """The log from ``offset`` (where one start's output begins) on; ``""`` when unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def startup_cause(path: Path, offset: int = 0) -> str:
    """``": RuntimeError: ... (sglang/srt/x.py:100)"`` for :data:`STARTUP_FAILED`, or ``""``;
    reads the log from ``offset`` (where this start's output begins), from the first
    :data:`SCHEDULER_EXCEPTION` on where a scheduler logged one."""
    text = start_log(path, offset)
    at = text.find(SCHEDULER_EXCEPTION)
    found = (first_error(text[text.rfind("\n", 0, at) + 1:]) if at >= 0 else None) or first_error(text)
    if found is None:
        return ""
    error, where = found
    return (STARTUP_CAUSE.format(error=error, where=where) if where
            else STARTUP_CAUSE_NO_FRAME.format(error=error))


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
