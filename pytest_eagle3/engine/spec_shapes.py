"""The speculative shapes the acceptance engines run: chain, token tree, overlap schedule.

A shape is how SGLang drafts and verifies (``--speculative-num-steps``,
``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``) and schedules
(``--disable-overlap-schedule``); each exercises SGLang code the others never
take:

* ``chain`` (the acceptance engines' shape): 3 steps, top-k 1, 4 draft tokens.
  At top-k 1 the accepted path is already the front of each request's block and
  SGLang skips its compaction as an identity (0.5.23
  ``srt/speculative/eagle_worker_common.py`` ``run_eagle_verify``).
* ``tree``: SGLang's own default for Llama EAGLE-3, 5 steps, top-k 4, 8 draft
  tokens (``srt/arg_groups/speculative_hook.py`` ``_auto_choose_speculative_params``):
  the verify runs a token tree under a tree mask and SGLang then moves the
  accepted path's KV slots, predicted tokens and aux hidden states to the
  front of each block (``_finalize_accept_tree_path``).  Its engine also chunks
  prefills at 16 tokens, so the draft's input at a chunk seam (PR #26800) is read
  on the same engine.
* ``other-schedule``: the chain under the overlap schedule the acceptance
  engine does not run.  SGLang's overlap schedule (``event_loop_overlap``) is
  the default on GPUs, so there it is ``--disable-overlap-schedule``; SGLang
  0.5.23 turns the overlap schedule off for speculative decoding on CPU
  (``speculative_hook.py`` ``_disable_overlap_schedule_for_cpu``: "not
  implemented"), so there it is the overlap schedule, through the CPU tier's
  ``spec_overlap_schedule`` fill, which lifts that and stands in for the one
  Triton kernel the overlap path calls (:mod:`pytest_eagle3.worker.cpu.spec_overlap`).
  Paired with ``chain``: the verify captures must be equal row for row and the
  accept lengths equal.

Nothing here imports torch or sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

#: The CPU tier's switch for the ``spec_overlap_schedule`` fills: an argument of ours
#: among a shape's server args, never passed to SGLang;
#: :func:`pytest_eagle3.capture.api.engine_config` turns it into the fills' switch
#: (:data:`pytest_eagle3.worker.cpu.spec_overlap.OVERLAP_ENV`).
CPU_SPEC_OVERLAP = "pytest_eagle3_cpu_spec_overlap"

if TYPE_CHECKING:
    from pytest_eagle3.sglang_source.install import SGLangInstall

NO_TREE_MASK = ("{shape}: {sglang}'s CPU attention backend (intel_amx_backend.py) hands no tree mask to "
                "extend_attention_cpu, so a token tree cannot be verified on the CPU tier")
NO_FLAG = "{shape}: the installed {sglang} has no --{flag} server argument"


@dataclass(frozen=True)
class SpecShape:
    """One speculative shape.

    Attributes:
        name: stable id, used in need names (``acceptance-tree``).
        description: what the shape runs that the chain does not.
        steps, topk, draft_tokens: the draft's steps, its top-k per step, and the
            nodes the target verifies per request.
        other_schedule: the overlap schedule the acceptance engine does not run on
            the device (cpu: on, through :data:`CPU_SPEC_OVERLAP`; cuda: off).
        chunk: ``--chunked-prefill-size`` (``0``: the engine default).
        pair: the shape whose engine's verify captures and accept lengths must equal this one's.
        source: where the shape comes from.
    """

    name: str
    description: str
    steps: int = 3
    topk: int = 1
    draft_tokens: int = 4
    other_schedule: bool = False
    chunk: int = 0
    pair: str = ""
    source: str = ""

    @property
    def tree(self) -> bool:
        return self.topk > 1

    def server_args(self, device: str) -> dict[str, Any]:
        """The server arguments of the shape (over the acceptance engine's draft args)."""
        args: dict[str, Any] = {"speculative_num_steps": self.steps, "speculative_eagle_topk": self.topk,
                                "speculative_num_draft_tokens": self.draft_tokens}
        if self.chunk:
            args["chunked_prefill_size"] = self.chunk
        if self.other_schedule:
            args.update({CPU_SPEC_OVERLAP: True} if device == "cpu" else {"disable_overlap_schedule": True})
        return args

    def requirement(self, install: "SGLangInstall", device: str) -> str | None:
        """Why the shape cannot run with ``install`` on ``device`` (``None``: it can)."""
        for flag in self.server_args(device):
            if flag != CPU_SPEC_OVERLAP and not install.has_arg(flag):
                return NO_FLAG.format(shape=self.name, sglang=install.describe(), flag=flag.replace("_", "-"))
        if device == "cpu" and self.tree and install.location and not install.cpu_tree_mask:
            return NO_TREE_MASK.format(shape=self.name, sglang=install.describe())
        return None


CHAIN = SpecShape("chain", "a chain of 3 draft tokens (top-k 1), SGLang's schedule without overlap on CPU")
TREE = SpecShape(
    "tree", "a token tree: 5 draft steps, top-k 4, 8 verified nodes per request (SGLang's Llama EAGLE-3 default), "
    "prefills chunked at 16 tokens", steps=5, topk=4, draft_tokens=8, chunk=16,
    source="srt/arg_groups/speculative_hook.py _auto_choose_speculative_params (5, 4, 8); "
    "eagle_worker_common.py _finalize_accept_tree_path")
OTHER_SCHEDULE = SpecShape(
    "other-schedule", "the chain under the other scheduler: SGLang's overlap schedule on CPU (event_loop_overlap, "
    "through the spec_overlap_schedule fill), --disable-overlap-schedule on GPUs", other_schedule=True, pair="chain",
    source="srt/managers/scheduler.py event_loop_overlap / event_loop_normal; srt/managers/overlap_utils.py")

SHAPES: tuple[SpecShape, ...] = (CHAIN, TREE, OTHER_SCHEDULE)


def get_shape(name: str) -> SpecShape:
    """The shape ``name``.

    Raises:
        KeyError: unknown name (the message lists the known ones).
    """
    for shape in SHAPES:
        if shape.name == name:
            return shape
    raise KeyError(f"unknown speculative shape {name!r}; known: {', '.join(s.name for s in SHAPES)}")
