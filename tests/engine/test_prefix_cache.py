"""Prefix reuse: shared pages across requests, eviction before pausing, exact outputs."""
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.prefix_cache import PrefixCache
from ninfer_jax.engine.request import Admitted

from engine_testkit import Driver, drain, expected_output, finished, make_request, prompt_of


def cache_n_of(events):
    return next(e.cache_n for e in events if isinstance(e, Admitted))


def test_publish_match_and_reclaim():
    pool = PagePool(8)
    cache = PrefixCache(pool, page_size=2)
    tokens = [5, 6, 7, 8, 9, 10, 11]
    pages = pool.alloc(4)
    cursor = cache.publish(tokens, pages, num_computed=5, cursor=(0, 0))  # 2 full pages
    assert cursor[0] == 2 and cache.num_pages == 2
    cursor = cache.publish(tokens, pages, num_computed=7, cursor=cursor)  # one more
    assert cache.num_pages == 3
    assert cache.count_cached([5, 6, 7, 8, 0, 0], 3) == (2, 0)  # all still held by the owner
    matched, _ = cache.match([5, 6, 7, 8, 0, 0], max_pages=3)
    assert matched == pages[:2] and pool.refcount(pages[0]) == 3  # owner, cache, new reader
    pool.release(matched)
    pool.release(pages)  # the owner finishes: the cached pages stay, one is freed
    assert pool.num_free == 4 and pool.num_used == cache.num_pages == 3
    pool.check([cache.pages()])
    assert cache.reclaim(5) == 1 and pool.num_free == 5
    pool.check([cache.pages()])
    cache.clear()
    assert pool.num_free == 7 and cache.num_pages == 0


def test_reclaim_shortens_chains_from_the_tail():
    pool = PagePool(6)
    cache = PrefixCache(pool, page_size=1)
    pages = pool.alloc(3)
    cache.publish([1, 2, 3], pages, 3, (0, 0))
    pool.release(pages)
    assert cache.reclaim(3) == 1
    assert cache.count_cached([1, 2, 3], 3) == (2, 2)  # the prefix [1, 2] is still there
    cache.clear()
    assert pool.num_free == 5


def test_reclaim_skips_held_leaves_and_prefers_the_least_recently_used():
    pool = PagePool(8)
    cache = PrefixCache(pool, page_size=1)
    old, held, recent = pool.alloc(2), pool.alloc(2), pool.alloc(2)
    cache.publish([1, 2], old, 2, (0, 0))
    cache.publish([3, 4], held, 2, (0, 0))
    cache.publish([5, 6], recent, 2, (0, 0))
    pool.release(old + recent)  # `held` stays with its sequence
    cache.match([1, 2], 2)  # the old chain is used again: now the most recent
    pool.release(old)
    assert cache.reclaim(3) == 2  # a free page plus two: the [5, 6] chain, tail first
    assert cache.count_cached([5, 6], 2) == (0, 0)
    assert cache.count_cached([1, 2], 2) == (2, 2) and cache.count_cached([3, 4], 2) == (2, 0)
    pool.check([cache.pages(), held])


def test_clear_drops_descendants_with_their_parent():
    pool = PagePool(6)
    cache = PrefixCache(pool, page_size=1)
    pages = pool.alloc(3)
    cache.publish([1, 2, 3], pages, 3, (0, 0))
    pool.release(pages)
    cache.clear()
    assert cache.num_pages == 0 and pool.num_free == 5


def test_identical_prompt_reuses_full_pages():
    driver = Driver(page_size=4, prefill_chunk=64)
    prompt = prompt_of(11)
    first = driver.submit(make_request(prompt, max_tokens=4))
    driver.run()
    second = driver.submit(make_request(prompt, max_tokens=4))
    driver.run()
    first_events, second_events = drain(first), drain(second)
    assert cache_n_of(first_events) == 0 and cache_n_of(second_events) == 8
    assert first_events[-1].output_ids == second_events[-1].output_ids
    assert list(second_events[-1].output_ids) == expected_output(prompt, 4)
    assert second_events[-1].usage.cached_tokens == 8
    starts = [(s.chunk.start, len(s.chunk.tokens)) for s in driver.schedules if s.chunk]
    assert starts == [(0, 11), (8, 3)]
    assert driver.scheduler.counters.cached_tokens == 8


def test_prompt_within_one_page_of_a_cached_one_keeps_a_token_to_compute():
    driver = Driver(page_size=4)
    prompt = prompt_of(8)
    driver.submit(make_request(prompt, max_tokens=2))
    driver.run()
    again = driver.submit(make_request(prompt, max_tokens=2))
    driver.run()
    events = drain(again)
    assert cache_n_of(events) == 4  # not 8: the last prompt token must run to sample
    assert list(events[-1].output_ids) == expected_output(prompt, 2)


