"""The physical pages of the paged KV cache and who holds them.

A page is in exactly one of three states:

- free: holds nothing useful; on the free list.
- assigned: held by one or more sequences (refcount >= 1). More than one holder only happens through
  the prefix cache, for full pages whose KV was already written, which nobody writes again.
- cached: nobody holds it (refcount 0) but it keeps the KV of a registered full page so a later
  prompt with the same prefix can share it. Cached pages are evictable: when no page is free,
  `allocate` takes the least recently released one and forgets its key.

So `num_free + num_cached + num_assigned == num_pages` always, and `num_available`
(free + cached) is what `allocate` can still hand out.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import KVCacheError
from .prefix_cache import NO_MATCH, PageTokens, PrefixMatch, page_key
from .sizing import DEFAULT_PAGE_SIZE


class PagePool:
    """Allocates page ids 0..num_pages-1, counts their holders, and keeps the prefix cache."""

    __slots__ = (
        "_cached_lru",
        "_free",
        "_num_assigned",
        "_page_of_key",
        "_refcounts",
        "_registration",
        "num_evictions",
        "num_pages",
        "page_size",
    )

    def __init__(self, num_pages: int, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        for name, value in (("num_pages", num_pages), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KVCacheError(f"{name} must be a positive integer, got {value!r}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._refcounts = [0] * num_pages
        # A stack: pop() hands out 0, 1, 2, ... first, which keeps small runs easy to read.
        self._free = list(range(num_pages - 1, -1, -1))
        # Cached (refcount 0, registered) pages, least recently released first. A dict keeps
        # insertion order and removes any page in O(1).
        self._cached_lru: dict[int, None] = {}
        # page -> (key, parent key, tokens) for registered pages; key -> page.
        self._registration: list[tuple[int, int | None, PageTokens] | None] = [None] * num_pages
        self._page_of_key: dict[int, int] = {}
        self._num_assigned = 0
        self.num_evictions = 0

    # -- counts ---------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Pages holding nothing, not even cached KV."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Pages nobody holds that keep KV for the prefix cache (evictable)."""
        return len(self._cached_lru)

    @property
    def num_assigned(self) -> int:
        """Pages held by at least one sequence."""
        return self._num_assigned

    @property
    def num_available(self) -> int:
        """Pages `allocate` can still hand out: free ones, then cached ones by eviction."""
        return len(self._free) + len(self._cached_lru)

    def refcount(self, page: int) -> int:
        """How many block tables hold `page`."""
        self._check_page(page)
        return self._refcounts[page]

    def cached_pages(self) -> list[int]:
        """Evictable cached pages in eviction order (least recently released first)."""
        return list(self._cached_lru)

    # -- allocation -----------------------------------------------------------------------------

    def allocate(self) -> int:
        """A fresh page with refcount 1; evicts the least recently released cached page if none is free."""
        if self._free:
            page = self._free.pop()
        elif self._cached_lru:
            page = self._evict()
        else:
            raise KVCacheError(
                f"no page left to allocate: all {self.num_pages} pages are held by sequences"
            )
        self._refcounts[page] = 1
        self._num_assigned += 1
        return page

    def allocate_many(self, count: int) -> list[int]:
        """`count` fresh pages, as `count` calls of `allocate` would give, in one call (the
        scheduler's decode path hands one page to each sequence crossing a page boundary)."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise KVCacheError(f"allocate_many: count must be an integer >= 0, got {count!r}")
        if count > len(self._free) + len(self._cached_lru):
            raise KVCacheError(
                f"cannot allocate {count} pages: only {self.num_available} of "
                f"{self.num_pages} are free or cached"
            )
        free = self._free
        from_free = min(count, len(free))
        pages = free[len(free) - from_free :]
        del free[len(free) - from_free :]
        pages.reverse()  # pop() order
        for _ in range(count - from_free):
            pages.append(self._evict())
        refcounts = self._refcounts
        for page in pages:
            refcounts[page] = 1
        self._num_assigned += count
        return pages

    def retain(self, page: int) -> None:
        """One more holder of `page` (sharing a cached page); revives it if nobody held it."""
        self._check_page(page)
        count = self._refcounts[page]
        if count == 0:
            if page not in self._cached_lru:
                raise KVCacheError(
                    f"page {page} is free: only assigned or cached pages can be shared"
                )
            del self._cached_lru[page]
            self._num_assigned += 1
        self._refcounts[page] = count + 1

    def release(self, page: int) -> None:
        """One holder fewer; at zero the page becomes cached (if registered) or free."""
        self._check_page(page)
        count = self._refcounts[page]
        if count == 0:
            raise KVCacheError(f"page {page} released more often than it was allocated or shared")
        self._refcounts[page] = count - 1
        if count == 1:
            self._num_assigned -= 1
            if self._registration[page] is not None:
                self._cached_lru[page] = None
            else:
                self._free.append(page)

    # -- prefix cache ---------------------------------------------------------------------------

    def register(self, page: int, key: int, parent_key: int | None, tokens: PageTokens) -> bool:
        """Make the full, already written `page` findable under `key`.

        Returns False (and leaves `page` private) when another page is already cached under this
        key: two sequences computed the same prefix in the same step; the first one wins.
        """
        if not 0 <= page < self.num_pages or self._refcounts[page] == 0:
            self._check_page(page)
            raise KVCacheError(f"page {page} is not held by anyone: only a holder may register it")
        if len(tokens) != self.page_size:
            raise KVCacheError(
                f"only full pages can be cached: page {page} has {len(tokens)} of {self.page_size} tokens"
            )
        existing = self._registration[page]
        if existing is not None:
            if existing[0] != key:
                raise KVCacheError(f"page {page} is already cached under a different key")
            return True
        page_of_key = self._page_of_key
        if key in page_of_key:
            return False
        self._registration[page] = (key, parent_key, tokens)
        page_of_key[key] = page
        return True

    def lookup(self, key: int, parent_key: int | None, tokens: PageTokens) -> int | None:
        """The cached page for this key, if its parent key and tokens match exactly."""
        page = self._page_of_key.get(key)
        if page is None:
            return None
        entry = self._registration[page]
        if entry is None or entry[1] != parent_key or entry[2] != tokens:
            return None  # a hash collision: a different prefix
        return page

    def match_prefix(self, token_ids: Sequence[int], max_tokens: int) -> PrefixMatch:
        """The longest run of cached full pages that starts `token_ids`, at most `max_tokens` long.

        Takes nothing: pass the result to `BlockTable.share`. The caller caps `max_tokens` below
        the prompt length so the page holding the last prompt token is always computed.
        """
        size = self.page_size
        num_pages = max(0, min(max_tokens, len(token_ids)) // size)
        pages: list[int] = []
        keys: list[int] = []
        revived = 0
        parent: int | None = None
        for i in range(num_pages):
            tokens = tuple(token_ids[i * size : (i + 1) * size])
            key = page_key(parent, tokens)
            page = self.lookup(key, parent, tokens)
            if page is None:
                break
            pages.append(page)
            keys.append(key)
            if self._refcounts[page] == 0:
                revived += 1
            parent = key
        if not pages:
            return NO_MATCH
        return PrefixMatch(tuple(pages), tuple(keys), len(pages) * size, revived)

    # -- internals ------------------------------------------------------------------------------

    def clear_cache(self) -> int:
        """Forget every cached page that no sequence holds and make it free; returns how many.
        Pages still held keep their registration (their KV stays valid and shareable)."""
        pages = list(self._cached_lru)
        for page in pages:
            self._forget(page)
            self._free.append(page)
        self._cached_lru.clear()
        return len(pages)

    def _evict(self) -> int:
        """Take the least recently released cached page out of the cache."""
        page = next(iter(self._cached_lru))
        del self._cached_lru[page]
        self._forget(page)
        self.num_evictions += 1
        return page

    def _forget(self, page: int) -> None:
        entry = self._registration[page]
        if entry is not None:
            del self._page_of_key[entry[0]]
            self._registration[page] = None

    def _check_page(self, page: int) -> None:
        if not 0 <= page < self.num_pages:
            raise KVCacheError(f"page id {page} is outside the pool (0..{self.num_pages - 1})")
