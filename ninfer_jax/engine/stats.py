"""Engine counters and the immutable snapshot other threads read.

The engine thread alone mutates `EngineCounters`. After each round it builds a frozen
`EngineStats` and swaps it into place with one reference assignment, so /metrics, the request
log and tests read a consistent picture without taking any lock the engine thread waits on.
"""
from __future__ import annotations

import dataclasses
import time

OUTCOMES = ("stop", "length", "cancelled", "timeout", "failed")
# engine_boundary: intake and controls; program_submit: planning and launching a step;
# program_post: reading a collected step's samples; engine_commit_output: committing tokens
# and publishing events; engine_maintenance: stats snapshots and round listeners.
HOST_PHASES = ("engine_boundary", "program_submit", "program_post", "engine_commit_output",
               "engine_maintenance")
# The launch part of program_submit (runner.launch and the scheduler's note of it; planning
# excluded) by what the step carries: decode rows only, a prefill chunk only, or both. On a
# GPU the launch is where the device's queue can push back (run 40: program_submit 14-27 ms a
# round at 64 streams against 0.5 ms of planning and packing); the split says which steps pay.
LAUNCH_KINDS = ("decode", "prefill", "mixed")


@dataclasses.dataclass
class EngineCounters:
    """Cumulative totals since start-up (monotonic)."""

    prompt_tokens: int = 0  # full prompts of admitted requests, counted once
    cached_tokens: int = 0  # of those, taken from the prefix cache
    prefill_tokens: int = 0  # prompt/gap tokens actually computed for the first time
    replayed_tokens: int = 0  # recomputation after a pause
    generation_tokens: int = 0  # every committed output token (forced ones included)
    decode_tokens: int = 0  # committed by decode rounds (the prefill-sampled first excluded)
    preemptions: int = 0
    replay_restores: int = 0
    snapshot_restores: int = 0
    snapshot_revocations: int = 0  # snapshots dropped for replay (no device pages back)
    prefill_units: int = 0
    decode_rounds: int = 0
    decode_rows: int = 0  # sum of decode batch sizes (average = rows / rounds)
    # Speculative decoding: verify rounds (a sequence's rows with >= 1 draft), tokens drafted
    # and accepted in them, and decode rows of speculation-eligible requests that ran
    # without drafts (no proposal, no room, penalties or a token policy).
    spec_rounds: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_fallback_steps: int = 0
    prefill_seconds: float = 0.0  # time inside runner.prefill
    # --vision: media items run through the vision tower and the device time of their encodes
    vision_items: int = 0
    vision_seconds: float = 0.0
    decode_seconds: float = 0.0  # time inside runner.decode
    requests: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    decode_batch_sizes: dict = dataclasses.field(default_factory=dict)  # size -> rounds
    # Engine-thread wall time: blocked on the device in collect, and host work by phase
    # (HOST_PHASES: each segment counted once; device waits excluded).
    device_wait_seconds: float = 0.0
    host_work: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(HOST_PHASES, 0.0))
    launches: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(LAUNCH_KINDS, 0))
    launch_seconds: dict = dataclasses.field(
        default_factory=lambda: dict.fromkeys(LAUNCH_KINDS, 0.0))
    # XLA compiles inside launches (engine thread; compile_clock.py, installed by the
    # JaxRunner): a shape or helper warm-up did not compile
    launch_compiles: int = 0
    launch_compile_seconds: float = 0.0

    def record_decode(self, batch_size: int, seconds: float) -> None:
        self.decode_rounds += 1
        self.decode_rows += batch_size
        self.decode_seconds += seconds
        self.decode_batch_sizes[batch_size] = self.decode_batch_sizes.get(batch_size, 0) + 1


