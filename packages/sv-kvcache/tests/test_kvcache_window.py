"""Pages wholly before a sliding window given back early (`BlockTable.release_pages_before`):
the pool's counts, shared prefix pages, the prefix-cache chain, and the final release."""

from __future__ import annotations

from sv_kvcache import BlockTable, PagePool
from sv_kvcache.prefix_cache import page_key

PAGE = 4


def test_pages_before_the_window_go_back_and_positions_keep_their_places() -> None:
    pool = PagePool(16, page_size=PAGE)
    table = BlockTable(pool)
    table.ensure_capacity(22)  # 6 pages
    pages = list(table.pages)
    assert table.release_pages_before(3) == 0  # position 3 still sees page 0
    assert table.release_pages_before(9) == 2  # positions 0..7 are behind the window
    assert pool.num_assigned == 4 and pool.num_free == 12
    assert table.pages == pages and table.num_released == 2  # page of p is still pages[p // 4]
    assert table.release_pages_before(8) == 0  # the window never moves back
    table.release()
    assert pool.num_free == 16 and table.pages == [] and table.num_released == 0


def test_a_shared_prefix_page_stays_with_its_other_holder() -> None:
    pool = PagePool(16, page_size=PAGE)
    tokens = list(range(12))
    first = BlockTable(pool)
    first.ensure_capacity(12)
    first.register_full_pages(tokens, 12)
    match = pool.match_prefix([*tokens, 99], 12)
    second = BlockTable(pool)
    second.share(match)
    assert [pool.refcount(p) for p in first.pages] == [2, 2, 2]
    second.release_pages_before(8)
    assert [pool.refcount(p) for p in first.pages] == [1, 1, 2]
    first.release()
    second.release()
    assert pool.num_assigned == 0 and pool.num_free + pool.num_cached == 16


def test_the_prefix_cache_chain_continues_past_released_pages() -> None:
    """Keys of pages registered after the head went back equal those of a table that kept its
    head (the chain hashes tokens, not pages), and the released pages are not registered again
    (another sequence may be writing into them)."""
    pool = PagePool(32, page_size=PAGE)
    tokens = list(range(100, 120))
    windowed = BlockTable(pool)
    windowed.ensure_capacity(20)
    windowed.register_full_pages(tokens, 4)  # page 0 registered while held
    windowed.release_pages_before(12)  # pages 0..2 back; 1 and 2 were never registered
    reused = pool.allocate()  # may be one of them: another sequence writes it now
    assert windowed.register_full_pages(tokens, 20) == 4
    parent = None
    for i in range(5):
        parent = page_key(parent, tuple(tokens[i * PAGE : (i + 1) * PAGE]))
        assert windowed.page_keys[i] == parent
    released = set(windowed.pages[1:3])
    assert not any(pool.refcount(p) > 0 for p in released if p != reused)
    match = pool.match_prefix(tokens, 19)
    assert list(match.pages) == [windowed.pages[0]]  # page 1 is not in the cache: the chain stops
    pool.release(reused)
    windowed.release()
    assert pool.num_assigned == 0
