"""PagePool: allocation, sharing, release, and the invariant checker itself."""
import pytest

from ninfer_jax.engine.pages import DUMMY_PAGE, PagePool, PoolExhausted, pages_for


def test_dummy_page_matches_the_kernel_constant():
    reference = pytest.importorskip("ninfer_jax.kernels.paged_attention.reference")
    assert DUMMY_PAGE == reference.DUMMY_PAGE


def test_alloc_never_hands_out_the_dummy_page():
    pool = PagePool(5)
    pages = pool.alloc(4)
    assert sorted(pages) == [1, 2, 3, 4]
    assert DUMMY_PAGE not in pages
    assert pool.num_free == 0 and pool.num_used == 4 == pool.capacity
    with pytest.raises(PoolExhausted):
        pool.alloc(1)
    pool.check([pages])


def test_release_returns_pages_and_reuses_them_last():
    pool = PagePool(4)
    a = pool.alloc(2)
    pool.release(a)
    assert pool.num_free == 3
    # FIFO reuse: the never-used page comes out before the just-freed ones.
    assert pool.alloc(1) == [3]
    pool.check([[3]])


def test_shared_page_is_freed_by_its_last_holder():
    pool = PagePool(3)
    [page] = pool.alloc(1)
    pool.share(page)
    assert pool.refcount(page) == 2
    pool.release([page])
    assert pool.num_free == 1 and pool.refcount(page) == 1
    pool.check([[page]])
    pool.release([page])
    assert pool.num_free == 2
    pool.check([])


def test_release_of_a_free_page_is_refused():
    pool = PagePool(3)
    [page] = pool.alloc(1)
    pool.release([page])
    with pytest.raises(ValueError):
        pool.release([page])
    with pytest.raises(ValueError):
        pool.share(DUMMY_PAGE)


def test_check_reports_leaks_and_double_ownership():
    pool = PagePool(4)
    a = pool.alloc(2)
    with pytest.raises(AssertionError, match="refcount"):
        pool.check([])  # leaked: nobody holds them
    with pytest.raises(AssertionError, match="refcount"):
        pool.check([a, a[:1]])  # one page in two tables without a shared reference
    pool.check([a])


def test_pages_for_rounds_up():
    assert [pages_for(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