@dataclasses.dataclass(frozen=True)
class EngineStats:
    time: float  # monotonic time of the snapshot
    ready: bool  # warm-up done
    healthy: bool
    # current gauges (prefilling/decode_ready/replaying are subsets of running)
    running: int
    waiting: int
    paused: int
    prefilling: int
    decode_ready: int
    replaying: int
    kv_pages_used: int
    kv_pages_capacity: int
    kv_pages_cached: int  # pages the prefix cache retains (also counted in kv_pages_used)
    # host tier (--host-context-mib): slots of one device page each, cached ones (prefix
    # pages: spilled, or clean copies of device pages), checkpoint ones (hybrid models'
    # spilled state checkpoints) and snapshot ones (paused requests) making up the used;
    # cumulative bytes
    host_pages_used: int
    host_pages_capacity: int
    host_pages_cached: int
    host_pages_clean: int  # of the cached, copies of pages still on the device
    host_pages_checkpoints: int
    host_pages_peak: int
    host_page_bytes: int
    kv_bytes_to_host: int
    kv_bytes_to_device: int
    page_size: int
    max_concurrency: int
    # device state slots of hybrid models (0 and 0 for dense ones)
    state_slots_used: int
    state_slots_capacity: int
    # compiled step shapes: the rest compile after ready on GPUs (the runner's warm-up)
    compiled_shapes: int
    total_shapes: int
    # cumulative counters
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    replayed_tokens: int
    generation_tokens: int
    decode_tokens: int
    preemptions: int
    replay_restores: int
    snapshot_restores: int
    snapshot_revocations: int
    prefill_units: int
    decode_rounds: int
    decode_rows: int
    spec_rounds: int
    spec_draft_tokens: int
    spec_accepted_tokens: int
    spec_fallback_steps: int
    prefill_seconds: float
    vision_items: int
    vision_seconds: float
    decode_seconds: float
    requests: dict  # outcome -> count
    decode_batch_sizes: dict  # batch size -> rounds
    device_wait_seconds: float
    host_work: dict  # phase -> seconds
    launches: dict  # LAUNCH_KINDS -> steps launched
    launch_seconds: dict  # LAUNCH_KINDS -> seconds inside runner.launch
    launch_compiles: int  # XLA compiles inside launches
    launch_compile_seconds: float

    @classmethod
    def empty(cls, *, page_size: int = 0, capacity: int = 0, max_concurrency: int = 0,
              state_slots_capacity: int = 0, ready: bool = False,
              healthy: bool = True) -> "EngineStats":
        return build_stats(EngineCounters(), gauges={
            "running": 0, "waiting": 0, "paused": 0, "prefilling": 0, "decode_ready": 0,
            "replaying": 0, "kv_pages_used": 0, "kv_pages_capacity": capacity,
            "kv_pages_cached": 0, **HOST_GAUGES_ZERO,
            "page_size": page_size, "max_concurrency": max_concurrency,
            "state_slots_used": 0, "state_slots_capacity": state_slots_capacity,
            "compiled_shapes": 0, "total_shapes": 0,
        }, ready=ready, healthy=healthy)


HOST_GAUGES_ZERO = dict.fromkeys((
    "host_pages_used", "host_pages_capacity", "host_pages_cached", "host_pages_clean",
    "host_pages_checkpoints", "host_pages_peak",
    "host_page_bytes", "kv_bytes_to_host", "kv_bytes_to_device"), 0)
_COUNTER_NAMES = tuple(f.name for f in dataclasses.fields(EngineCounters))


def build_stats(counters: EngineCounters, *, gauges: dict, ready: bool,
                healthy: bool) -> EngineStats:
    # Built every round, so no dataclasses.asdict (a slow deep copy); only the dicts need
    # copying for the snapshot to share nothing mutable with the engine thread.
    totals = {name: getattr(counters, name) for name in _COUNTER_NAMES}
    totals["requests"] = dict(counters.requests)
    totals["decode_batch_sizes"] = dict(counters.decode_batch_sizes)
    totals["host_work"] = dict(counters.host_work)
    totals["launches"] = dict(counters.launches)
    totals["launch_seconds"] = dict(counters.launch_seconds)
    # runners without compiles, schedulers of models without state slots
    gauges = {"compiled_shapes": 0, "total_shapes": 0, "state_slots_used": 0,
              "state_slots_capacity": 0, **HOST_GAUGES_ZERO, **gauges}
    return EngineStats(time=time.monotonic(), ready=ready, healthy=healthy, **gauges, **totals)
