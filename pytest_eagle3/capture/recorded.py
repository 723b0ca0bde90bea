"""What a recorded request set returned, for the tests that read it.

:class:`RankCaptures`: a capture request set through the API and on every TP
rank (:meth:`pytest_eagle3.capture.runner.CaptureRunner.ranks`);
:class:`SpecRecording`: a speculative run with the target's forwards and the
draft's inputs on every TP rank
(:meth:`pytest_eagle3.capture.runner.CaptureRunner.speculate_recorded`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_eagle3.capture.draft_path import DraftPathCaptures
    from pytest_eagle3.capture.response import Captures
    from pytest_eagle3.engine.recordings import Record


@dataclass(frozen=True)
class SpecRecording:
    """One recorded speculative run (:meth:`CaptureRunner.speculate_recorded`).

    Attributes:
        runs: per prompt, its output, captures and speculative metrics.
        records: rank -> every forward the target recorded, in order.
        draft: rank -> every draft extend forward's inputs
            (:func:`pytest_eagle3.engine.draft_inputs.read_draft_inputs`).
    """

    runs: "tuple[DraftPathCaptures, ...]"
    records: "dict[int, list[Record]]"
    draft: "dict[int, list[dict]]"


@dataclass(frozen=True)
class RankCaptures:
    """What one request set captured, through the API and on every TP rank.

    Attributes:
        captures: per prompt, the API's captures (rank 0's view).
        prefill: rank -> per prompt, its prefill rows over every chunk (``[T, K*H]``).
        decode: rank -> per prompt, its decode rows (``[d, K*H]``, positions ``T .. T+d-1``);
            ``{}`` without decode steps.
        forwards: rank -> every forward holding the prompts' rows, in order (what
            the ranks must agree on, bitwise on cpu).
        served: under attention DP, rank -> the prompt indices its DP rank served
            (``prefill[rank][k]`` is prompt ``served[rank][k]``); ``None``: every
            rank holds every prompt.
    """

    captures: "list[Captures]"
    prefill: "dict[int, list[Record]]"
    decode: "dict[int, list[Record]]"
    forwards: "dict[int, list[Record]]"
    served: "dict[int, list[int]] | None" = None
