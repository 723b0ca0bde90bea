"""A recorded fact about a stack, and whether a given copy of the stack still holds it.

A :class:`Fact` is what one of the project's contracts relies on (vLLM's
default aux layer ids, the config keys its runner reads, where it captures),
with the file, the function and the lines it was read from in the release the
project models.  :func:`check` reads the same place in another copy of the stack
(:mod:`.files`) and says whether the fact holds, holds at other lines, matches an
older release's recorded behaviour, or has changed: then it names the file:line
it expected and what it found there.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_eagle3.stack_source.files import StackFiles
from pytest_eagle3.stack_source.readers import Found, Reader, read

HOLDS = "holds"
MOVED = "moved"
OLDER = "older"
CHANGED = "changed"
#: Statuses that mean the project's recorded fact no longer describes this copy.
BROKEN = (CHANGED,)


@dataclass(frozen=True)
class Older:
    """An older release's recorded behaviour at the same place.

    Attributes:
        version: the release it was read from (``"0.33.0"``).
        text: what the reader finds there.
        meaning: what the project does with it (the code that models it).
    """

    version: str
    text: str
    meaning: str


@dataclass(frozen=True)
class Fact:
    """One fact a contract relies on.

    Attributes:
        stack: distribution name (``vllm``, ``speculators``, ``specforge``).
        name: what it is (``default aux layer ids``).
        file: path in the distribution (``vllm/model_executor/models/interfaces.py``).
        lines: the anchor's lines in ``version`` (``"1764-1785"``); ``""`` for a file or metadata fact.
        reader: how to read it (:mod:`.readers`); ``None`` for a fact about the file's presence
            (``text`` is ``"present"`` or ``"absent"``) or, with ``file`` ``"METADATA"``, a requirement.
        text: what the reader finds in ``version``.
        version: the release it was read from.
        relied_on_by: the project code that records it.
        older: older releases' behaviour at the same place, modelled by the project.
    """

    stack: str
    name: str
    file: str
    lines: str
    reader: Reader | None
    text: str
    version: str
    relied_on_by: str
    older: tuple[Older, ...] = ()

    @property
    def cited(self) -> str:
        """``file:lines`` (or ``file``) as the project cites it."""
        return f"{self.file}:{self.lines}" if self.lines else self.file


@dataclass(frozen=True)
class Reading:
    """A fact checked against one copy of its stack.

    Attributes:
        fact: the fact.
        status: :data:`HOLDS`, :data:`MOVED` (holds at other lines), :data:`OLDER`
            (matches an older release's recorded behaviour), :data:`CHANGED`.
        found: what the reader found (``None``: the file or its anchor is gone).
        where: ``file:lines`` where it was found (the cited file when it was not).
        older: the older release it matches (status :data:`OLDER`).
    """

    fact: Fact
    status: str
    found: Found | None
    where: str
    older: Older | None = None

    @property
    def broken(self) -> bool:
        return self.status in BROKEN

    def describe(self) -> str:
        """One line: the fact, and for a changed one the expected place and text and what was found."""
        f = self.fact
        if self.status == HOLDS:
            return f"holds: {f.name}: {f.text} ({self.where})"
        if self.status == MOVED:
            return f"holds at other lines: {f.name}: {f.text} ({self.where}; {f.version} had it at {f.lines})"
        if self.status == OLDER and self.older is not None:
            return (f"older behaviour: {f.name}: {self.older.text} ({self.where}), as in {f.stack} "
                    f"{self.older.version}: {self.older.meaning}")
        found = "nothing: the file or its anchor is gone" if self.found is None else f"{self.found.text!r}"
        context = "" if self.found is None or not self.found.context else " [" + " | ".join(self.found.context) + "]"
        return (f"CHANGED: {f.name}: expected {f.text!r} at {f.cited} ({f.stack} {f.version}; "
                f"relied on by {f.relied_on_by}); found {found} at {self.where}{context}")


def _find(fact: Fact, files: StackFiles) -> Found | None:
    if fact.file == "METADATA":
        prefix = fact.text.split("=")[0].split("<")[0].split(">")[0].strip()
        pins = [r.split(";")[0].replace(" ", "") for r in files.requires
                if r.split(";")[0].strip().lower().startswith(prefix.lower())]
        return Found(pins[0] if pins else f"no requirement on {prefix}")
    source = files.text(fact.file)
    if fact.reader is None:
        return Found("present" if source is not None else "absent")
    if source is None:
        return None
    try:
        return read(source, fact.reader)
    except SyntaxError as exc:
        return Found(f"a file Python cannot parse ({exc.msg}, line {exc.lineno})")


def check(fact: Fact, files: StackFiles) -> Reading:
    """Read ``fact``'s place in ``files`` and compare (see :class:`Reading`)."""
    found = _find(fact, files)
    where = fact.file if found is None or not found.lines else f"{fact.file}:{found.lines}"
    if found is not None and found.text == fact.text:
        moved = bool(fact.lines) and found.lines != fact.lines
        return Reading(fact, MOVED if moved else HOLDS, found, where)
    for older in fact.older:
        if found is not None and found.text == older.text:
            return Reading(fact, OLDER, found, where, older)
    return Reading(fact, CHANGED, found, where)
