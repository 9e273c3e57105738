"""The engine: host-side scheduling around one device, plain Python + numpy (no JAX here
except in runner.py and page_store.py).

    request.py       what crosses the boundary: GenerationRequest in, events out (the seam)
    runner_api.py    the scheduler <-> runner seam: PrefillUnit, DecodeRow, StepRunner
    config.py        EngineConfig: lanes, queue, timeouts, chunk, decode share, KV size
    engine.py        Engine: the thread that owns the device; submit/stats/shutdown
    scheduler.py     Scheduler: admission, prefill/decode choice, pressure (pause/restore)
    lifecycle.py     one sequence's transitions with their events, counters and logs
    sequence.py      Sequence: tokens, KV frontier, pages, per-request counters
    pages.py         PagePool: refcounted KV pages, DUMMY_PAGE, invariant check
    prefix_cache.py  PrefixCache: full pages shared across identical prefixes, device and host
    host_pages.py    HostPagePool: the host tier's slots (--host-context-mib), page copies
    state_slots.py   StateSlotPool: hybrid models' recurrent-state slots, DUMMY_STATE_SLOT
    state_checkpoints.py  StateCheckpoints: saved states that let hybrids reuse prefixes
    stats.py         EngineCounters and the immutable EngineStats snapshot
    fake.py          FakeRunner: a deterministic StepRunner for tests (no JAX)
    runner.py        JaxRunner: the only caller of compiled steps
    page_store.py    HostPageStore: the JaxRunner's host-tier bytes (pinned host on GPUs)
"""
