"""Prefix-cache keys: a hash chain over full pages of token ids.

Page i of a sequence is identified by everything before it, not just its own 16 tokens: its key is
`hash((key of page i-1, tokens of page i))`, with `None` as the parent of page 0. Two sequences whose
keys agree at page i therefore agree on every token up to the end of page i, which is exactly when
the K and V stored in that page are the same (attention is causal: a position's KV depends on all
tokens before it). Python's hash of a tuple of ints is deterministic (no PYTHONHASHSEED salt); to be
safe against a 64-bit collision the pool also stores each cached page's parent key and tokens and
compares them on lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

PageTokens = tuple[int, ...]


def page_key(parent_key: int | None, page_tokens: PageTokens) -> int:
    """The key of a full page: hash of (key of the page before it, this page's token ids)."""
    return hash((parent_key, page_tokens))


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Cached pages that hold a prompt's leading full pages, found but not yet taken.

    `num_revived` counts the matched pages nobody holds right now (refcount 0, evictable): taking
    them removes them from what `PagePool.allocate` can hand out.
    """

    pages: tuple[int, ...]
    keys: tuple[int, ...]
    num_tokens: int
    num_revived: int


NO_MATCH = PrefixMatch(pages=(), keys=(), num_tokens=0, num_revived=0)
