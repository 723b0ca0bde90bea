"""What one check of the packaged suite concludes: a :class:`Verdict` value.

A check (:mod:`.order`, :mod:`.contract`, :mod:`.embedding`, :mod:`.paths`,
:mod:`.acceptance`) takes the evidence a test gathered and returns a verdict
instead of failing the test itself: passed, failed, xfailed (a known
incompatibility of the installed SGLang) or skipped, with its message, or
*reported*: a comparison report (:class:`~pytest_eagle3.verdicts.compare.SlotReport`,
:class:`~pytest_eagle3.verdicts.embedding.EmbeddingReport`,
:class:`~pytest_eagle3.verdicts.rankcheck.RankReport`) that speaks for itself and
goes through the run's verdict hook.  The packaged test turns it into pytest's
outcome in one call (:func:`pytest_eagle3.suite.outcome.conclude`).  Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PASSED = "passed"
FAILED = "failed"
XFAILED = "xfailed"
SKIPPED = "skipped"
#: The comparison report decides (``report.ok``) and words the failure.
REPORTED = "reported"


@dataclass(frozen=True)
class Verdict:
    """One check's conclusion.

    Attributes:
        outcome: :data:`PASSED`, :data:`FAILED`, :data:`XFAILED`, :data:`SKIPPED`
            or :data:`REPORTED`.
        text: the failure, xfail or skip message (empty when passed or reported).
        report: the comparison report behind the verdict, if any (its
            ``diagnosis`` names the bug).
        cause: a line known before the engine ran that explains a failure of a
            reported verdict (it leads the message).
    """

    outcome: str = PASSED
    text: str = ""
    report: Any = None
    cause: str | None = None

    @classmethod
    def passed(cls, report: Any = None) -> "Verdict":
        return cls(PASSED, report=report)

    @classmethod
    def failed(cls, text: str, report: Any = None) -> "Verdict":
        return cls(FAILED, text, report)

    @classmethod
    def xfailed(cls, text: str, report: Any = None) -> "Verdict":
        return cls(XFAILED, text, report)

    @classmethod
    def skipped(cls, text: str, report: Any = None) -> "Verdict":
        return cls(SKIPPED, text, report)

    @classmethod
    def reported(cls, report: Any, cause: str | None = None) -> "Verdict":
        return cls(REPORTED, report=report, cause=cause)

    @property
    def ok(self) -> bool:
        """Nothing for the test to stop on: passed, or a report that is ok."""
        if self.outcome == REPORTED:
            return bool(self.report.ok)
        return self.outcome == PASSED

    @property
    def diagnosis(self) -> Any:
        """What the report behind the verdict diagnosed (``None`` without one)."""
        return getattr(self.report, "diagnosis", None)

    def message(self, verbose: bool = False) -> str:
        """The text a failing test shows (a reported verdict: the report's, after ``cause``)."""
        if self.outcome != REPORTED:
            return self.text
        message = self.report.message(verbose=verbose)
        return f"{self.cause}\n{message}" if self.cause else message
