"""Prefix reuse on hybrid models: state checkpoints at a sequence's checkpoint boundary, hits
that start from a copy of one (and report exactly the tokens they skip), eviction when a
resident needs the slot, and checkpoints dropped with their prefix cache node. The fake's
per-slot state makes a hit from a wrong or missing state produce different tokens."""
import pytest

from ninfer_jax.engine.host_pages import DROP, LOAD, SAVE, HostPagePool, StateCopy
from ninfer_jax.engine.state_checkpoints import StateCheckpoints, boundary
from ninfer_jax.engine.state_slots import StateSlotPool

from engine_testkit import Driver, drain, expected_output, make_request, prompt_of

PAGE = 4


def run_one(driver, prompt, max_tokens=4):
    """Submit one request, run to the end; its (Admitted.cache_n, Finished)."""
    handle = driver.submit(make_request(prompt, max_tokens=max_tokens))
    driver.run()
    events = drain(handle)
    end = events[-1]
    assert list(end.output_ids) == expected_output(prompt, max_tokens, hybrid=True)
    return events[0].cache_n, end


def test_boundary_is_the_longest_reusable_prefix():
    assert [boundary(n, 4) for n in (1, 4, 5, 8, 9, 20)] == [0, 0, 4, 4, 8, 16]


def test_checkpoint_book_keeping_takes_evicts_and_forgets():
    pool = StateSlotPool(2)
    book = StateCheckpoints(pool)
    assert book.take(node_id=7, src_slot=1) and book.copies == [(1, 1)]  # a free slot
    assert not book.take(node_id=7, src_slot=1)  # one per node
    assert book.take(node_id=8, src_slot=1)
    assert book.deepest([5, 7, 9]) == 2 and book.deepest([5]) == 0
    book.slot_at(7)  # 7 is now the most recently used
    assert book.take(node_id=9, src_slot=2)  # no slot free: 8, the LRU one, goes
    assert sorted(book.held_slots()) == [1, 2] and book.deepest([8]) == 0
    book.forget(9)
    pool.check(book.held_slots())
    assert book.pop_copies() == ((1, 1), (1, 2), (2, 2)) and book.copies == []


def test_an_evicted_checkpoint_spills_to_a_host_row_that_leaves_with_its_node():
    host = HostPagePool(8, page_bytes=8, state_bytes=16)  # a row takes two slots
    asked = []
    book = StateCheckpoints(StateSlotPool(1), host,
                            lambda units, node: asked.append((units, node)) or node == 7)
    assert book.take(node_id=7, src_slot=1) and book.take(node_id=8, src_slot=1)
    assert asked == [(2, 7)] and book.source(7) == ("row", 0) and book.source(8) == ("slot", 1)
    assert book.deepest([7]) == 1 and book.num_host_units == host.num_used == 2
    book.restore(book.source(7), 1)  # a hit: the row loads into the sequence's slot
    assert book.take(node_id=9, src_slot=1)  # no room for 8's row: it is dropped
    assert book.deepest([8]) == 0
    book.forget(7)
    assert host.num_used == 0 and book.num_host_checkpoints == 0
    assert book.pop_copies() == ((1, 1), StateCopy(SAVE, 1, 0), (1, 1),
                                 StateCopy(LOAD, 1, 0), (1, 1), StateCopy(DROP, 0, 0))


def test_a_repeated_prompt_starts_from_the_checkpoint():
    driver = Driver(state_slots=2, max_concurrency=1, num_pages=64, page_size=PAGE,
                    prefill_chunk=64)
    prompt = prompt_of(22)
    cache_n, first = run_one(driver, prompt)
    assert cache_n == 0
    chunks = [p.chunk for p in driver.schedules if p.chunk is not None]
    assert [(c.start, len(c.tokens)) for c in chunks] == [(0, 20), (20, 2)]  # ends at 20
    assert driver.scheduler.checkpoints.num_checkpoints == 1
    driver.schedules.clear()
    cache_n, second = run_one(driver, prompt)
    assert cache_n == 20 == second.usage.cached_tokens
    assert list(second.output_ids) == list(first.output_ids)
    [hit] = [p for p in driver.schedules if p.chunk is not None]
    assert hit.chunk.start == 20 and len(hit.state_copies) == 1
    src, dst = hit.state_copies[0]
    assert dst == hit.chunk.state_slot and src in driver.scheduler.checkpoints.held_slots()


def test_a_conversation_turn_reuses_the_previous_turn():
    """The next turn extends prompt + reply: it hits the checkpoint at the first prompt's
    boundary (the reply is recomputed: a request leaves no checkpoint at its end yet)."""
    driver = Driver(state_slots=2, max_concurrency=1, num_pages=64, page_size=PAGE)
    prompt = prompt_of(10)
    _, first = run_one(driver, prompt, max_tokens=6)
    turn = prompt + list(first.output_ids) + prompt_of(5, salt=3)
    cache_n, _ = run_one(driver, turn, max_tokens=6)
    assert cache_n == boundary(len(prompt), PAGE) == 8
    assert driver.scheduler.counters.cached_tokens == 8


