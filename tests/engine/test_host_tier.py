"""The context cache: cache hints, the host tier, pause by snapshot (engine, fake runner).

The fake runner's KV holds token ids and a load consumes its host copy, so a page that comes
back wrong, stale or twice changes the output or fails: every output here is checked
against the fake model's formula computed without paging."""
import numpy as np
import pytest

from ninfer_jax.engine.host_pages import DROP, HostPagePool, LOAD, SAVE, StateCopy
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.prefix_cache import PrefixCache
from ninfer_jax.engine.request import Finished
from ninfer_jax.errors import InternalError

from engine_testkit import (
    Driver, drain, expected_output, finished, make_request, prompt_of, terminal,
)


def run_one(driver, prompt, max_tokens=3, **fields):
    handle = driver.submit(make_request(prompt, max_tokens=max_tokens, **fields))
    driver.run()
    events = drain(handle)
    end = next(e for e in events if hasattr(e, "usage"))
    assert list(end.output_ids) == expected_output(prompt, max_tokens)
    return end


def watch(driver):
    events = []
    driver.scheduler.life.listeners.append(events.append)
    return events


def test_host_pool_hands_out_slots_lazily_and_checks_holders():
    host = HostPagePool(1 << 30, page_bytes=64)  # a GiB-scale budget costs no list up front
    first, second = host.save(5), host.save(6)
    assert (first, second) == (0, 1) and host.num_used == 2
    host.load(first, 9)  # a load keeps its slot (a clean copy)
    assert host.num_used == 2
    host.release(first)
    assert [c.kind for c in host.pop_copies()] == [SAVE, SAVE, LOAD, DROP]
    assert host.save(7) == first  # a released slot is reused
    host.check([first, second])
    with pytest.raises(AssertionError):
        host.check([second])
    assert host.bytes_saved == 3 * 64 and host.bytes_loaded == 64


def test_published_pages_are_written_through_so_evictions_and_hits_move_one_way():
    pool, host = PagePool(4), HostPagePool(8)
    cache = PrefixCache(pool, page_size=2, host=host)
    tokens = [1, 2, 3, 4, 5, 6, 7]
    pages = pool.alloc(3)
    cache.publish(tokens, pages, 6, (0, 0))
    pool.release(pages)
    saves = host.pop_copies()  # at publish, root first
    assert [(c.kind, c.device_page) for c in saves] == [(SAVE, p) for p in pages]
    assert cache.num_clean_pages == 3 and host.num_used == 3
    assert cache.reclaim(3) == 3  # every page kept on the host, none copied again
    assert cache.num_pages == 0 and cache.num_host_pages == 3 and host.copies == []
    assert cache.free_evictions == 3 and cache.spilled_pages == 0
    matched, _ = cache.match(tokens, 3)
    assert len(matched) == 3 and cache.num_host_pages == 0 and cache.num_clean_pages == 3
    loads = host.pop_copies()
    slot_of = {c.device_page: c.host_slot for c in saves}
    assert [c.kind for c in loads] == [LOAD] * 3
    assert [c.host_slot for c in loads] == [slot_of[p] for p in pages]  # root first
    assert host.num_used == 3  # a hit keeps each slot as the page's clean copy
    pool.release(matched)
    assert cache.reclaim(3) == 3 and host.copies == []  # evicted again: still no copy
    pool.check([cache.pages()])
    host.check(cache.host_slots())


def test_without_room_for_a_clean_copy_an_eviction_spills():
    pool, host = PagePool(3), HostPagePool(3)  # clean copies may claim one slot
    cache = PrefixCache(pool, page_size=1, host=host)
    assert cache.clean_limit == 1
    for token in (1, 2, 3):  # three chains of one page: written through, then evicted
        page = pool.alloc(1)
        cache.publish([token], page, 1, (0, 0))
        pool.release(page)
        cache.reclaim(2)
    assert cache.num_host_pages == 3 and host.num_free == 0
    host.pop_copies()
    pages = pool.alloc(2)
    cache.publish([4], pages[:1], 1, (0, 0))  # takes the oldest host page's slot
    cache.publish([5], pages[1:], 1, (0, 0))  # the clean limit is reached: no copy
    assert cache.num_clean_pages == 1 and cache.num_host_pages == 2
    assert [c.kind for c in host.pop_copies()] == [DROP, SAVE]
    pool.release(pages)
    pool.release(cache.match([4], 1)[0])  # [4] is used again: [5] ranks lowest
    cache.reclaim(1)  # [5] spills into the slot of [4]'s copy, not of a host-only page
    assert [c.kind for c in host.pop_copies()] == [DROP, SAVE]
    assert cache.num_host_pages == 3 and cache.num_clean_pages == 0
    assert cache.spilled_pages == 1 and cache.free_evictions == 3
    pool.check([cache.pages()])
    host.check(cache.host_slots())


