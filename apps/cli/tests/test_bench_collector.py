"""The throughput rows' account of the garbage collector's time (`sv bench`)."""

from __future__ import annotations

import gc

from sv_cli.bench import timing


def test_collector_time_counts_full_collections_and_stops_counting() -> None:
    with timing.collector_time() as collected:
        gc.collect(0)  # a young collection: time, not a full one
        gc.collect()  # a full one, by definition
    assert collected.full == 1 and collected.seconds > 0
    gc.collect()
    assert collected.full == 1  # the callback is gone
    assert str(collected).endswith("1 full collections")
