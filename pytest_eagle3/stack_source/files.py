"""Where a training or serving stack's files are read from: an install, a wheel, a folder.

A stack (speculators, specforge, vllm) is read, never imported: its ``.py``
files come from the installed distribution (``importlib.metadata``), from a
downloaded wheel (``pip download --no-deps NAME==VERSION``: a ``.whl`` is a zip
archive, read in place without unpacking its hundreds of megabytes), or from a
folder holding an unpacked wheel or a source checkout.  Stdlib only.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Callable

from pytest_eagle3.errors import Eagle3Error

#: ``NAME-VERSION-...whl`` (PEP 427 file name).
_WHEEL_NAME = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)-")


class StackFilesError(Eagle3Error):
    """A path that is neither a wheel nor a folder holding a stack's files."""


@dataclass(frozen=True)
class StackFiles:
    """Read access to one stack's files.

    Attributes:
        name: the distribution name (``vllm``, ``speculators``, ``specforge``).
        version: its version (distribution metadata or the wheel's file name).
        origin: where the files are (``installed at ...``, ``wheel ...``, ``folder ...``).
        requires: the distribution's ``Requires-Dist`` lines (empty when unknown).
    """

    name: str
    version: str
    origin: str
    requires: tuple[str, ...] = ()
    _read: Callable[[str], "str | None"] = field(default=lambda _path: None, repr=False, compare=False)

    def text(self, path: str) -> str | None:
        """The text of ``path`` (``vllm/model_executor/...py``, relative to the
        distribution's root), or ``None`` when the stack has no such file."""
        return self._read(path)


def installed(name: str) -> StackFiles | None:
    """The installed distribution ``name``, or ``None`` when it is not installed."""
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        return None

    def read(path: str) -> str | None:
        file = Path(str(dist.locate_file(path)))
        return file.read_text(encoding="utf-8") if file.is_file() else None

    where = Path(str(dist.locate_file(""))).resolve()
    return StackFiles(dist.metadata["Name"].lower(), dist.version, f"installed at {where}",
                      tuple(dist.requires or ()), read)


def _metadata(text: str | None) -> tuple[str | None, str | None, tuple[str, ...]]:
    if not text:
        return None, None, ()
    msg = HeaderParser().parsestr(text)
    return msg.get("Name"), msg.get("Version"), tuple(msg.get_all("Requires-Dist") or ())


def wheel(path: Path) -> StackFiles:
    """A ``.whl`` file, read in place.

    Raises:
        StackFilesError: not a readable zip archive.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise StackFilesError(f"{path}: not a readable wheel ({exc})") from None
    names = set(archive.namelist())
    meta = next((n for n in names if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
    name, version, requires = _metadata(archive.read(meta).decode("utf-8") if meta else None)
    match = _WHEEL_NAME.match(path.name)
    name = name or (match.group("name") if match else path.stem)
    version = version or (match.group("version") if match else "unknown")

    def read(inner: str) -> str | None:
        return archive.read(inner).decode("utf-8") if inner in names else None

    return StackFiles(name.lower().replace("_", "-"), version, f"wheel {path}", requires, read)


def folder(path: Path) -> StackFiles:
    """A folder holding an unpacked wheel (its ``*.dist-info``) or a source checkout.

    Raises:
        StackFilesError: no ``*.dist-info/METADATA`` and no package folder to name it by.
    """
    metas = sorted(path.glob("*.dist-info/METADATA"))
    name, version, requires = _metadata(metas[0].read_text(encoding="utf-8") if metas else None)
    if name is None:
        packages = [p.name for p in path.iterdir() if (p / "__init__.py").is_file()]
        if len(packages) != 1:
            raise StackFilesError(f"{path}: no *.dist-info/METADATA and not one package folder "
                                  f"({', '.join(sorted(packages)) or 'none'}); name the wheel or its unpacked folder")
        name, version = packages[0], "unknown"

    def read(inner: str) -> str | None:
        file = path / inner
        return file.read_text(encoding="utf-8") if file.is_file() else None

    return StackFiles(name.lower().replace("_", "-"), version or "unknown", f"folder {path}", requires, read)


def open_path(path: str | Path) -> StackFiles:
    """A wheel or a folder, by what ``path`` is.

    Raises:
        StackFilesError: it does not exist or is neither.
    """
    p = Path(path)
    if p.is_dir():
        return folder(p)
    if p.is_file() and p.suffix == ".whl":
        return wheel(p)
    raise StackFilesError(f"{path}: not a .whl file or a folder")
