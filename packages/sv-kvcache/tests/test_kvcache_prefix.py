"""Prefix cache: hash-chain keys, sharing with refcounts, the last-token cap, LRU eviction."""

from __future__ import annotations

import pytest
from sv_kvcache import BlockTable, KVCacheError, PagePool, page_key

PS = 4  # small pages keep the hand-worked examples short


def prompt(*pages: tuple[int, ...]) -> list[int]:
    return [t for page in pages for t in page]


A, B, C, D = (1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15, 16)


def hash_chain(tokens: list[int], num_pages: int) -> list[int]:
    """The keys of the first full pages, computed here: hash((key of the page before, tokens))."""
    keys: list[int] = []
    parent: int | None = None
    for i in range(num_pages):
        parent = hash((parent, tuple(tokens[i * PS : (i + 1) * PS])))
        keys.append(parent)
    return keys


def computed_table(pool: PagePool, tokens: list[int], computed: int | None = None) -> BlockTable:
    """A table that holds `tokens` and has written KV for the first `computed` of them."""
    table = BlockTable(pool)
    table.ensure_capacity(len(tokens))
    table.register_full_pages(tokens, len(tokens) if computed is None else computed)
    return table


def test_hash_chain_keys_by_hand() -> None:
    k0 = hash((None, A))
    k1 = hash((k0, B))
    assert page_key(None, A) == k0
    assert page_key(k0, B) == k1
    assert hash_chain(prompt(A, B, C), 2) == [k0, k1]
    # Same second page after a different first page: a different key (the whole prefix counts).
    assert page_key(page_key(None, C), B) != k1


def test_shared_prefix_refcounts_and_keys() -> None:
    pool = PagePool(16, page_size=PS)
    first = computed_table(pool, prompt(A, B, (1,)))  # 9 tokens: 2 full pages registered
    assert first.page_keys == hash_chain(prompt(A, B), 2)
    # Both full pages are cached; the third (one token) is not, whatever follows it.
    assert pool.match_prefix(prompt(A, B, (1, 0, 0, 0), (0,)), 12).pages == tuple(first.pages[:2])

    second_tokens = prompt(A, B, C, (9,))
    match = pool.match_prefix(second_tokens, len(second_tokens) - 1)
    assert match.pages == tuple(first.pages[:2])
    assert match.num_tokens == 8
    assert match.num_revived == 0  # both pages are held by `first`
    second = BlockTable(pool)
    second.share(match)
    assert [pool.refcount(p) for p in first.pages] == [2, 2, 1]
    second.ensure_capacity(len(second_tokens))
    assert second.pages[:2] == first.pages[:2]
    assert second.pages[2] not in first.pages

    # Diverging in the first page shares nothing.
    assert pool.match_prefix(prompt((1, 2, 3, 99), B, C), 11).num_tokens == 0
    # Diverging in the second page shares the first only.
    assert pool.match_prefix(prompt(A, (5, 6, 7, 99), C), 11).pages == (first.pages[0],)

    first.release()
    assert [pool.refcount(p) for p in second.pages[:2]] == [1, 1]
    second.release()
    assert pool.num_assigned == 0
    assert pool.num_cached == 2  # the two registered pages keep their KV
    assert pool.num_available == 16


def test_never_share_the_page_of_the_last_prompt_token() -> None:
    pool = PagePool(8, page_size=PS)
    computed_table(pool, prompt(A, B))
    # An identical 8-token prompt: the cap is 7 tokens, which rounds down to one full page.
    same = prompt(A, B)
    match = pool.match_prefix(same, len(same) - 1)
    assert match.num_tokens == 4
    # One more token and both full pages may be shared.
    longer = prompt(A, B, (0,))
    assert pool.match_prefix(longer, len(longer) - 1).num_tokens == 8


def test_only_computed_full_pages_are_registered() -> None:
    pool = PagePool(8, page_size=PS)
    tokens = prompt(A, B, C)
    table = computed_table(pool, tokens, computed=7)  # pages 0 written, page 1 not yet complete
    assert table.page_keys == hash_chain(tokens, 1)
    assert pool.match_prefix(tokens, 11).num_tokens == 4
    assert table.register_full_pages(tokens, 12) == 2  # the next step wrote the rest
    assert pool.match_prefix([*tokens, 0], 12).num_tokens == 12


def test_lru_eviction_order_tail_first() -> None:
    pool = PagePool(5, page_size=PS)
    a = computed_table(pool, prompt(A, B, C))  # pages 0, 1, 2
    b = computed_table(pool, prompt(D, A))  # pages 3, 4
    a.release()
    b.release()
    # Released tables go in last page first: a's tail is evicted before its head.
    assert pool.cached_pages() == [2, 1, 0, 4, 3]
    assert pool.num_free == 0 and pool.num_cached == 5
    assert pool.allocate() == 2  # evicts a's third page
    assert pool.num_evictions == 1
    # a's first two pages still match; the third is gone.
    assert pool.match_prefix(prompt(A, B, C, (0,)), 12).pages == (0, 1)
    assert pool.allocate() == 1
    assert pool.match_prefix(prompt(A, B, C, (0,)), 12).pages == (0,)


def test_sharing_a_cached_page_revives_it() -> None:
    pool = PagePool(4, page_size=PS)
    computed_table(pool, prompt(A, B)).release()
    assert pool.cached_pages() == [1, 0]
    match = pool.match_prefix(prompt(A, B, (0,)), 8)
    assert match.num_revived == 2
    table = BlockTable(pool)
    table.share(match)
    assert pool.cached_pages() == []
    assert (pool.num_assigned, pool.num_available) == (2, 2)
    # Released again: most recently released now, tail first.
    other = computed_table(pool, prompt(C))
    other.release()
    table.release()
    assert pool.cached_pages() == [2, 1, 0]


def test_duplicate_registration_keeps_the_first() -> None:
    pool = PagePool(4, page_size=PS)
    first = computed_table(pool, prompt(A, (0,)))
    second = computed_table(pool, prompt(A, (1,)))  # computed the same page in the same step
    assert second.page_keys == first.page_keys  # the chain continues either way
    assert pool.match_prefix(prompt(A, (2,)), 4).pages == (first.pages[0],)  # the first's page
    second.release()
    assert pool.num_cached == 0  # the duplicate was private: back to the free list
    assert pool.match_prefix(prompt(A, (2,)), 4).pages == (first.pages[0],)


def test_lookup_verifies_parent_and_tokens() -> None:
    pool = PagePool(4, page_size=PS)
    table = computed_table(pool, prompt(A, B))
    k0, k1 = table.page_keys
    assert pool.lookup(k1, k0, B) == table.pages[1]
    # A key that collides but with different tokens or parent is not a hit.
    assert pool.lookup(k1, k0, C) is None
    assert pool.lookup(k1, None, B) is None
    assert pool.lookup(12345, None, A) is None


def test_register_errors() -> None:
    pool = PagePool(4, page_size=PS)
    page = pool.allocate()
    with pytest.raises(KVCacheError, match="only full pages"):
        pool.register(page, 1, None, (1, 2))
    pool.register(page, 7, None, A)
    with pytest.raises(KVCacheError, match="different key"):
        pool.register(page, 8, None, A)
    assert pool.register(page, 7, None, A)  # same key again: fine
    with pytest.raises(KVCacheError, match="not held"):
        pool.register(1, 9, None, B)
    table = BlockTable(pool)
    table.ensure_capacity(1)
    with pytest.raises(KVCacheError, match="empty block table"):
        table.share(pool.match_prefix(prompt(A, (0,)), 4))
