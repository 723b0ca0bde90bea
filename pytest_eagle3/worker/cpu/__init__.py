"""The CPU tier's code inside SGLang's processes: the fills (:mod:`.fills`) and
the stand-in ``sgl_kernel`` package in ``shim/``."""

from pathlib import Path

#: Directory holding the stand-in ``sgl_kernel`` package (put on the engine's ``PYTHONPATH``).
SHIM_DIR = Path(__file__).with_name("shim")