def test_a_wrong_state_would_show():
    """The same hit with the checkpoint copy dropped gives different tokens: the tests
    above would catch a lost copy."""
    driver = Driver(state_slots=2, max_concurrency=1, num_pages=64, page_size=PAGE)
    prompt = prompt_of(22)
    run_one(driver, prompt)
    handle = driver.submit(make_request(prompt, max_tokens=4))
    scheduler = driver.scheduler
    original = scheduler._with_copies
    scheduler._with_copies = lambda plan: (scheduler.checkpoints.pop_copies(), plan)[1]
    driver.run()
    scheduler._with_copies = original
    end = drain(handle)[-1]
    assert end.usage.cached_tokens == 20
    assert list(end.output_ids) != expected_output(prompt, 4, hybrid=True)


def test_checkpoints_need_a_spare_slot_and_yield_to_residents():
    # One slot, one lane: the resident always holds it, nothing is checkpointed.
    tight = Driver(state_slots=1, max_concurrency=1, num_pages=64, page_size=PAGE)
    prompt = prompt_of(22)
    run_one(tight, prompt)
    assert tight.scheduler.checkpoints.num_checkpoints == 0
    assert [len(p.chunk.tokens) for p in tight.schedules if p.chunk] == [22]  # no split
    assert run_one(tight, prompt)[0] == 0
    # Two slots: the spare one holds the newest checkpoint, the older one is evicted.
    driver = Driver(state_slots=2, max_concurrency=1, num_pages=64, page_size=PAGE)
    other = prompt_of(22, salt=4)
    run_one(driver, prompt)
    run_one(driver, other)
    assert driver.scheduler.checkpoints.num_checkpoints == 1
    assert run_one(driver, other)[0] == 20
    assert run_one(driver, prompt)[0] == 0  # evicted when `other` left its checkpoint


def test_two_lanes_on_two_slots_evict_the_checkpoint_for_a_resident():
    driver = Driver(state_slots=2, max_concurrency=2, num_pages=64, page_size=PAGE)
    prompt = prompt_of(22)
    run_one(driver, prompt)
    assert driver.scheduler.checkpoints.num_checkpoints == 1
    handles = [driver.submit(make_request(prompt_of(9, salt=i), max_tokens=8))
               for i in (5, 6)]
    driver.run()  # the second resident takes the checkpoint's slot
    for i, handle in zip((5, 6), handles):
        assert list(drain(handle)[-1].output_ids) == expected_output(
            prompt_of(9, salt=i), 8, hybrid=True)
    assert run_one(driver, prompt)[0] == 0


def test_reclaimed_pages_take_their_checkpoint_with_them():
    # Slots to spare (no checkpoint is evicted for want of one): only the pages go.
    driver = Driver(state_slots=3, max_concurrency=1, num_pages=9, page_size=PAGE)
    prompt = prompt_of(22)
    run_one(driver, prompt)
    checkpoints, cache = driver.scheduler.checkpoints, driver.scheduler.cache
    assert checkpoints.deepest(cache.chain(prompt, 5)) == 5
    run_one(driver, prompt_of(26, salt=2), max_tokens=2)  # needs the cached pages back
    assert len(cache.chain(prompt, 5)) < 5
    assert checkpoints.num_checkpoints == 1 == driver.slots.num_used  # the new one only
    assert run_one(driver, prompt)[0] == 0


@pytest.mark.parametrize("reuse", [True, False])
def test_pause_restores_from_a_checkpoint_or_from_zero(reuse):
    driver = Driver(state_slots=6, num_pages=14, page_size=PAGE, max_concurrency=4,
                    prefill_chunk=4, prefix_reuse=reuse)
    prompts = [prompt_of(9, salt=i) for i in range(4)]
    handles = [driver.submit(make_request(p, max_tokens=20)) for p in prompts]
    driver.run()
    ends = [drain(h)[-1] for h in handles]
    for prompt, end in zip(prompts, ends):
        assert list(end.output_ids) == expected_output(prompt, 20, hybrid=True)
    assert driver.scheduler.counters.preemptions > 0
    restored = sum(e.counters["restored_cached_tokens"] for e in ends)
    assert (restored > 0) == reuse


def test_marks_add_the_cache_breakpoints():
    from ninfer_jax.engine.state_checkpoints import marks

    assert marks(22, (), 4) == (20,)
    assert marks(22, (3, 9, 13, 21, 40), 4) == (8, 12, 20)  # whole pages, none past 20


def test_a_breakpoint_checkpoint_serves_a_prompt_that_diverges_after_it():
    """A client-marked breakpoint (the end of a message) leaves a checkpoint of its own, so
    a later prompt that shares the text up to the breakpoint only reuses it."""
    driver = Driver(state_slots=3, max_concurrency=1, num_pages=64, page_size=PAGE)
    prompt = prompt_of(22)
    handle = driver.submit(make_request(prompt, max_tokens=4, cache_breakpoints=(13,)))
    driver.run()
    assert list(drain(handle)[-1].output_ids) == expected_output(prompt, 4, hybrid=True)
    chunks = [(p.chunk.start, len(p.chunk.tokens)) for p in driver.schedules if p.chunk]
    assert chunks == [(0, 12), (12, 8), (20, 2)]
    assert driver.scheduler.checkpoints.num_checkpoints == 2
    other = prompt[:14] + prompt_of(9, salt=7)
    assert run_one(driver, other)[0] == 12
