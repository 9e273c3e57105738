"""Sequence: the engine's host-side state of one request.

A sequence holds the prompt followed by every committed output token (`tokens`) and
`num_computed`, how many leading tokens have KV in its pages. Everything the scheduler decides
follows from the gap between the two:
- no output yet: prefill until every prompt token has KV, sampling the first output token
  from the last chunk (max_tokens 0: no sample, the request ends there);
- output exists: prefill until all but the last committed token have KV (forced tokens, or a
  replay after a pause, leave such gaps), then the sequence is decode-ready: exactly one
  committed token lacks KV, and a decode row computes it and samples the next.
Replay therefore never samples: it rebuilds KV up to the frontier and resumes decoding.

Launch/collect: the scheduler plans step n+1 while step n runs. It advances `num_computed` when
a step is launched (steps run on the device in launch order, so a later step always sees the
KV), and a token sampled by a launched step but not yet collected is *pending*: it exists on
the device only. `pending_slots` holds its output slot in the launched step, so the next plan
can feed it back without the host seeing it. `tokens` holds committed tokens only.
"""
from __future__ import annotations

import dataclasses
import enum

from ninfer_jax.engine.prompt_media import MediaKeyedTokens, PromptMedia
from ninfer_jax.engine.request import GenerationRequest, RequestHandle
from ninfer_jax.engine.state_slots import DUMMY_STATE_SLOT


class Status(enum.Enum):
    WAITING = "waiting"  # submitted, not admitted yet
    RESIDENT = "resident"  # holds a lane (and pages as execution advances)
    PAUSED = "paused"  # evicted under pressure: keeps its tokens, holds no pages
    FINISHED = "finished"


@dataclasses.dataclass(eq=False)
class Sequence:
    seq_id: int  # submission order: smaller = older
    handle: RequestHandle
    tokens: list[int]  # prompt + committed output
    num_prompt: int
    status: Status = Status.WAITING
    num_computed: int = 0  # leading tokens whose KV is in `pages` (or in a launched step)
    # Output slots, in the launched steps, of tokens sampled but not yet collected (oldest
    # first; at most one per step in flight).
    pending_slots: list = dataclasses.field(default_factory=list)
    pages: list[int] = dataclasses.field(default_factory=list)
    page_table: object = None  # int32 array of `pages`, rebuilt by the scheduler on change
    page_table_key: tuple = ()
    # Hybrid models: the state slot holding the state after tokens [0, num_computed); held
    # while resident, DUMMY_STATE_SLOT otherwise (and always for dense models).
    state_slot: int = DUMMY_STATE_SLOT
    # Presence/frequency penalties: the lane of the device's output counts held while
    # resident (engine/penalty_lanes.py); DUMMY_PENALTY_LANE (0) otherwise.
    penalty_lane: int = 0
    # A TokenPolicy the device applies (engine/policy_lanes.py: its automaton and the host
    # mirror of its state, which the lane is loaded with); None without one, or when the
    # policy stays on the host.
    device_policy: object = None
    # The checkpoint to start the state from, ("slot", device slot) or ("row", host ticket),
    # set when a prefix hit is planned and cleared once its copy is queued
    # (engine/state_checkpoints.py).
    state_source: tuple[str, int] | None = None
    # A snapshot restore's state row in the host tier (its reserved slots; [0] the ticket),
    # set when the restore is planned and cleared once its StateCopy is queued.
    host_state: list[int] | None = None
    cache_n: int = 0  # prompt tokens taken from the prefix cache at admission
    # Most positions that ever had KV: recomputation below it is replay, above it prefill.
    high_water: int = 0
    num_prompt_reported: int = 0  # last PromptProgress.processed published
    # (leading pages published to / matched in the prefix cache, id of the last such node)
    cache_cursor: tuple[int, int] = (0, 0)
    # Cache hints: leading pages an explicit breakpoint covers (kept longest), and the most
    # tokens the prefix cache may be written up to (None: every full page, `implicit` mode).
    keep_pages: int = 0
    publish_limit: int | None = None
    # While paused by snapshot: (KV frontier at the pause, host slots of its pages in order,
    # and for hybrid models the slots reserved for its state row ([0] the ticket), else None).
    snapshot: tuple[int, list[int], list[int] | None] | None = None
    # Route of the restore whose recovery_complete (first fresh commit) is still due.
    recovering: str | None = None
    # Anti-thrash: a request paused again before it ran anything since its restore waits for
    # `restore_gate` requests in total to have ended before it is restored once more.
    computed_at_restore: int = -1
    restore_gate: int = 0
    times_bypassed: int = 0  # times a later request was admitted while this one waited at the head
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    paused_at: float | None = None
    counters: dict = dataclasses.field(default_factory=lambda: {
        "preemptions": 0, "replay_restores": 0, "snapshot_restores": 0, "replayed_tokens": 0,
        "restored_cached_tokens": 0,
        "prefill_tokens": 0, "prefill_units": 0, "decode_rounds": 0, "paused_seconds": 0.0,
        # speculative decoding (engine/stats.py's spec_* counters, for this request)
        "spec_rounds": 0, "spec_drafted": 0, "spec_accepted": 0, "spec_fallback_steps": 0,
        "spec_accepted_per_position": [],
        "vision_items": 0, "vision_seconds": 0.0,  # --vision: encodes of this request's media
    })
    # The drafter's view of `tokens` (speculation.TokenHistory), made on first use.
    history: object = None
    # --spec mtp: (number of tokens it follows, int32 [K]) drafted by the step that
    # committed the last token; stale once more tokens commit.
    device_draft: tuple | None = None
    # Prompts with images or video: MRoPE positions, feature rows, prefix-cache marks
    # (engine/prompt_media.py); None for text.
    media: PromptMedia | None = None
    # handle.request, read several times per row per step: an attribute, not a property
    request: GenerationRequest = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.request = self.handle.request

    @property
    def rope_delta(self) -> int:
        """What decode rows add to their position on the three MRoPE axes (0: text)."""
        return 0 if self.media is None else self.media.rope_delta

    @property
    def cache_tokens(self):
        """`tokens` as the prefix cache keys them: media placeholders carry their digest."""
        return self.tokens if self.media is None else MediaKeyedTokens(self.tokens,
                                                                       self.media.marks)

    @property
    def request_id(self) -> str:
        return self.handle.request.request_id

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def num_pending(self) -> int:
        return len(self.pending_slots)

    @property
    def num_total(self) -> int:
        """Committed plus pending tokens: the sequence as the device will have it."""
        return len(self.tokens) + len(self.pending_slots)

    @property
    def num_output_total(self) -> int:
        return self.num_total - self.num_prompt

    @property
    def prefill_target(self) -> int:
        """How many leading tokens must have KV before the next sample."""
        return self.num_total if self.num_output_total == 0 else self.num_total - 1

    @property
    def needs_prefill(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def is_decode_ready(self) -> bool:
        return self.num_output_total > 0 and self.num_total - self.num_computed == 1

    @property
    def is_replaying(self) -> bool:
        return self.status is Status.RESIDENT and self.num_computed < self.high_water