def test_breakpoint_pages_are_kept_longest_in_both_tiers():
    pool, host = PagePool(5), HostPagePool(1)
    cache = PrefixCache(pool, page_size=1, host=host)
    marked, plain = pool.alloc(2), pool.alloc(2)
    cache.publish([1, 2], marked, 2, (0, 0), keep_pages=2)
    cache.publish([3, 4], plain, 2, (0, 0))  # more recent, but not within a breakpoint
    pool.release(marked + plain)
    cache.reclaim(2)  # the plain chain goes first; the one host slot keeps its last spill
    assert cache.count_cached([1, 2], 2) == (2, 2)
    assert cache.count_cached([3, 4], 2) == (0, 0) and cache.num_host_pages == 1
    cache.reclaim(3)  # the marked tail needs the host slot: the plain page there gives way
    assert cache.count_cached([1, 2], 2) == (1, 1) and cache.num_host_pages == 1
    assert cache.chain([3, 4], 2) == [] and cache.match([3, 4], 2)[0] == []
    pool.check([cache.pages()])
    host.check(cache.host_slots())


def test_a_conversation_evicted_from_the_device_comes_back_from_host():
    system = prompt_of(24, salt=9)

    def conversation(host_pages):
        driver = Driver(num_pages=12, page_size=4, host_pages=host_pages)
        run_one(driver, system + [1, 2])
        for salt in range(3):  # other traffic pushes the system prompt off the device
            run_one(driver, prompt_of(30, salt=salt))
        return driver, run_one(driver, system + [1, 2, 3, 4])

    device_only, cold = conversation(0)
    tiered, warm = conversation(64)
    assert cold.usage.cached_tokens == 0
    assert warm.usage.cached_tokens == 24  # every full page of the shared prompt, verified
    cache, host = tiered.scheduler.cache, tiered.host
    assert cache.loaded_pages == 6
    # Every eviction found a copy written through at publish: the bytes went out once.
    assert cache.spilled_pages == 0 and cache.free_evictions > 0
    assert host.bytes_saved == cache.written_pages * host.page_bytes
    gauges = tiered.scheduler.gauges()  # the metrics' books: every used slot is the cache's
    assert gauges["host_pages_used"] == gauges["host_pages_cached"] == len(cache.host_slots())
    assert gauges["host_pages_clean"] == cache.num_clean_pages > 0
    assert tiered.scheduler.counters.prefill_tokens < device_only.scheduler.counters.prefill_tokens


def test_explicit_mode_publishes_only_up_to_the_breakpoints():
    driver = Driver(num_pages=32, page_size=4)
    prompt = prompt_of(18)
    run_one(driver, prompt, cache_breakpoints=(9,), cache_implicit=False)
    assert driver.scheduler.cache.num_pages == 2  # 8 tokens: the whole pages before 9
    run_one(driver, prompt_of(18, salt=1), cache_implicit=False)  # no breakpoint: no write
    assert driver.scheduler.cache.num_pages == 2
    run_one(driver, prompt_of(18, salt=2))  # implicit: every full page, output included
    assert driver.scheduler.cache.num_pages == 2 + 5
    reread = run_one(driver, prompt + [5])
    assert reread.usage.cached_tokens == 8  # a read needs no marker


def pressure_run(host_pages, prefix_reuse=True, state_slots=0):
    driver = Driver(num_pages=11, page_size=4, max_concurrency=4, prefill_chunk=4,
                    host_pages=host_pages, prefix_reuse=prefix_reuse, state_slots=state_slots)
    events = watch(driver)
    prompts = [prompt_of(6, salt=i) for i in range(4)]
    handles = [driver.submit(make_request(p, max_tokens=20)) for p in prompts]
    driver.run()
    for prompt, handle in zip(prompts, handles):
        assert list(finished(handle).output_ids) == expected_output(
            prompt, 20, hybrid=bool(state_slots))
    assert driver.request_pages() == 0
    return driver, events


