"""HostPageStore (the JaxRunner's host-tier bytes) on the CPU: copies are bit-exact for every
page dtype, and the store holds exactly one packed page per held host slot."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.engine.host_pages import LOAD, SAVE, HostPagePool, PageCopy
from ninfer_jax.engine.pages import PagePool
from ninfer_jax.engine.prefix_cache import PrefixCache
from ninfer_jax.engine.page_store import MAX_RUN_PAGES, HostPageStore, page_bytes, waves
from ninfer_jax.kernels.paged_attention.reference import ScaledPages

NUM_PAGES = 40


def random_kv(seed=0):
    """Two attention layers (bf16 pages; 8-bit codes with f32 scales) around a state layer."""
    rng = np.random.default_rng(seed)
    shape = (NUM_PAGES, 2, 4, 8)  # pages, kv heads, page size, head dim

    def bf16():
        return jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)

    def scaled():
        codes = jnp.asarray(rng.integers(-127, 128, shape), jnp.int8)
        return ScaledPages(codes, jnp.asarray(rng.random(shape[:3]), jnp.float32))

    state = {"conv": jnp.asarray(rng.standard_normal((3, 5)), jnp.float32)}
    return [(bf16(), bf16()), state, (scaled(), scaled())]


def page_of(kv, page):
    return [np.asarray(leaf[page]) for layer in kv if isinstance(layer, tuple)
            for leaf in (layer[0], layer[1]) for leaf in
            (leaf if isinstance(leaf, ScaledPages) else (leaf,))]


def same(a, b):
    return all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(a, b))


def test_pages_come_back_bit_exact_into_other_pages():
    kv, store, host = random_kv(), HostPageStore(), HostPagePool(64)
    saved = {page: page_of(kv, page) for page in range(1, 21)}
    slots = {page: host.save(page) for page in saved}
    kv = store.apply(kv, host.pop_copies())
    # the device pages are overwritten meanwhile
    kv = [layer if isinstance(layer, dict) else jax.tree.map(jnp.zeros_like, layer)
          for layer in kv]
    targets = {page: 39 - i for i, page in enumerate(saved)}
    for page, slot in slots.items():
        host.load(slot, targets[page])
    kv = store.apply(kv, host.pop_copies())
    for page, target in targets.items():
        assert same(page_of(kv, target), saved[page])
    assert store.num_rows == len(slots) == host.num_used  # loaded rows stay: clean copies
    assert float(kv[1]["conv"][0, 0]) != 0.0  # state layers pass through untouched


def test_the_store_holds_one_page_per_held_slot_and_drops_freed_ones():
    kv, store, host = random_kv(1), HostPageStore(), HostPagePool(MAX_RUN_PAGES + 8)
    slots = [host.save(1 + i % (NUM_PAGES - 1)) for i in range(MAX_RUN_PAGES + 3)]
    kv = store.apply(kv, host.pop_copies())
    assert store.num_rows == len(slots)  # rows, not padded batches: no hidden host bytes
    for slot in slots[::3]:
        host.release(slot)
    host.load(slots[1], 5)
    host.release(slots[1])  # a load, then the drop of the row it read
    kv = store.apply(kv, host.pop_copies())
    held = [s for i, s in enumerate(slots) if i % 3 and i != 1]
    assert store.num_rows == len(held) == host.num_used
    reused = host.save(7)  # a freed slot is saved into again, after its drop
    assert reused in slots
    kv = store.apply(kv, host.pop_copies())
    assert store.num_rows == host.num_used


def test_page_bytes_counts_every_paged_leaf():
    kv = random_kv()
    per_page = 2 * (2 * 4 * 8 * 2) + 2 * (2 * 4 * 8 + 2 * 4 * 4)  # bf16 k, v; int8 + f32 scales
    assert page_bytes(kv, NUM_PAGES) == per_page


def test_saving_into_a_held_slot_is_an_error():
    kv, store = random_kv(), HostPageStore()
    kv = store.apply(kv, (PageCopy(SAVE, 3, 0),))
    with pytest.raises(AssertionError):
        store.apply(kv, (PageCopy(SAVE, 4, 0),))


def random_copies(rng, host, steps=300):
    """A random, valid queue of saves, loads and drops over NUM_PAGES device pages."""
    held = []
    for _ in range(steps):
        action = rng.random()
        if action < 0.45 and host.num_free:
            held.append(host.save(int(rng.integers(1, NUM_PAGES))))
        elif action < 0.8 and held:
            host.load(held[int(rng.integers(len(held)))], int(rng.integers(1, NUM_PAGES)))
        elif held:
            host.release(held.pop(int(rng.integers(len(held)))))
    return host.pop_copies()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_copies_applied_in_waves_equal_copies_applied_one_by_one(seed):
    rng = np.random.default_rng(seed)
    copies = random_copies(rng, HostPagePool(24))
    batched, alone = HostPageStore(), HostPageStore()
    kv_batched = batched.apply(random_kv(seed), copies)
    kv_alone = random_kv(seed)
    for copy in copies:
        kv_alone = alone.apply(kv_alone, (copy,))
    for page in range(1, NUM_PAGES):  # DUMMY_PAGE (0) absorbs the padding's writes
        assert same(page_of(kv_batched, page), page_of(kv_alone, page)), page
    assert set(batched._rows) == set(alone._rows)
    for slot, row in alone._rows.items():
        assert np.array_equal(np.asarray(row), np.asarray(batched._rows[slot]))


def test_a_restore_from_host_moves_its_pages_in_few_waves():
    """Another prompt fills the device; an evicted one comes back: its match reclaims the
    pages it needs at once and they have clean copies (written through at publish), so the
    copies are one wave of loads and nothing goes to the host."""
    pool, host = PagePool(41), HostPagePool(600)
    cache = PrefixCache(pool, page_size=2, host=host)
    first, second = list(range(100, 180)), list(range(200, 280))
    for tokens in (first, second):  # each fills all 40 pages; the second spills the first
        pages = pool.alloc(40) if pool.num_free >= 40 else None
        if pages is None:
            cache.reclaim(40)
            pages = pool.alloc(40)
        cache.publish(tokens, pages, 80, (0, 0))
        pool.release(pages)
    host.pop_copies()
    matched, _ = cache.match(first, 39)
    assert len(matched) == 39
    kinds = [sorted({c.kind for c in wave}) for wave in waves(host.pop_copies())]
    assert kinds == [[LOAD]]


def test_a_save_out_of_memory_loses_only_its_slots_and_the_loads_that_read_them():
    kv, store, host = random_kv(), HostPageStore(), HostPagePool(8)
    held = host.save(1)
    kv = store.apply(kv, host.pop_copies())
    pack = store._pack

    def out_of_memory(*args):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of host memory")

    store._pack = out_of_memory
    lost = host.save(2)
    host.load(lost, 5)
    host.load(held, 6)
    kv = store.apply(kv, host.pop_copies())
    store._pack = pack
    slots, pages, cause = store.take_failures()
    assert (slots, pages) == ({lost}, {5}) and "RESOURCE_EXHAUSTED" in cause
    assert same(page_of(kv, 6), page_of(kv, 1))  # the copies it did not hit ran
    host.release(lost)  # the scheduler forgets the slot: its drop has no row to drop
    kv = store.apply(kv, host.pop_copies())
    assert store.num_rows == 1 and store.take_failures() is None
    store._pack = lambda *args: 1 / 0  # anything but memory still ends the engine
    host.save(3)
    with pytest.raises(ZeroDivisionError):
        store.apply(kv, host.pop_copies())


def test_a_warmed_run_length_copies_without_compiling():
    """HostPageStore.warm(kv, size) compiles the save and the load of a run length, so a later
    run padded to it compiles nothing; a length it did not warm does compile."""
    from ninfer_jax.engine.page_store import RUN_SIZES
    from ninfer_jax.engine.compile_clock import COMPILE_CLOCK

    COMPILE_CLOCK.install()
    rng = np.random.default_rng(5)
    # a page shape no other test uses: jit caches are shared by every store in the process
    kv = [tuple(jnp.asarray(rng.standard_normal((NUM_PAGES, 1, 4, 8)), jnp.float32)
                for _ in range(2))]
    store = HostPageStore()
    kv = store.warm(kv, 32)
    before = COMPILE_CLOCK.here()
    kv = store.apply(kv, [PageCopy(SAVE, 1 + i, i) for i in range(20)])  # padded to 32
    kv = store.apply(kv, [PageCopy(LOAD, 21 + i, i) for i in range(20)])
    jax.block_until_ready(kv)
    assert COMPILE_CLOCK.here() == before
    assert same(page_of(kv, 21), page_of(kv, 1))
    kv = store.apply(kv, [PageCopy(SAVE, 1 + i, 100 + i) for i in range(33)])  # 32 + 1: 16
    assert COMPILE_CLOCK.here()[0] > before[0]
    assert RUN_SIZES == (16, 32, 64, 128, 256)
    assert store.run_sizes == (16, 32) and store.max_run == 32  # the CPU: rows stay here
    with pytest.raises(ValueError, match="no copy run of 24 pages"):
        store.warm(kv, 24)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="pinned host memory on a GPU")
def test_pinned_memory_taken_up_front_still_round_trips_pages():
    """reserve_pinned puts (and frees) the whole budget in pinned host memory, so XLA's pool
    has grown before any save; the saves and loads after it are bit-exact."""
    kv, store, host = random_kv(), HostPageStore(), HostPagePool(64)
    assert store.reserve_pinned(64 * page_bytes(kv, NUM_PAGES)) > 0
    saved = {page: page_of(kv, page) for page in range(1, 21)}
    slots = {page: host.save(page) for page in saved}
    kv = store.apply(kv, host.pop_copies())
    kv = [layer if isinstance(layer, dict) else jax.tree.map(jnp.zeros_like, layer)
          for layer in kv]
    for page, slot in slots.items():
        host.load(slot, page)
    kv = store.apply(kv, host.pop_copies())
    assert all(same(page_of(kv, page), saved[page]) for page in saved)


def test_nothing_is_pinned_where_device_memory_is_host_memory():
    if jax.default_backend() != "cpu":
        pytest.skip("the CPU's store keeps rows where they are")
    assert HostPageStore().reserve_pinned(1 << 30) == 0.0
