"""The seam between the scheduler (host bookkeeping) and the runner (the only caller of
jitted steps). The scheduler builds these plain values; the runner turns them into padded
int32/float32 arrays, runs one compiled step and returns sampled tokens as numpy.

Positions are absolute sequence positions. A page table lists the pages holding positions
[0, len) in order; the runner pads it with DUMMY_PAGE to its compiled width bucket. For hybrid
models each unit and row also names its sequence's state slot (engine/state_slots.py): a chunk
at start 0 begins from a zero state, anything else continues the slot's state. Dense models
leave it at DUMMY_STATE_SLOT and the runner does not send it.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol

import numpy as np

from ninfer_jax.engine.prompt_media import PromptMedia
from ninfer_jax.engine.request import SamplingParams
from ninfer_jax.engine.state_slots import DUMMY_STATE_SLOT


# SampleSpec and DecodeRow are built for every row of every step: immutable NamedTuples
# (built in C) cost a third of what a frozen dataclass's __init__ does.
class SampleSpec(NamedTuple):
    """How to pick the next token for one row. `sample_index` = number of output tokens
    committed before this one: with `params.seed` it fixes the random stream per token, so a
    seeded request samples the same tokens whatever it is batched with."""

    params: SamplingParams
    sample_index: int
    # Presence/frequency penalties: the lane of the runner's output counts that holds this
    # request's committed output (engine/penalty_lanes.py); DUMMY_PENALTY_LANE without.
    penalty_lane: int = 0


@dataclasses.dataclass(frozen=True)
class PrefillUnit:
    """Compute KV for tokens at positions [start, start + len(tokens)) of one sequence.
    When `sample` is set, also sample the token that follows the last one."""

    seq_id: int
    tokens: np.ndarray  # int32 [T]
    start: int
    page_table: np.ndarray  # int32 [num pages covering start + T positions]
    sample: SampleSpec | None
    state_slot: int = DUMMY_STATE_SLOT  # hybrid models: holds the state after [0, start)
    # The token after the chunk when the sequence already has it (a prompt that continues):
    # the MTP head's K/V at the chunk's last position needs it (model/mtp.py).
    next_token: int | None = None
    # The sequence's prompt media (prompt_media.py): MRoPE positions for every chunk, and
    # the items a chunk's placeholders need, which the runner encodes and feeds.
    media: PromptMedia | None = None


class DecodeRow(NamedTuple):
    """One token of a ragged step's row region: computes the KV of `token` at `position`
    and samples what follows it. A decode row is one such token; a speculative round is
    K+1 consecutive ones of one sequence (each sees the keys up to its own position, the
    drafts' KV written by the rows before it in the same step: `VerifySpan`)."""

    seq_id: int
    token: int  # the last committed token, whose KV is not yet in the cache
    position: int  # its position
    page_table: np.ndarray  # int32, covers position
    sample: SampleSpec
    # The token is still on the device: the previous step sampled it in this output slot
    # (`chunk_slot(k)` for its k-th chunk, else that plan's row index). `token` is then
    # ignored.
    from_previous: int | None = None
    state_slot: int = DUMMY_STATE_SLOT  # hybrid models: holds the state after [0, position)
    rope_delta: int = 0  # after a prompt with media: its MRoPE offset (prompt_media.py)


CHUNK_SLOT = -1  # DecodeRow.from_previous naming the previous step's (first) chunk sample


def chunk_slot(index: int) -> int:
    """DecodeRow.from_previous naming the sample of the previous plan's chunk `index`
    (StepPlan.chunks order; CHUNK_SLOT is index 0's)."""
    return CHUNK_SLOT - index


def chunk_index(slot: int) -> int:
    """The StepPlan.chunks index a negative from_previous names (chunk_slot's inverse)."""
    return CHUNK_SLOT - slot


class VerifySpan(NamedTuple):
    """Rows first_row..first_row + len(draft.tokens) of a plan verify one sequence's drafts
    (engine/speculation.py): row first_row feeds its last committed token, the next rows
    the drafts in order. The runner runs them as ordinary rows; a drafter with a
    distribution (`draft.probs`) would need the runner to return acceptance draws too."""

    seq_id: int
    first_row: int
    draft: object  # speculation.Draft


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One ragged step: optional prefill chunks plus any number of rows (at most max_batch;
    with a chunk at most the runner's chunk row capacity), run as one compiled call.
    `chunk` is the first chunk; `more_chunks` are other sequences' chunks in the same step
    (a runner with chunk_segments > 1 runs each as a segment of at most segment_tokens
    tokens, the first one included)."""

    chunk: PrefillUnit | None
    rows: tuple[DecodeRow, ...] = ()
    more_chunks: tuple[PrefillUnit, ...] = ()
    # Hybrid models: (src, dst) state slot copies applied in order before the step runs
    # (state checkpoints: engine/state_checkpoints.py).
    state_copies: tuple[tuple[int, int], ...] = ()
    # The host tier: page saves and loads (host_pages.PageCopy) applied in order before
    # the step (and before state_copies, which never touch pages).
    page_copies: tuple = ()
    # Speculative rounds among the rows (the scheduler reads them back at collect).
    verify: tuple[VerifySpan, ...] = ()
    # Penalty lanes (re)started by this plan (penalty_lanes.PenaltyLoad): applied in order
    # before the step, and applied even when the page copies fail (PageCopyError).
    penalty_loads: tuple = ()

    @property
    def chunks(self) -> tuple[PrefillUnit, ...]:
        """Every chunk of the step, the first one first (empty without one)."""
        return () if self.chunk is None else (self.chunk, *self.more_chunks)


@dataclasses.dataclass(frozen=True)
class StepResult:
    chunk_token: int | None  # the chunk's sample when it asked for one
    row_tokens: np.ndarray  # int32 [len(rows)]
    # Which of those tokens a device token policy forced (engine/policy_lanes.py follows it)
    chunk_forced: bool = False
    row_forced: np.ndarray | None = None  # bool [len(rows)]; None: none forced
    # Device drafters (--spec mtp): K drafts to follow each sample, int32 [K] after the
    # chunk's and [len(rows), K] after the rows'; None without one.
    chunk_draft: np.ndarray | None = None
    row_drafts: np.ndarray | None = None
    # --vision: items of the chunk's sequence the step encoded, and the encode's seconds
    vision_items: int = 0
    vision_seconds: float = 0.0
    # The samples of StepPlan.more_chunks (None where a chunk asked for none) and which of
    # them a device token policy forced, in that order
    more_chunk_tokens: tuple = ()
    more_chunk_forced: tuple = ()

    def chunk_sample(self, index: int) -> tuple[int | None, bool]:
        """(sample, forced) of the plan's chunk `index` (StepPlan.chunks order)."""
        if index == 0:
            return self.chunk_token, self.chunk_forced
        return self.more_chunk_tokens[index - 1], bool(self.more_chunk_forced[index - 1])


class PageCopyError(Exception):
    """A plan's page copies ran out of device or host memory. `launch` raises it instead of
    dispatching the step; every other copy of the plan (and its state copies) ran. Host
    slots in `lost_slots` hold nothing (their save failed); device pages in `failed_pages`
    hold garbage (their load failed, or read a lost slot)."""

    def __init__(self, lost_slots: frozenset, failed_pages: frozenset, cause: str):
        super().__init__(f"page copies failed ({len(lost_slots)} saves, "
                         f"{len(failed_pages)} loads): {cause}")
        self.lost_slots, self.failed_pages = lost_slots, failed_pages


class StepRunner(Protocol):
    page_size: int
    num_pages: int  # pool size, DUMMY_PAGE included
    max_batch: int
    # Most rows a step with a prefill chunk may carry (optional: max_batch without it).
    max_chunk_rows: int
    # Most chunks one step may carry, each of at most segment_tokens tokens when there are
    # several (optional: 1 without it, one chunk per step)
    chunk_segments: int
    segment_tokens: int
    # Lanes of the device-resident penalty counts (engine/penalty_lanes.py), at least one
    # per resident sequence.
    penalty_lanes: int
    # Usable state slots (DUMMY_STATE_SLOT excluded); 0 for dense models. Optional: a
    # runner without the attribute has none.
    state_slot_capacity: int

    def warmup(self) -> None:
        """Compile the step shapes needed to serve before the server reports healthy."""

    def clear_host_pages(self) -> None:
        """Forget every host-tier page (a new HostPagePool starts over at slot 0). Optional:
        a runner with page_bytes 0 has no host tier."""

    def compile_progress(self) -> tuple[int, int]:
        """(step shapes compiled, step shapes planned)."""

    def use_host_tier(self, num_slots: int = 0) -> None:
        """The engine's host tier is on, `num_slots` slots of page_bytes: take its memory
        and compile its page copies' shapes (run once while idle: prime_one). Optional: a
        runner with page_bytes 0 has no host tier."""

    def prime_one(self) -> bool:
        """Run one compiled step that has never run, on padding inputs, or compile one more
        host-tier copy shape (use_host_tier); False when nothing is left. The engine thread
        calls it only while idle with no step in flight."""

    def launch(self, plan: StepPlan) -> object:
        """Dispatch one step and return at once (a handle for `collect`). Steps run on the
        device in launch order, so a plan may name the previous step's samples
        (`from_previous`) before they reach the host. Raises PageCopyError, with the step
        not dispatched, when its page copies run out of memory."""

    def wait(self, handle: object) -> None:
        """Block until a launched step has finished on the device."""

    def collect(self, handle: object) -> StepResult:
        """Wait for a launched step's samples. Handles are collected in launch order."""
