"""The per-bucket graph cache the decode and prompt graphs share (no GPU: stand-in graphs)."""

from __future__ import annotations

from typing import Any

from sv_model.decode_graphs import BucketedGraphs


class _Graph:
    def __init__(self, bucket: int, pool: Any) -> None:
        self.bucket, self.pool_given = bucket, pool

    def memory_pool(self) -> str:
        return f"pool of {self.bucket}"


def test_each_size_takes_the_smallest_bucket_that_holds_it_captured_once() -> None:
    made: list[int] = []

    def capture(bucket: int, pool: Any) -> _Graph:
        made.append(bucket)
        return _Graph(bucket, pool)

    graphs = BucketedGraphs([32, 48, 64], capture)
    first = graphs.for_size(33)
    assert first is not None and first.bucket == 48 and first.pool_given is None
    assert graphs.for_size(48) is first and made == [48]  # captured once
    small = graphs.for_size(1)
    assert small is not None and small.bucket == 32 and small.pool_given == "pool of 48"
    assert graphs.for_size(65) is None and made == [48, 32]
    graphs.capture_all()
    assert made == [48, 32, 64] and graphs.captured == [32, 48, 64]
