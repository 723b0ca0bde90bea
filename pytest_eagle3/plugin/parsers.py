"""The ``type=`` parsers of the ``eagle3`` options and their messages.

Each parser raises :class:`pytest.UsageError`, so pytest prints one line naming
the flag and the accepted form instead of an argparse traceback.  Nothing here
imports torch, transformers or sglang.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pytest_eagle3.settings import DEVICE_CHOICES, TP_CHOICES

# Messages (tests import these).
MSG_BAD_TP = "--eagle3-tp/--tp: expected one of {choices} (tensor-parallel ranks), got {value!r}"
MSG_BAD_PP = "--eagle3-pp/--pp: expected a pipeline-parallel size of at least 1, got {value!r}"
MSG_BAD_DEVICE = "--eagle3-device/--device: expected one of {choices}, got {value!r}"
MSG_BAD_SGLANG_ARG = (
    "--sglang-arg: expected KEY=VALUE (VALUE is JSON when it parses, else a string), got {value!r}"
)
MSG_BAD_TIMEOUT = "{flag}: expected a positive number of seconds, got {value!r}"
MSG_BAD_PLAN_GPUS = "--eagle3-plan-gpus: expected a positive number of GPUs, got {value!r}"
MSG_BAD_GATE = "{flag}: expected {what}, got {value!r}"


def parse_tp(value: str) -> int:
    """``--tp`` parser: one of :data:`~pytest_eagle3.settings.TP_CHOICES`."""
    try:
        tp = int(value)
    except ValueError:
        tp = -1
    if tp not in TP_CHOICES:
        raise pytest.UsageError(MSG_BAD_TP.format(choices=join(TP_CHOICES), value=value))
    return tp


def parse_pp(value: str) -> int:
    """``--pp`` parser: an int >= 1."""
    try:
        pp = int(value)
    except ValueError:
        pp = 0
    if pp < 1:
        raise pytest.UsageError(MSG_BAD_PP.format(value=value))
    return pp


def parse_device(value: str) -> str | None:
    """``--device`` parser: ``cpu`` or ``cuda``; ``auto`` (the default) -> ``None``."""
    device = value.strip().lower()
    if device == "auto":
        return None
    if device not in DEVICE_CHOICES:
        raise pytest.UsageError(MSG_BAD_DEVICE.format(choices="|".join((*DEVICE_CHOICES, "auto")), value=value))
    return device


def parse_sglang_arg(value: str, *, flag: str = "--sglang-arg") -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(key, value)``; dashes in KEY become underscores
    (``disable-cuda-graph=true`` -> ``("disable_cuda_graph", True)``).

    VALUE is decoded as JSON when it parses (``true``, ``0.5``, ``[3, 31]``), else
    kept as the string.
    """
    key, sep, raw = value.partition("=")
    key = key.strip().lstrip("-").replace("-", "_")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key):
        msg = MSG_BAD_SGLANG_ARG.format(value=value)
        raise pytest.UsageError(msg.replace("--sglang-arg", flag, 1))
    try:
        decoded: Any = json.loads(raw)
    except ValueError:
        decoded = raw
    return key, decoded


def parse_timeout(value: str, *, flag: str = "--eagle3-startup-timeout") -> float:
    """Positive seconds."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise pytest.UsageError(MSG_BAD_TIMEOUT.format(flag=flag, value=value))
    return seconds


def parse_plan_gpus(value: str) -> int:
    """``--eagle3-plan-gpus`` parser: a positive integer."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise pytest.UsageError(MSG_BAD_PLAN_GPUS.format(value=value))
    return count


def parse_accept_length(value: str) -> float:
    """``--eagle3-min-accept-length``: a number >= 1 (tokens per verify; 1 = no draft token accepted)."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number >= 1.0 or number == float("inf"):
        raise pytest.UsageError(MSG_BAD_GATE.format(flag="--eagle3-min-accept-length",
                                                    what="a number of tokens >= 1 (e.g. 2.5)", value=value))
    return number


def parse_accept_rate(value: str) -> float:
    """``--eagle3-min-accept-rate``: a fraction in [0, 1]."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0.0 <= number <= 1.0:
        raise pytest.UsageError(MSG_BAD_GATE.format(flag="--eagle3-min-accept-rate",
                                                    what="a fraction between 0 and 1 (e.g. 0.6)", value=value))
    return number


def join(values: Any, last: str = "or") -> str:
    """``(1, 2, 4)`` -> ``"1, 2 or 4"`` (message text)."""
    items = [str(v) for v in values]
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {last} {items[-1]}"
