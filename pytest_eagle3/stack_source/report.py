"""Every recorded fact of a stack checked against one copy of it, and where the facts come from.

:func:`read_stack` checks a copy (:mod:`.files`); :func:`provenance` says, per
stack, whether its facts were read from the installed files here or are the
recorded constants of the release the project models.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_eagle3.stack_source.catalog import FACTS
from pytest_eagle3.stack_source.facts import OLDER, Reading, check
from pytest_eagle3.stack_source.files import StackFiles, StackFilesError, installed


@dataclass(frozen=True)
class StackReport:
    """A copy of a stack and its facts, checked.

    Attributes:
        files: the copy (name, version, origin).
        readings: one per recorded fact, in catalog order.
    """

    files: StackFiles
    readings: tuple[Reading, ...]

    @property
    def broken(self) -> tuple[Reading, ...]:
        """The facts that no longer hold (the project's record is out of date)."""
        return tuple(r for r in self.readings if r.broken)

    @property
    def older(self) -> tuple[Reading, ...]:
        return tuple(r for r in self.readings if r.status == OLDER)

    def headline(self) -> str:
        """``vllm 0.34.0 (wheel ...): 6 facts hold`` and the like."""
        f = self.files
        n = len(self.readings)
        if self.broken:
            verdict = f"{len(self.broken)} of {n} facts CHANGED"
        elif self.older:
            verdict = f"{n} facts read; {len(self.older)} as an older release the project models"
        else:
            verdict = f"all {n} facts hold"
        return f"{f.name} {f.version} ({f.origin}): {verdict}"

    def lines(self) -> list[str]:
        return [self.headline()] + [f"  {r.describe()}" for r in self.readings]


def read_stack(files: StackFiles) -> StackReport:
    """Check every fact recorded for ``files.name`` against ``files``.

    Raises:
        StackFilesError: the project records no facts for that distribution.
    """
    facts = FACTS.get(files.name)
    if facts is None:
        raise StackFilesError(f"{files.name} {files.version} ({files.origin}): no facts recorded for it; "
                              f"known stacks: {', '.join(FACTS)}")
    return StackReport(files, tuple(check(fact, files) for fact in facts))


def read_installed(name: str) -> StackReport | None:
    """:func:`read_stack` on the installed distribution ``name``; ``None`` when it is not installed."""
    files = installed(name)
    return None if files is None else read_stack(files)


def provenance(name: str) -> str:
    """One line for ``pytest-eagle3 info``: where ``name``'s facts come from here.

    Installed: read from its files (and how they compare); else the recorded
    constants, with the release and the file each was read from.
    """
    facts = FACTS[name]
    report = read_installed(name)
    if report is None:
        release = facts[0].version
        return (f"{name}: {len(facts)} facts are recorded constants, read from the {name} {release} wheel "
                f"({', '.join(sorted({f.file for f in facts}))}); not installed here "
                "(pytest-eagle3 stacks PATH checks a wheel)")
    text = f"{name}: read from the installed files: {report.headline()}"
    for reading in report.broken + report.older:
        text += f"\n  {reading.describe()}"
    return text
