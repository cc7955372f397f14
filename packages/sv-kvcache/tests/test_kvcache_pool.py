"""PagePool and BlockTable: allocation, refcounts, lazy growth."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sv_kvcache import BlockTable, KVCacheError, PagePool


def test_allocate_hands_out_every_id_once() -> None:
    pool = PagePool(4, page_size=16)
    assert (pool.num_free, pool.num_assigned, pool.num_available) == (4, 0, 4)
    pages = [pool.allocate() for _ in range(4)]
    assert pages == [0, 1, 2, 3]
    assert (pool.num_free, pool.num_assigned, pool.num_available) == (0, 4, 0)
    with pytest.raises(KVCacheError, match="all 4 pages are held"):
        pool.allocate()
    pool.release(2)
    assert pool.num_free == 1
    assert pool.allocate() == 2


def test_refcounts_and_release_errors() -> None:
    pool = PagePool(3)
    page = pool.allocate()
    assert pool.refcount(page) == 1
    with pytest.raises(KVCacheError, match="free"):
        pool.retain(1)  # never allocated, not cached
    pool.release(page)
    with pytest.raises(KVCacheError, match="released more often"):
        pool.release(page)
    with pytest.raises(KVCacheError, match="outside the pool"):
        pool.refcount(3)
    with pytest.raises(KVCacheError, match="outside the pool"):
        pool.release(-1)


@pytest.mark.parametrize("num_pages", [0, -3, 2.0, True])
def test_bad_pool_size(num_pages: object) -> None:
    with pytest.raises(KVCacheError, match="num_pages"):
        PagePool(num_pages)  # type: ignore[arg-type]


@given(st.integers(1, 12), st.integers(0, 12), st.integers(0, 12))
@settings(max_examples=60, deadline=None)
def test_allocate_many_matches_repeated_allocate(num_pages: int, held: int, count: int) -> None:
    """Same pages, same evictions, as `count` single allocations (with cached pages around)."""
    pools = [PagePool(num_pages, page_size=2), PagePool(num_pages, page_size=2)]
    for pool in pools:
        taken = [pool.allocate() for _ in range(min(held, num_pages))]
        for i, page in enumerate(taken):
            if i % 2 == 0:
                pool.register(page, key=1000 + i, parent_key=None, tokens=(i, i))
        for page in taken[: len(taken) // 2 + 1]:
            pool.release(page)
    single, many = pools
    if count > single.num_available:
        with pytest.raises(KVCacheError, match=f"cannot allocate {count} pages"):
            many.allocate_many(count)
        return
    expected = [single.allocate() for _ in range(count)]
    assert many.allocate_many(count) == expected
    assert many.num_evictions == single.num_evictions
    assert (many.num_free, many.num_cached, many.num_assigned) == (
        single.num_free,
        single.num_cached,
        single.num_assigned,
    )
    assert [many.refcount(p) for p in range(num_pages)] == [
        single.refcount(p) for p in range(num_pages)
    ]


def test_block_table_covers_whole_pages() -> None:
    pool = PagePool(8, page_size=16)
    pool.allocate()  # page 0 elsewhere, so the table's ids differ from its indices
    table = BlockTable(pool)
    assert table.ensure_capacity(41) == 3  # positions 0..40: pages for 0..15, 16..31, 32..47
    assert table.pages == [1, 2, 3]
    assert table.capacity == 48
    assert table.ensure_capacity(48) == 0  # position 47 is in the last page already
    assert table.ensure_capacity(49) == 1


def test_block_table_grows_lazily_and_releases() -> None:
    pool = PagePool(4, page_size=16)
    table = BlockTable(pool)
    assert table.ensure_capacity(1) == 1
    assert table.ensure_capacity(16) == 0  # still fits the first page
    assert table.ensure_capacity(17) == 1
    assert table.ensure_capacity(5) == 0  # never shrinks
    assert table.append_page() == 2
    assert table.pages == [0, 1, 2]
    assert pool.num_assigned == 3
    table.release()
    assert table.pages == [] and table.capacity == 0
    assert (pool.num_free, pool.num_assigned) == (4, 0)
    with pytest.raises(KVCacheError, match="cannot allocate 5 pages: only 4 of 4"):
        BlockTable(pool).ensure_capacity(5 * 16)


def test_block_table_that_cannot_grow_keeps_what_it_had() -> None:
    """ensure_capacity is all or none: asking for more pages than the pool has left raises and
    takes none of them, so the table and the pool are as they were."""
    pool = PagePool(4, page_size=16)
    first, second = BlockTable(pool), BlockTable(pool)
    first.ensure_capacity(16)
    second.ensure_capacity(1)
    with pytest.raises(KVCacheError, match="cannot allocate 3 pages: only 2 of 4"):
        second.ensure_capacity(4 * 16)
    assert (first.pages, second.pages) == ([0], [1])
    assert (pool.num_free, pool.num_assigned) == (2, 2)
    assert second.ensure_capacity(3 * 16) == 2
    assert second.pages == [1, 2, 3]


def test_clear_cache_frees_unheld_cached_pages_only() -> None:
    from sv_kvcache import BlockTable, PagePool

    pool = PagePool(8, page_size=2)
    held, dropped = BlockTable(pool), BlockTable(pool)
    for table, tokens in ((held, [1, 2, 3, 4]), (dropped, [5, 6, 7, 8])):
        table.ensure_capacity(4)
        table.register_full_pages(tokens, 4)
    dropped.release()
    assert pool.num_cached == 2 and pool.num_free == 4
    assert pool.clear_cache() == 2
    assert pool.num_cached == 0 and pool.num_free == 6
    assert pool.match_prefix([5, 6, 7, 8, 9], 4).num_tokens == 0  # forgotten
    assert pool.match_prefix([1, 2, 3, 4, 9], 4).num_tokens == 4  # still held, still shared


def test_shrink_to_gives_back_the_pages_past_a_length() -> None:
    pool = PagePool(8, page_size=4)
    table = BlockTable(pool)
    table.ensure_capacity(14)  # 4 pages: positions 0..15
    first_two = table.pages[:2]
    assert table.shrink_to(5) == 2  # positions 0..4 need 2 pages
    assert table.pages == first_two and pool.num_free == 6
    assert table.shrink_to(8) == 0  # nothing past 2 pages to give back
    table.register_full_pages(list(range(8)), 8)  # both pages full and registered
    with pytest.raises(KVCacheError, match="registered"):
        table.shrink_to(4)
    table.release()
    assert pool.num_available == 8


def test_shrink_to_keeps_off_pages_given_back_under_a_window() -> None:
    # Pages before a sliding window go back early (`release_pages_before`) and another table
    # may hold them now: shrinking past them would release someone else's page.
    pool = PagePool(8, page_size=4)
    table = BlockTable(pool)
    table.ensure_capacity(11)  # 3 pages: positions 0..11
    assert table.release_pages_before(9) == 2
    other = BlockTable(pool)
    other.ensure_capacity(7)  # takes pages back from the free list, maybe the released ones
    held = [pool.refcount(p) for p in range(8)]
    with pytest.raises(KVCacheError, match="already gave back"):
        table.shrink_to(4)
    assert [pool.refcount(p) for p in range(8)] == held
    assert table.shrink_to(9) == 0  # 3 pages kept: nothing to give back


@pytest.mark.parametrize("count", [-2, 1.5, True, "2"])
def test_allocate_many_refuses_a_bad_count(count: object) -> None:
    pool = PagePool(4)
    with pytest.raises(KVCacheError, match="count must be an integer >= 0"):
        pool.allocate_many(count)  # type: ignore[arg-type]
    assert (pool.num_free, pool.num_assigned) == (4, 0)
