"""Model-based test of PagePool + BlockTable + prefix cache (hypothesis stateful).

The model is written independently of the implementation: sets and lists for free/cached pages,
a dict for the prefix cache, and a fake KV store where each written slot holds a value that depends
on the whole token prefix (as real K/V do). Reading a shared page must give back exactly the
values the sequence would have computed itself.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sv_kvcache import BlockTable, PagePool

PAGE_SIZE = 3
PREFIXES = [[], [1, 2, 3], [1, 2, 3, 4, 5, 6], [7, 7, 7, 1, 2]]


def kv_value(tokens: list[int], position: int) -> int:
    return hash(tuple(tokens[: position + 1]))


def place(table: BlockTable, position: int) -> tuple[int, int]:
    """(page, offset in the page) of a token position."""
    page_index, offset = divmod(position, PAGE_SIZE)
    return table.pages[page_index], offset


def hash_chain(tokens: list[int], num_pages: int) -> list[tuple[int, int | None, tuple[int, ...]]]:
    """(key, parent key, tokens) of the first full pages: key = hash((parent key, tokens))."""
    chain: list[tuple[int, int | None, tuple[int, ...]]] = []
    parent: int | None = None
    for i in range(num_pages):
        page_tokens = tuple(tokens[i * PAGE_SIZE : (i + 1) * PAGE_SIZE])
        key = hash((parent, page_tokens))
        chain.append((key, parent, page_tokens))
        parent = key
    return chain


class Table:
    def __init__(self, table: BlockTable, tokens: list[int]) -> None:
        self.table = table
        self.tokens = tokens
        self.computed = 0
        self.num_keys = 0


class PrefixCacheMachine(RuleBasedStateMachine):
    @initialize(num_pages=st.integers(2, 16))
    def setup(self, num_pages: int) -> None:
        self.pool = PagePool(num_pages, page_size=PAGE_SIZE)
        self.num_pages = num_pages
        self.tables: list[Table] = []
        self.free = set(range(num_pages))
        self.lru: list[int] = []  # cached, evictable, least recently released first
        self.key_of_page: dict[int, int] = {}
        self.page_of_key: dict[int, int] = {}
        self.entry_of_key: dict[int, tuple[int | None, tuple[int, ...]]] = {}  # parent, tokens
        self.kv: dict[tuple[int, int], int] = {}

    # -- model helpers --------------------------------------------------------------------------

    def refcounts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for t in self.tables:
            for page in t.table.pages:
                counts[page] = counts.get(page, 0) + 1
        return counts

    def check_new_pages(self, pages: list[int]) -> None:
        for page in pages:
            if self.free:
                assert page in self.free, f"page {page} handed out but not free"
                self.free.remove(page)
            else:
                assert self.lru and page == self.lru[0], "eviction must take the LRU cached page"
                self.lru.pop(0)
                key = self.key_of_page.pop(page)
                del self.page_of_key[key], self.entry_of_key[key]

    def compute(self, t: Table, upto: int) -> None:
        """Write KV for positions computed..upto-1, then register full pages (the step ran)."""
        holders = self.refcounts()
        for pos in range(t.computed, upto):
            page, offset = place(t.table, pos)
            assert holders[page] == 1, f"write into shared page {page}"
            assert page not in self.key_of_page, f"write into cached page {page}"
            self.kv[(page, offset)] = kv_value(t.tokens, pos)
        t.computed = upto
        chain = hash_chain(t.tokens, upto // PAGE_SIZE)
        t.table.register_full_pages(t.tokens, upto)
        for i in range(t.num_keys, len(chain)):
            page = t.table.pages[i]
            key, parent, page_tokens = chain[i]
            if key not in self.page_of_key:
                self.page_of_key[key] = page
                self.key_of_page[page] = key
                self.entry_of_key[key] = (parent, page_tokens)
        t.num_keys = len(chain)
        assert t.table.page_keys == [key for key, _, _ in chain]

    # -- rules ----------------------------------------------------------------------------------

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(1, 3), max_size=7))
    def new_sequence(self, prefix: list[int], tail: list[int]) -> None:
        tokens = prefix + tail
        if not tokens:
            return
        # Expected match, from the model's own dict, capped below the last token.
        expected: list[int] = []
        for key, _, _ in hash_chain(tokens, (len(tokens) - 1) // PAGE_SIZE):
            if key not in self.page_of_key:
                break
            expected.append(self.page_of_key[key])
        match = self.pool.match_prefix(tokens, len(tokens) - 1)
        assert list(match.pages) == expected
        holders = self.refcounts()
        assert match.num_revived == sum(1 for p in expected if p not in holders)
        needed = -(-len(tokens) // PAGE_SIZE) - len(expected)
        if needed > len(self.free) + len(self.lru) - match.num_revived:
            return  # does not fit: the scheduler would not admit it
        table = BlockTable(self.pool)
        table.share(match)
        for page in expected:
            if page not in holders:
                self.lru.remove(page)
        t = Table(table, tokens)
        t.computed = match.num_tokens
        t.num_keys = len(expected)
        self.tables.append(t)
        table.ensure_capacity(len(tokens))
        self.check_new_pages(table.pages[len(expected) :])
        # The shared pages already hold exactly this prompt's KV.
        for pos in range(match.num_tokens):
            assert self.kv[place(table, pos)] == kv_value(tokens, pos)
        self.compute(t, len(tokens))

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), extra=st.lists(st.integers(1, 3), min_size=1, max_size=5))
    def grow(self, data: st.DataObject, extra: list[int]) -> None:
        t = data.draw(st.sampled_from(self.tables))
        new_len = len(t.tokens) + len(extra)
        needed = -(-new_len // PAGE_SIZE) - len(t.table.pages)
        if needed > len(self.free) + len(self.lru):
            return
        t.tokens = t.tokens + extra
        old = len(t.table.pages)
        t.table.ensure_capacity(new_len)
        self.check_new_pages(t.table.pages[old:])
        self.compute(t, new_len)

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.tables))
        self.tables.remove(t)
        pages = list(t.table.pages)
        t.table.release()
        holders = self.refcounts()
        for page in reversed(pages):
            if page in holders:
                continue
            if page in self.key_of_page:
                if page not in self.lru:
                    self.lru.append(page)
            else:
                self.free.add(page)

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def accounting(self) -> None:
        pool = self.pool
        holders = self.refcounts()
        assert pool.num_free + pool.num_cached + pool.num_assigned == self.num_pages
        assert pool.num_assigned == len(holders)
        assert pool.num_free == len(self.free)
        assert pool.cached_pages() == self.lru
        for page in range(self.num_pages):
            assert pool.refcount(page) == holders.get(page, 0)
            if holders.get(page, 0) > 1:
                assert page in self.key_of_page, "only cached pages may be shared"
        # Every page the model holds as cached is found under its key (held or not); pages the
        # model holds as uncached are never matched (new_sequence compares match_prefix).
        for key, page in self.page_of_key.items():
            parent, page_tokens = self.entry_of_key[key]
            assert pool.lookup(key, parent, page_tokens) == page

    @invariant()
    def every_sequence_reads_its_own_kv(self) -> None:
        for t in self.tables:
            assert len(set(t.table.pages)) == len(t.table.pages)
            for pos in range(t.computed):
                assert self.kv[place(t.table, pos)] == kv_value(t.tokens, pos)


TestPrefixCache = PrefixCacheMachine.TestCase
TestPrefixCache.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