@pytest.mark.parametrize("prefix_reuse", [True, False])
def test_pause_by_snapshot_restores_without_recomputation(prefix_reuse):
    driver, events = pressure_run(host_pages=64, prefix_reuse=prefix_reuse)
    counters = driver.scheduler.counters
    assert counters.preemptions > 0
    assert counters.snapshot_restores == counters.preemptions and counters.replay_restores == 0
    assert counters.replayed_tokens == 0
    cycle = [e.kind for e in events if e.seq_id == events[0].seq_id][:5]
    assert cycle == ["pause_started", "paused", "restore_started", "restored",
                     "recovery_complete"]
    assert {e.route for e in events if e.kind != "pause_started"} == {"snapshot"}
    assert {e.route for e in events if e.kind == "pause_started"} == {None}
    cache = driver.scheduler.cache
    assert driver.host.num_used == (len(cache.host_slots()) if prefix_reuse else 0)


@pytest.mark.parametrize("prefix_reuse", [True, False])
def test_a_hybrid_pause_takes_its_recurrent_state_to_host_and_back(prefix_reuse):
    """The fake state is a hash of every token fed: a slot that came back stale, from
    another sequence or from zero changes the output (fake.py)."""
    driver, events = pressure_run(host_pages=64, prefix_reuse=prefix_reuse, state_slots=6)
    counters = driver.scheduler.counters
    assert counters.preemptions > 0
    assert counters.snapshot_restores == counters.preemptions and counters.replay_restores == 0
    assert counters.replayed_tokens == 0
    assert {e.route for e in events if e.kind == "paused"} == {"snapshot"}
    loads = [c for plan in driver.schedules for c in plan.state_copies
             if isinstance(c, StateCopy) and c.kind == LOAD]
    assert len(loads) == counters.snapshot_restores
    # What the host holds now is the prefix cache's (pages, checkpoint rows), nothing paused.
    scheduler = driver.scheduler
    assert driver.host.num_used == len(scheduler.host_holders())
    assert set(driver.runner.host_state) == {row[0] for row in scheduler.host_state_rows()}
    assert prefix_reuse or driver.host.num_used == 0


def test_a_hybrid_state_takes_its_share_of_the_host_budget():
    # Three slots hold a paused request's pages (a dense model snapshots) but not its pages
    # and its state (two slots of the fake's budget) as well: the hybrid one replays.
    dense, _ = pressure_run(host_pages=3)
    hybrid, events = pressure_run(host_pages=3, state_slots=6)
    assert dense.scheduler.counters.snapshot_restores > 0
    counters = hybrid.scheduler.counters
    assert counters.preemptions > 0 and counters.snapshot_restores == 0
    assert {e.route for e in events if e.kind == "paused"} == {"replay"}


def test_without_host_room_a_pause_replays():
    driver, events = pressure_run(host_pages=1)  # too small for any paused request's pages
    counters = driver.scheduler.counters
    assert counters.preemptions > 0 and counters.snapshot_restores == 0
    assert counters.replay_restores == counters.preemptions and counters.replayed_tokens > 0
    kinds = [e.kind for e in events]
    assert "replay_complete" in kinds and "recovery_complete" in kinds
    assert {e.route for e in events if e.kind == "paused"} == {"replay"}


def test_a_snapshot_without_device_pages_to_return_to_is_revoked_for_replay():
    driver = Driver(num_pages=12, page_size=4, max_concurrency=2, prefill_chunk=4,
                    host_pages=64, prefix_reuse=False)  # no cache pages to reclaim
    events = watch(driver)
    prompts = [prompt_of(6, salt=i) for i in range(2)]
    handles = [driver.submit(make_request(p, max_tokens=30)) for p in prompts]
    while not driver.scheduler.paused:  # run until the younger request pauses by snapshot
        driver.step()
    scheduler = driver.scheduler
    (seq,) = scheduler.paused
    assert seq.snapshot is not None
    squatter = driver.pool.alloc(driver.pool.num_free)  # nothing left to restore into
    frontier, route = scheduler._load_snapshot(seq, 0)
    assert (frontier, route) == (0, "replay") and seq.snapshot is None
    assert events[-1].kind == "snapshot_revoked" and events[-1].route == "replay"
    assert scheduler.counters.snapshot_revocations == 1
    driver.pool.release(squatter)
    scheduler.paused.remove(seq)
    scheduler.life.restore(seq, 0, route)  # what _admit does next: a replay from position 0
    scheduler.resident.append(seq)
    driver.run()
    for prompt, handle in zip(prompts, handles):
        assert list(finished(handle).output_ids) == expected_output(prompt, 30)


class CopyModel:
    """The bytes of both tiers, page by page, as the runner moves them: copies applied in
    queue order before the step that writes a sequence's new pages."""

    def __init__(self):
        self.device, self.host = {}, {}

    def apply(self, copies):
        for copy in copies:
            if copy.kind == SAVE:
                assert copy.host_slot not in self.host, "a save into a held slot"
                self.host[copy.host_slot] = self.device[copy.device_page]
            elif copy.kind == LOAD:
                self.device[copy.device_page] = self.host[copy.host_slot]
            else:
                del self.host[copy.host_slot]


