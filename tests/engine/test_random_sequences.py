"""Seeded random workloads: submits, cancels, stop_at truncations and pool pressure in any
order. After every round the page refcounts must equal the page tables (Driver checks); at
the end no page is held, every handle got exactly one terminal event, and every output is
the fake model's exact output (a prefix of it when cut short). The hybrid variant runs the
fake with state slots (sometimes fewer than lanes) and background requests: a slot bug
changes tokens there, and every slot must be back at the end. A host tier of a few slots to
plenty takes spills, write-through copies and snapshots: the Driver checks its slots and the
fake runner's rows every round. Each workload runs with one chunk per step and with up to
three sequences' chunks of at most 3 tokens per step (chunk_segments)."""
import random

import pytest

from ninfer_jax.engine.request import Finished, SamplingParams, Tokens

from engine_testkit import GREEDY, Driver, drain, expected_output, make_request, terminal


BASES = [[(31 * i + 7 * b) % 1000 for i in range(12)] for b in range(3)]


def random_request(rng: random.Random, pool_tokens: int, hybrid: bool = False,
                   history: list | None = None):
    # Half the prompts extend a few shared beginnings, so prefix reuse gets exercised.
    length = rng.randint(1, min(14, pool_tokens - 1))
    prefix = rng.choice(BASES)[: rng.randint(0, length)] if rng.random() < 0.5 else []
    prompt = prefix + [rng.randrange(1000) for _ in range(length - len(prefix))]
    if hybrid and history and rng.random() < 0.4:
        # A hybrid hit needs a whole earlier prompt (its checkpoint boundary): repeat one,
        # sometimes extended like a conversation's next turn.
        prompt = rng.choice(history) + prompt[: rng.choice([0, 0, 3])]
        prompt = prompt[: pool_tokens - 1]
    if history is not None:
        history.append(prompt)
    sampling = GREEDY if rng.random() < 0.6 else SamplingParams(temperature=1.0,
                                                                seed=rng.randrange(100))
    background = hybrid and rng.random() < 0.3  # yields lanes, slots and pages to others
    breakpoints = (rng.randint(1, len(prompt)),) if hybrid and rng.random() < 0.5 else ()
    return make_request(prompt, max_tokens=rng.choice([0, 1, 3, 9, 17]), sampling=sampling,
                        background=background, cache_breakpoints=breakpoints)


@pytest.mark.parametrize("segments", [1, 3], ids=["one-chunk", "three-chunks"])
@pytest.mark.parametrize("hybrid", [False, True], ids=["dense", "hybrid"])
@pytest.mark.parametrize("seed", range(10))
def test_random_workload_keeps_pages_and_outputs_exact(seed, hybrid, segments):
    rng = random.Random(seed)
    page_size = rng.choice([1, 2, 4])
    num_pages = rng.randint(16 // page_size + 1, 48 // page_size + 1)
    lanes = rng.randint(1, 4)
    slots = rng.randint(1, lanes + 3) if hybrid else 0  # fewer than lanes, or spares
    driver = Driver(num_pages=num_pages, page_size=page_size, state_slots=slots,
                    max_concurrency=lanes, prefill_chunk=rng.randint(1, 8),
                    decode_share=rng.choice([0.0, 0.25, 1.0]), max_bypass=rng.randint(0, 3),
                    max_context=64, prefix_reuse=seed % 3 != 0,
                    # three chunks of at most 3 tokens a step (chunk_segments)
                    chunk_segments=segments, segment_tokens=3,
                    # (its own draw, so the workloads stay those of the seeds before it)
                    host_pages=random.Random(-seed).choice([0, 3, 8, 64]))
    pool_tokens = (num_pages - 1) * page_size
    seen: dict = {}  # handle -> events so far
    history: list = []  # prompts submitted so far
    stops: dict = {}  # handle -> stop_at value asked
    for _ in range(300):
        if rng.random() < 0.3 and len(seen) < 40:
            seen[driver.submit(random_request(rng, pool_tokens, hybrid, history))] = []
        live = [h for h in seen if not any(isinstance(e, Finished) for e in seen[h])]
        if live and rng.random() < 0.05:
            rng.choice(live).cancel()
        if live and rng.random() < 0.05:
            handle = rng.choice(live)
            produced = sum(len(e.ids) for e in seen[handle] if isinstance(e, Tokens))
            if produced:
                stops[handle] = rng.randint(0, produced)
                handle.stop_at(stops[handle])
        driver.step()
        for handle, events in seen.items():
            events.extend(drain(handle))
    driver.run()
    checkpoints = driver.scheduler.checkpoints
    assert driver.request_pages() == 0
    assert driver.slots.num_used == (checkpoints.num_checkpoints if checkpoints else 0)
    if driver.scheduler.cache is not None:
        assert driver.pool.num_used == driver.scheduler.cache.num_pages
    for handle, events in seen.items():
        events.extend(drain(handle))
        end = terminal(events)
        request = handle.request
        reference = expected_output(request.prompt_ids, request.max_tokens,
                                    sampling=request.sampling, hybrid=hybrid)
        output = list(end.output_ids)
        streamed = [t for e in events if isinstance(e, Tokens) for t in e.ids]
        assert streamed[: len(output)] == output  # the stream never disagrees with the result
        if end.reason == "stop":
            assert output == reference[: stops[handle]]
        elif end.reason == "cancelled":
            assert output == reference[: len(output)]
        else:
            assert end.reason == "length"
            # Full output, or cut at the pool's size when the sequence outgrew all of it.
            assert output == reference or (len(request.prompt_ids) + len(output) > pool_tokens
                                           and output == reference[: len(output)])
