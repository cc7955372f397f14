"""The page pool as a picture: which request holds which page, which pages are cached.

One function for the step trace and the server's live dashboard, so both draw the same thing.
Pages held by more than one block table are shared (through the prefix cache); a page held by
nobody that keeps prefix-cache KV is cached; the rest are free.
"""

from __future__ import annotations

from typing import Any

from sv_scheduler import Scheduler


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
        "tables": [
            {"request": seq.request_id, "row": seq.table_row, "pages": list(seq.table.pages)}
            for seq in scheduler.running()
        ],
    }