@pytest.mark.parametrize("seed", range(4))
def test_random_publish_evict_and_hit_keep_every_copy_exact(seed):
    """Random requests over prompts that share prefixes, evictions and snapshot-sized
    frees, on a small device pool and host tier: after every action each node's bytes, in
    each tier that holds them, are its own tokens, and the host holds exactly the cache's
    slots (no leak, no slot held twice)."""
    rng = np.random.default_rng(seed)
    page, pool = 2, PagePool(9)
    host = HostPagePool(int(rng.integers(4, 14)))
    cache, model = PrefixCache(pool, page_size=page, host=host), CopyModel()
    bases = [list(rng.integers(1, 50, 16)) for _ in range(3)]
    for _ in range(250):
        action = rng.random()
        if action < 0.7:
            tokens = bases[rng.integers(3)][:int(rng.integers(3, 17))]
            num_pages = -(-len(tokens) // page)
            matched, last = cache.match(tokens, (len(tokens) - 1) // page)
            model.apply(host.pop_copies())
            for index, p in enumerate(matched):
                assert model.device[p] == tuple(tokens[index * page:(index + 1) * page])
            missing = num_pages - len(matched)
            if missing > pool.num_free:
                cache.reclaim(missing)
            if missing > pool.num_free:
                pool.release(matched)
                continue
            pages = matched + pool.alloc(missing)
            model.apply(host.pop_copies())  # then the step computes the new pages
            for index in range(len(matched), num_pages):
                model.device[pages[index]] = tuple(tokens[index * page:(index + 1) * page])
            cache.publish(tokens, pages, len(tokens), (len(matched), last),
                          keep_pages=int(rng.integers(0, 3)))
            pool.release(pages)
        elif action < 0.9:
            cache.reclaim(int(rng.integers(1, 6)))
        else:  # a pause snapshot's room: taken, then given back
            need = int(rng.integers(1, 4))
            if cache.free_host(need):
                host.unreserve(host.reserve(need))
        model.apply(host.pop_copies())
        pool.check([cache.pages()])
        host.check(cache.host_slots())
        assert set(model.host) == set(cache.host_slots())
        assert host.num_used == cache.num_host_pages + cache.num_clean_pages
        for node in cache._nodes.values():
            if node.page is not None:
                assert model.device[node.page] == node.key[1]
            if node.host_slot is not None:
                assert model.host[node.host_slot] == node.key[1]
    assert cache.free_evictions and cache.loaded_pages


def test_copies_out_of_memory_fail_only_the_requests_that_needed_them():
    """One page copy in four runs out of memory (the fake fails it at launch, as the
    JaxRunner's store does at dispatch): the engine goes on, a request whose cached context
    did not come back fails alone, every other output stays exact, and no host slot or row
    leaks (the Driver checks both every round)."""
    faults = []

    def fault(copy):
        faults.append(len(faults) % 4 == 3)
        return faults[-1]

    driver = Driver(num_pages=12, page_size=4, max_concurrency=2, prefill_chunk=4,
                    host_pages=24, copy_fault=fault)
    system = prompt_of(24, salt=9)
    prompts = [system + [1], prompt_of(30, salt=1), system + [2], prompt_of(30, salt=2),
               system + [3], system + [4]]
    handles = []
    for prompt in prompts:  # one at a time: each long prompt pushes the system prompt out
        handles.append(driver.submit(make_request(prompt, max_tokens=3)))
        driver.run()
    handles += [driver.submit(make_request(prompt_of(6, salt=s), max_tokens=20))
                for s in range(3)]  # together: pauses by snapshot
    driver.run()
    outcomes = []
    for handle in handles:
        end = terminal(drain(handle))
        if isinstance(end, Finished):
            prompt, limit = handle.request.prompt_ids, handle.request.max_tokens
            assert list(end.output_ids) == expected_output(prompt, limit)
        else:
            assert isinstance(end.error, InternalError), end
        outcomes.append(type(end).__name__)
    assert any(faults) and "Failed" in outcomes and "Finished" in outcomes
    assert driver.request_pages() == 0


def test_a_hybrid_conversation_evicted_to_host_resumes_from_its_host_checkpoint():
    """Other traffic takes the system prompt's pages off the device and its checkpoint's
    slot (one spare slot): both go to the host tier, and the next turn starts from them.
    The fake state makes a lost, stale or misplaced state row change the tokens."""
    system = prompt_of(24, salt=9)

    def conversation(host_pages):
        driver = Driver(num_pages=12, page_size=4, host_pages=host_pages, state_slots=2,
                        max_concurrency=1)
        hybrid_run(driver, system + [1, 2])
        for salt in range(3):
            hybrid_run(driver, prompt_of(30, salt=salt))
        driver.schedules.clear()
        return driver, hybrid_run(driver, system + [1, 2, 3, 4])

    device_only, cold = conversation(0)
    tiered, warm = conversation(64)
    assert cold.usage.cached_tokens == 0
    assert warm.usage.cached_tokens == 24  # the checkpoint at the first turn's boundary
    assert list(warm.output_ids) == list(cold.output_ids)
    checkpoints, cache = tiered.scheduler.checkpoints, tiered.scheduler.cache
    assert checkpoints.spilled >= 1 and checkpoints.loaded == 1 and cache.loaded_pages == 6
    [hit] = [p for p in tiered.schedules if p.chunk is not None]
    [load] = [c for c in hit.state_copies if isinstance(c, StateCopy)]
    assert (hit.chunk.start, load.kind, load.state_slot) == (24, LOAD, hit.chunk.state_slot)
    assert load.ticket in tiered.runner.host_state  # the row stays: hits move state one way
    assert (tiered.scheduler.counters.prefill_tokens
            < device_only.scheduler.counters.prefill_tokens)


def test_hybrid_host_occupancy_in_metrics_is_exact():
    from ninfer_jax.engine.stats import build_stats
    from ninfer_jax.serve.observability.metrics import ENGINE_GAUGES, _value

    driver = Driver(num_pages=12, page_size=4, host_pages=40, state_slots=2,
                    max_concurrency=1)
    for salt in range(5):
        hybrid_run(driver, prompt_of(30, salt=salt))
    scheduler, units = driver.scheduler, driver.host.state_units
    stats = build_stats(scheduler.counters, gauges=scheduler.gauges(), ready=True,
                        healthy=True)
    values = {name: _value(stats, field) for name, _, field in ENGINE_GAUGES}
    page = driver.host.page_bytes
    rows = scheduler.checkpoints.num_host_checkpoints
    assert rows >= 1 and units == 2
    assert values["ninfer_host_context_checkpoint_bytes"] == rows * units * page
    assert values["ninfer_host_context_cached_bytes"] == len(scheduler.cache.host_slots()) * page
    assert values["ninfer_host_context_used_bytes"] == driver.host.num_used * page == (
        values["ninfer_host_context_cached_bytes"]
        + values["ninfer_host_context_checkpoint_bytes"])


def test_a_hybrid_hit_stops_at_the_deepest_checkpoint_whose_pages_came_back():
    """Pages past the last checkpoint they reach are useless to a hybrid: when the device
    pool takes back only some spilled pages, the hit keeps those up to a checkpoint."""
    driver = Driver(num_pages=12, page_size=4, host_pages=64, state_slots=2,
                    max_concurrency=1)
    prompt = prompt_of(22, salt=5)
    hybrid_run(driver, prompt, cache_breakpoints=(9,))  # checkpoints at 8 and 20
    hybrid_run(driver, prompt_of(30, salt=1))
    scheduler, cache = driver.scheduler, driver.scheduler.cache
    cache.reclaim(driver.pool.capacity)  # every cached page to the host tier
    ids = cache.chain(prompt, 5, host=True)
    assert cache.chain(prompt, 5) == [] and scheduler.checkpoints.deepest(ids) == 5
    squatter = driver.pool.alloc(driver.pool.num_free - 3)  # room for three pages only
    handle = driver.submit(make_request(prompt, max_tokens=3))
    seq = scheduler.waiting[0]
    assert scheduler._reuse_cached(seq) == 8 and len(seq.pages) == 2
    assert seq.state_source == scheduler.checkpoints.source(ids[1])
    driver.pool.release(seq.pages + squatter)  # the planned hit is abandoned: run it again
    seq.pages, seq.cache_cursor, seq.state_source = [], (0, 0), None
    driver.run()
    end = finished(handle)
    assert end.usage.cached_tokens == 20
    assert list(end.output_ids) == expected_output(prompt, 3, hybrid=True)


def hybrid_run(driver, prompt, max_tokens=3, **fields):
    handle = driver.submit(make_request(prompt, max_tokens=max_tokens, **fields))
    driver.run()
    end = finished(handle)
    assert list(end.output_ids) == expected_output(prompt, max_tokens, hybrid=True)
    return end
