"""The proof line a stand-in op logs the first time a process calls it."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("pytest_eagle3.cpu")

#: ``{op}`` the op's name, ``{what}`` the model code it serves.
LINE = "pytest-eagle3 CPU stand-in: sgl_kernel {op} ({what}) in plain torch (pid {pid})"
_SEEN: set[str] = set()


def said(op: str, what: str) -> None:
    """Log :data:`LINE` for ``op`` once per process."""
    if op not in _SEEN:
        _SEEN.add(op)
        logger.warning(LINE.format(op=op, what=what, pid=os.getpid()))
