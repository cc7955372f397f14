"""sv_kvcache: bookkeeping for a paged KV cache (stdlib only).

- `PagePool`: physical pages 0..N-1, their holders (refcounts) and the prefix cache.
- `BlockTable`: one sequence's pages (position p is in `pages[p // page_size]`); lazy growth.
- `bytes_per_page`, `pages_for_mib`, `pages_for_free_memory`: sizing arithmetic.
- `page_key`: the hash chain that names a full page by everything before it.
"""

from .block_table import BlockTable
from .errors import KVCacheError
from .page_pool import PagePool
from .prefix_cache import NO_MATCH, PrefixMatch, page_key
from .sizing import DEFAULT_PAGE_SIZE, bytes_per_page, pages_for_free_memory, pages_for_mib

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "NO_MATCH",
    "BlockTable",
    "KVCacheError",
    "PagePool",
    "PrefixMatch",
    "bytes_per_page",
    "page_key",
    "pages_for_free_memory",
    "pages_for_mib",
]
