"""The page pool as a picture: which request holds which page, which pages are cached.

One function for the step trace and the server's live dashboard, so both draw the same thing.
Pages held by more than one block table are shared (through the prefix cache); a page held by
nobody that keeps prefix-cache KV is cached; the rest are free.

A sliding window gives back the pages its sequence has passed while the sequence runs
(`BlockTable.release_pages_before`); their entries stay at the front of its block table but name
pages another table may hold now, or the cache, or nobody. A table's `pages` are the ones it
still holds, and `released` (present when not 0) counts the entries before them.
"""

from __future__ import annotations

from typing import Any

from sv_scheduler import Scheduler, Sequence


def pool_picture(scheduler: Scheduler) -> dict[str, Any]:
    """The pool now: its counts, each running request's block table (with its table row), and
    the cached pages. Costs one pass over the running requests' pages."""
    pool = scheduler.pool
    return {
        "num_pages": pool.num_pages,
        "free": pool.num_free,
        "cached": pool.num_cached,
        "assigned": pool.num_assigned,
        "cached_pages": pool.cached_pages(),
        "tables": [_table(seq) for seq in scheduler.running()],
    }


def _table(seq: Sequence) -> dict[str, Any]:
    """A running sequence's block-table row: the pages it holds."""
    released = seq.table.num_released
    table: dict[str, Any] = {
        "request": seq.request_id,
        "row": seq.table_row,
        "pages": seq.table.pages[released:],
    }
    if released:
        table["released"] = released
    return table
