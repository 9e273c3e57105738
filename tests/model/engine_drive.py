"""Drive a real JaxRunner through a fresh Scheduler + StepLoop, synchronously, for the engine
tests of the families with recurrent state (test_hybrid_engine, test_nemotron_h_engine) and
the speculative ones (`run_requests`: any scheduler, any requests)."""
from __future__ import annotations

import numpy as np

from ninfer_jax.engine.config import EngineConfig
from ninfer_jax.engine.host_pages import HostPagePool
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.request import GenerationRequest, RequestHandle, SamplingParams
from ninfer_jax.engine.scheduler import Scheduler
from ninfer_jax.engine.state_slots import StateSlotPool
from ninfer_jax.engine.step_loop import StepLoop

VOCAB, PAGE, CONTEXT = 256, 4, 64  # the runners these tests build use these
GREEDY = SamplingParams(temperature=0.0)


def prompt(length: int, salt: int) -> list[int]:
    rng = np.random.default_rng(salt)
    return rng.integers(1, VOCAB, length).tolist()


def generate(runner, prompts, *, lanes=None, num_pages=64, slots=None, reuse=True,
             max_tokens=8, together=True, host_pages=0):
    """Run `prompts` (all submitted at once, or one after another) through a fresh
    scheduler on `runner` (lanes and state slots: the runner's unless told); returns (per
    request (cache_n, output ids, counters), scheduler)."""
    lanes = runner.max_batch if lanes is None else lanes
    slots = runner.state_slot_capacity if slots is None else slots
    config = EngineConfig(max_concurrency=lanes, prefill_chunk=16, max_context=CONTEXT,
                          prefix_reuse=reuse)
    host = HostPagePool(host_pages, runner.page_bytes, runner.state_bytes)
    runner.clear_host_pages()
    scheduler = Scheduler(config, PagePool(num_pages), page_size=PAGE,
                          max_batch=runner.max_batch, slots=StateSlotPool(slots), host=host)
    loop = StepLoop(scheduler, runner)
    handles = []
    for index, ids in enumerate(prompts):
        handle = RequestHandle(GenerationRequest(f"r{index}", list(ids), GREEDY, max_tokens))
        scheduler.add(handle)
        handles.append(handle)
        if not together:
            _run(scheduler, loop)
    _run(scheduler, loop)
    results = []
    for handle in handles:
        events = _events(handle)
        assert events[-1].reason == "length", events[-1]
        results.append((events[0].cache_n, list(events[-1].output_ids), events[-1].counters))
    return results, scheduler


def run_requests(scheduler, runner, requests) -> list:
    """Submit every GenerationRequest at once to `scheduler`, step `runner` until all have
    finished; the final event of each, in order."""
    loop = StepLoop(scheduler, runner)
    handles = [RequestHandle(request) for request in requests]
    for handle in handles:
        scheduler.add(handle)
    _run(scheduler, loop)
    return [_events(handle)[-1] for handle in handles]


def drafts_held(scheduler, runner, request) -> dict:
    """Run one request alone; after every step in which its device drafter's drafts belong to
    its tokens so far, record them: {tuple(tokens): drafts list} (MTP and DFlash tests)."""
    loop = StepLoop(scheduler, runner)
    scheduler.add(RequestHandle(request))
    held = {}
    while scheduler.has_work() or loop.in_flight:
        scheduler.apply_controls()
        loop.advance()
        seq = scheduler.resident[0] if scheduler.resident else None
        if seq is not None and seq.device_draft is not None:
            length, drafts = seq.device_draft
            if length == len(seq.tokens):
                held[tuple(seq.tokens)] = drafts.tolist()
    return held


def one_chunk(artifact, tokens, page_size: int, **outputs):
    """The artifact's family's ragged step (hybrid.ragged, or llama.ragged for dense
    llama / qwen3) over `tokens` as one chunk from position 0 on fresh f32 caches (state
    slot 1); `outputs` picks the extra result (hidden=True, or taps=layer ids), returned."""
    import dataclasses

    import jax.numpy as jnp

    from ninfer_jax.model import ragged_batch, steps

    config = artifact.config
    family = steps.FAMILIES[config.architecture]
    caches = family.init_caches(config, num_pages=40, page_size=page_size, num_state_slots=2,
                                dtype=jnp.float32, kv_dtype=jnp.float32)
    batch = dataclasses.replace(
        ragged_batch.chunk_only(jnp.asarray(tokens, jnp.int32), jnp.int32(0),
                                jnp.int32(len(tokens)), jnp.arange(1, 33, dtype=jnp.int32)),
        chunk_state_slot=jnp.int32(1), row_state_slots=jnp.zeros(0, jnp.int32))
    return family.ragged(artifact.params, caches, batch, None, config=config,
                         page_size=page_size, **outputs)[2]


def seeded_outputs(generate, runner, prompt, *, draws=1000, lanes=8, max_tokens=4,
                   temperature=1.5) -> tuple[np.ndarray, int]:
    """`draws` seeds (0..draws-1) of one prompt, `lanes` requests per run: (the output ids
    int [draws, max_tokens], the drafts accepted in all). `generate(runner, prompts,
    sampling=[SamplingParams per prompt], max_tokens=...)` is the test module's own,
    returning (outputs, the scheduler's counters)."""
    rows, accepted = [], 0
    for base in range(0, draws, lanes):
        seeds = [SamplingParams(temperature=temperature, seed=base + i) for i in range(lanes)]
        ids, counters = generate(runner, [prompt] * lanes, sampling=seeds,
                                 max_tokens=max_tokens)
        rows += ids
        accepted += counters.spec_accepted_tokens
    return np.array(rows), accepted


def assert_same_distribution(plain, drafted, positions, min_p=1e-3) -> None:
    """Per output position, the tokens of two seeded runs (seeded_outputs) follow one
    distribution: a chi-square contingency test, tokens rarer than 10 in both runs together
    pooled into one column so that every expected count is large enough."""
    from scipy import stats

    for position in positions:
        tokens = sorted(set(plain[:, position]) | set(drafted[:, position]))
        table = np.array([[np.sum(run[:, position] == t) for t in tokens]
                          for run in (plain, drafted)])
        rare = table.sum(axis=0) < 10
        table = np.column_stack([table[:, ~rare], table[:, rare].sum(axis=1)])
        assert stats.chi2_contingency(table).pvalue > min_p, position


def _events(handle) -> list:
    events = []
    while (event := handle.next_event(timeout=0)) is not None:
        events.append(event)
    return events


def _run(scheduler, loop) -> None:
    for _ in range(10_000):
        scheduler.apply_controls()
        if not loop.advance() and not scheduler.has_work():
            loop.drain()
            return
    raise AssertionError("the scheduler did not finish")


def outputs(results):
    return [ids for _, ids, _ in results]
