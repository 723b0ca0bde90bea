"""The ``fc`` weight of an EAGLE-3 draft, read from its safetensors headers without loading weights.

A safetensors file starts with an 8-byte little-endian length, then that many bytes
of JSON naming every tensor's dtype, shape and offsets; it is parsed here without
torch or the safetensors package.

The ``fc`` tensor is ``fc.weight`` in SpecForge (``LlamaForCausalLMEagle3.fc``),
speculators (``Eagle3DraftModel.fc``) and EAGLE (``cnets.Model.fc``); ``model.fc.weight``
and a single ``*.fc.weight`` are accepted too.  Its shape is ``[hidden, K * target_hidden]``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from pytest_eagle3.errors import Eagle3ContractError

#: Tensor names tried first for the fc projection.
FC_NAMES = ("fc.weight", "model.fc.weight")
#: A header larger than this is not a safetensors file we should read.
MAX_HEADER_BYTES = 100 * 1024 * 1024

# Message templates (tests import these).
BAD_SAFETENSORS_MSG = "{file} is not a readable safetensors file: {error}"
NO_FC_MSG = (
    "no fc weight in {files}: looked for {names} or one '*.fc.weight'; "
    "is this an EAGLE-3 draft?"
)
MANY_FC_MSG = "several fc weights in {files}: {names}; cannot tell which is the aux projection"


def read_safetensors_header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: ``{name: {"dtype", "shape", "data_offsets"}, ...}``.

    Raises:
        Eagle3ContractError: truncated file, absurd length, header not a JSON object.
    """
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError("shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise ValueError(f"header length {n} bytes is not plausible")
            raw = f.read(n)
            if len(raw) != n:
                raise ValueError(f"header says {n} bytes, file has {len(raw)}")
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise Eagle3ContractError(BAD_SAFETENSORS_MSG.format(file=file, error=exc)) from None
    return header


def find_fc(path: Path) -> tuple[str, tuple[int, ...], str, str] | str:
    """(name, shape, dtype, file) of the fc weight, or a note saying why there is none."""
    index = path / "model.safetensors.index.json"
    files = sorted(path.glob("*.safetensors"))
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise Eagle3ContractError(BAD_SAFETENSORS_MSG.format(file=index, error=exc)) from None
        listed = sorted({path / f for f in weight_map.values()})
        files = listed or files
    if not files:
        bins = sorted(p.name for p in path.glob("*.bin"))
        if bins:
            return f"the draft has only {', '.join(bins)} (pickle; not read without torch)"
        return "the draft directory has no weight files"
    found: dict[str, tuple[tuple[int, ...], str, str]] = {}
    for file in files:
        header = read_safetensors_header(file)
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            if name in FC_NAMES or name.endswith(".fc.weight"):
                found[name] = (tuple(info.get("shape", ())), str(info.get("dtype")), file.name)
    names = [n for n in FC_NAMES if n in found] or sorted(found)
    shown = ", ".join(f.name for f in files)
    if not names:
        raise Eagle3ContractError(NO_FC_MSG.format(files=shown, names=" or ".join(FC_NAMES)))
    if len(names) > 1 and not any(n in FC_NAMES for n in names):
        raise Eagle3ContractError(MANY_FC_MSG.format(files=shown, names=", ".join(names)))
    name = names[0]
    shape, dtype, file_name = found[name]
    return name, shape, dtype, file_name

