"""A sequence's block table: its pages in order (token position p lives in page p // page_size)."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import KVCacheError
from .page_pool import PagePool
from .prefix_cache import PrefixMatch, page_key


class BlockTable:
    """The physical pages of one sequence; position p lives in `pages[p // page_size]` at `p % page_size`.

    Pages are assigned lazily (`ensure_capacity` as the sequence grows) and all given back at once
    (`release`). `page_keys[i]` is the prefix-cache key of full page i, kept for every full page
    whose KV has been written (whether or not the pool cached that very page) so the hash chain can
    continue.

    Under a sliding window the pages wholly before it are given back early
    (`release_pages_before`): the first `num_released` entries of `pages` then name pages this
    table no longer holds. They keep their places so that position p stays in `pages[p //
    page_size]`; attention never reads them (its window starts after them), and another
    sequence may already be writing into them.
    """

    __slots__ = ("num_released", "page_keys", "page_size", "pages", "pool")

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.pages: list[int] = []
        self.page_keys: list[int] = []
        self.num_released = 0

    @property
    def capacity(self) -> int:
        """Token slots the assigned pages hold."""
        return len(self.pages) * self.page_size

    def append_page(self) -> int:
        """Assign one more page (the next `page_size` positions); returns its id."""
        page = self.pool.allocate()
        self.pages.append(page)
        return page

    def ensure_capacity(self, num_tokens: int) -> int:
        """Assign pages until positions 0..num_tokens-1 have slots; returns how many were added.
        All or none: when the pool cannot give them all, KVCacheError and the table is as it was."""
        needed = -(-num_tokens // self.page_size) - len(self.pages)
        if needed <= 0:
            return 0
        self.pages += self.pool.allocate_many(needed)
        return needed

    def shrink_to(self, num_tokens: int) -> int:
        """Give back the pages past those positions 0..num_tokens-1 need (speculative positions
        that were not accepted), last first; returns how many. They must hold no registered
        page: only pages of computed tokens are registered."""
        keep = -(-num_tokens // self.page_size)
        if keep < len(self.page_keys):
            raise KVCacheError(
                f"shrink_to({num_tokens}) would drop a registered page ({len(self.page_keys)} "
                f"full pages are registered)"
            )
        if keep < self.num_released:  # those entries name pages another table may hold now
            raise KVCacheError(
                f"shrink_to({num_tokens}) would drop pages this table already gave back "
                f"(the first {self.num_released} left the sliding window)"
            )
        pool = self.pool
        dropped = 0
        while len(self.pages) > keep:
            pool.release(self.pages.pop())
            dropped += 1
        return dropped

    def share(self, match: PrefixMatch) -> None:
        """Start this (empty) table with cached pages found by `PagePool.match_prefix`."""
        if self.pages:
            raise KVCacheError("a cached prefix can only start an empty block table")
        for page in match.pages:
            self.pool.retain(page)
        self.pages.extend(match.pages)
        self.page_keys.extend(match.keys)

    def register_full_pages(self, token_ids: Sequence[int], num_computed_tokens: int) -> int:
        """Offer every full page whose KV is written (the first `num_computed_tokens` positions) to
        the prefix cache. Call only after the step that computed them has run. Returns the number
        of new keys."""
        size = self.page_size
        full = min(num_computed_tokens // size, len(self.pages))
        keys = self.page_keys
        done = len(keys)
        if full <= done:
            return 0
        pages = self.pages
        register = self.pool.register
        parent = keys[-1] if done else None
        for i in range(done, full):
            tokens = tuple(token_ids[i * size : (i + 1) * size])
            key = page_key(parent, tokens)
            if i >= self.num_released:  # a page given back is not this table's to offer
                register(pages[i], key, parent, tokens)
            keys.append(key)
            parent = key
        return full - done

    def release_pages_before(self, position: int) -> int:
        """Give back every held page whose positions all lie before `position` (a sliding
        window's first visible position: no later query reads them). Returns how many. A
        page registered in the prefix cache stays there, as any released page does."""
        end = min(max(position, 0) // self.page_size, len(self.pages))
        start = self.num_released
        if end <= start:
            return 0
        pool = self.pool
        for page in self.pages[start:end]:
            pool.release(page)
        self.num_released = end
        return end - start

    def release(self) -> None:
        """Give every page back. Last page first, so the tail of a cached chain is evicted before
        its head (a chain is only useful from its first page on)."""
        pool = self.pool
        for page in reversed(self.pages[self.num_released :]):
            pool.release(page)
        self.pages.clear()
        self.page_keys.clear()
        self.num_released = 0