def test_shared_prefix_with_a_different_suffix():
    driver = Driver(page_size=4, max_concurrency=2)
    base = prompt_of(9)
    driver.submit(make_request(base + [1, 2, 3], max_tokens=3))
    driver.run()
    other = driver.submit(make_request(base + [4, 5, 6], max_tokens=3))
    driver.run()
    events = drain(other)
    assert cache_n_of(events) == 8
    assert list(events[-1].output_ids) == expected_output(base + [4, 5, 6], 3)


def test_running_requests_share_pages():
    driver = Driver(page_size=4, max_concurrency=2, max_context=128)
    prompt = prompt_of(13)
    first = driver.submit(make_request(prompt, max_tokens=20))
    driver.step()  # the whole prompt in one unit: its pages are published
    second = driver.submit(make_request(prompt, max_tokens=20))
    driver.step()
    shared = driver.scheduler.resident[0].pages[:3]
    assert driver.scheduler.resident[1].pages[:3] == shared
    assert all(driver.pool.refcount(page) == 3 for page in shared)  # two requests + cache
    driver.run()
    assert finished(first).output_ids == finished(second).output_ids


def test_no_prefix_reuse_disables_the_cache():
    driver = Driver(page_size=4, prefix_reuse=False)
    prompt = prompt_of(11)
    for _ in range(2):
        handle = driver.submit(make_request(prompt, max_tokens=3))
        driver.run()
        assert cache_n_of(drain(handle)) == 0
    assert driver.scheduler.cache is None and driver.pool.num_used == 0


def test_cached_history_is_reclaimed_before_any_pause():
    driver = Driver(num_pages=9, page_size=4, max_concurrency=2, max_context=64)
    driver.submit(make_request(prompt_of(20), max_tokens=8))
    driver.run()
    assert driver.scheduler.cache.num_pages == 6
    # Two new requests need the whole pool between them: the cache gives way, nobody pauses.
    handles = [driver.submit(make_request(prompt_of(6, salt=s), max_tokens=10))
               for s in (1, 2)]
    driver.run()
    assert driver.scheduler.counters.preemptions == 0
    for salt, handle in zip((1, 2), handles):
        assert list(finished(handle).output_ids) == expected_output(prompt_of(6, salt=salt), 10)


def test_restore_takes_its_own_pages_back_from_the_cache():
    driver = Driver(num_pages=11, page_size=4, max_concurrency=2)
    old = driver.submit(make_request(prompt_of(4), max_tokens=30))
    young = driver.submit(make_request(prompt_of(4, salt=1), max_tokens=30))
    driver.run()
    end = finished(young)
    assert end.counters["preemptions"] >= 1
    assert end.counters["restored_cached_tokens"] > 0
    assert list(end.output_ids) == expected_output(prompt_of(4, salt=1), 30)
    assert list(finished(old).output_ids) == expected_output(prompt_of(4), 30)


def test_history_of_identical_runs_does_not_make_a_restore_thrash():
    """The same four requests run alone (filling the cache with their history), then together
    in a pool too small for all of them: the youngest is paused about once, not paused and
    restored round after round because cached-but-pinned pages looked reclaimable."""
    driver = Driver(num_pages=65, page_size=16, max_concurrency=8, prefill_chunk=64,
                    max_context=1024)
    prompts = [prompt_of(30 + i, salt=i) for i in range(4)]
    for prompt in prompts:
        driver.submit(make_request(prompt, max_tokens=240))
        driver.run()
    handles = [driver.submit(make_request(p, max_tokens=240)) for p in prompts]
    driver.run()
    assert 1 <= driver.scheduler.counters.preemptions <= 2
    for prompt, handle in zip(prompts, handles):
        assert list(finished(handle).output_ids) == expected_output(prompt, 240)


def test_twin_computed_pages_leave_no_copy_pinned_under_a_longer_run():
    """Two requests admitted together compute the same prompt pages: the cache keeps one
    copy. The short one ends; the long one, alone, then grows to the context end in a pool
    of exactly one context. Were it to keep its duplicates, the cache's copies would sit
    under its later pages (device nodes are prefix-closed, so they cannot be evicted) and
    the long request would end with "length" before its max_tokens."""
    page_size, max_context = 2, 24
    driver = Driver(num_pages=max_context // page_size + 1, page_size=page_size,
                    max_concurrency=2, max_context=max_context)
    prompt = prompt_of(8)
    short = driver.submit(make_request(prompt, max_tokens=5))
    long = driver.submit(make_request(prompt, max_tokens=max_context - len(prompt)))
    driver.run()
    assert finished(short).output_ids == tuple(expected_output(prompt, 5))
    end = finished(long)
    assert end.reason == "length"
    assert end.output_ids == tuple(expected_output(prompt, max_context - len(prompt)))
    assert driver.request_pages() == 0
