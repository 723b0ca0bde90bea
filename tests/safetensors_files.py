"""Hand-written safetensors files for draft fixtures (no torch needed)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def write_safetensors(file: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A valid safetensors file of zero-filled tensors ``{name: (dtype, shape)}``."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = _DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
