"""The short spellings ``--tp``, ``--pp``, ``--device`` and ``--sglang-arg``: second names
of the ``--eagle3-*`` options, added only where no other option has them.

A project's own ``--device`` (a common ``parser.addoption`` in ML repositories)
wins; pytest-eagle3 keeps ``--eagle3-device`` and says so in the report header
(:class:`TakenSpelling`).  Nothing here imports torch, transformers or sglang.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest

from pytest_eagle3.plugin.options import SPELLED_OPTIONS

#: The short spellings pytest-eagle3 is known by -> the option each stands for.
SHORT_SPELLINGS: Mapping[str, str] = MappingProxyType({
    "--tp": "--eagle3-tp", "--pp": "--eagle3-pp", "--device": "--eagle3-device",
    "--sglang-arg": "--eagle3-sglang-arg",
})
HEADER_SPELLING_TAKEN = "eagle3: {short} belongs to {owner} here; pytest-eagle3's is {long}"
ANONYMOUS_OWNER = "custom options (a conftest's parser.addoption)"


def parser_groups(parser: pytest.Parser) -> list[tuple[str, Any]]:
    """``(title, group)`` of the parser's named option groups (pytest 8 keeps the
    title as ``description``, pytest 9 on the argparse group)."""
    named = []
    for group in parser._groups:
        if group is parser._anonymous:
            continue
        title = getattr(group, "description", None) or getattr(getattr(group, "_arggroup", None), "title", None)
        named.append((f"option group {title or group.name!r}", group))
    return named


@dataclass(frozen=True)
class TakenSpelling:
    """A short spelling another option already had when pytest-eagle3 looked.

    Attributes:
        short: e.g. ``"--device"``.
        long: pytest-eagle3's own name for it, e.g. ``"--eagle3-device"``.
        owner: the option group that holds it, e.g. ``"custom options"`` (a conftest's
            ``parser.addoption``) or another plugin's group title.
    """

    short: str
    long: str
    owner: str

    def header(self) -> str:
        return HEADER_SPELLING_TAKEN.format(short=self.short, owner=self.owner, long=self.long)


def add_short_spellings(parser: pytest.Parser) -> tuple[TakenSpelling, ...]:
    """Add ``--tp``, ``--pp``, ``--device`` and ``--sglang-arg`` as second names of the
    ``--eagle3-*`` options, each only where no other option has it yet.

    Called once the initial conftests are loaded (their ``pytest_addoption`` has
    run) and before pytest parses the command line for good, so a project's own
    ``--device`` wins and pytest-eagle3 keeps its ``--eagle3-device``.  Reads the
    parser's option groups (pytest's ``Parser._groups`` / ``_anonymous``, present
    in every pytest this plugin supports); when they cannot be read, nothing is
    added and the ``--eagle3-*`` names still work.

    Returns:
        the short spellings another option already had.
    """
    owners: dict[str, str] = {}
    try:
        groups = [(ANONYMOUS_OWNER, parser._anonymous), *parser_groups(parser)]
        for title, group in groups:
            for argument in group.options:
                for name in argument.names():
                    owners.setdefault(name, title)
        group = parser.getgroup("eagle3")
    except (AttributeError, TypeError):
        return ()
    taken = []
    for short, long in SHORT_SPELLINGS.items():
        if short in owners:
            taken.append(TakenSpelling(short, long, owners[short]))
            continue
        if long not in owners:
            continue  # pytest-eagle3's own option is not there (options not added)
        attrs = dict(SPELLED_OPTIONS[long], help=f"short for {long}, where no other option is called {short}")
        try:
            group.addoption(short, **attrs)
        except (argparse.ArgumentError, ValueError):
            # Known to argparse but not to pytest's groups (added some other way).
            taken.append(TakenSpelling(short, long, "another option"))
    return tuple(taken)
