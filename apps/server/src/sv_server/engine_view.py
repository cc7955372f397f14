"""What the live dashboard shows of the engine: the page pool, the queue and the running
requests. Built on the engine thread (the scheduler is not safe to read from another), only
while someone watches the dashboard, and at most every `VIEW_INTERVAL_S`."""

from __future__ import annotations

from typing import Any

from sv_engine import Engine
from sv_trace import pool_picture

VIEW_INTERVAL_S = 0.2


def engine_view(engine: Engine) -> dict[str, Any]:
    scheduler = engine.scheduler
    picture = pool_picture(scheduler)
    return {
        "pool": picture,
        "queue": [
            {
                "request": seq.request_id,
                "prompt_tokens": seq.num_prompt_tokens,
                "waited": seq.waited,
                "preemptions": seq.num_preemptions,
            }
            for seq in scheduler.waiting()
        ],
        "running": [
            {
                "request": seq.request_id,
                "prompt_tokens": seq.num_prompt_tokens,
                "output_tokens": seq.num_output_tokens,
                "max_new_tokens": seq.max_new_tokens,
                "phase": "decode" if seq.decoding else "prefill",
                "row": seq.table_row,
                # held now: a sliding window's pages given back stay listed in its table
                "pages": len(seq.table.pages) - seq.table.num_released,
            }
            for seq in scheduler.running()
        ],
    }
