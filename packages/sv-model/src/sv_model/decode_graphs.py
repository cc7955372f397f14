"""CUDA graphs of decode steps: one per batch-size bucket, and sampling graphs beside them.

A decode step is ~10 kernel launches per layer; for a 1B model at small batch the launch gaps
would cost more than the kernels themselves, so decode replays graphs and only prefill (long,
few launches per FLOP) runs eagerly. A step of B sequences replays the graph of the smallest
bucket >= B; its padding rows feed token 0 at position 0 of the scratch table row, which writes
only the scratch page. Once a step samples, the bucket also gets one sampling graph per mix of
filters in use, and one log-probability graph when a step asks for log-probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch
from sv_kernels import graphs, ops
from torch import Tensor

from sv_model.pending_tokens import DeviceLogprobs
from sv_model.step import SamplingRows

# The decode forward pass on device tensors: (token ids, positions, table rows) -> FP32 logits.
DecodeForward = Callable[[Tensor, Tensor, Tensor], Tensor]


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, then steps of 8 up to 32, of 16 up to 128
    and of 32 beyond, ending at max_batch: a step pads its batch to the next bucket, so the
    steps are small where padding would be a large share of the batch."""
    buckets = [1, 2, 4, 8]
    while buckets[-1] < max_batch:
        buckets.append(buckets[-1] + (8 if buckets[-1] < 32 else 16 if buckets[-1] < 128 else 32))
    return [b for b in buckets if b < max_batch] + [max_batch]


class _PooledGraph(Protocol):
    def memory_pool(self) -> Any: ...


G = TypeVar("G", bound=_PooledGraph)


class BucketedGraphs(Generic[G]):
    """One graph per size bucket (ascending `buckets`), made by `capture(bucket, pool)` on first
    need (or all by `capture_all`). They share one memory pool: they never run at the same
    time. The decode graphs (by batch) and the prompt graphs (by tokens, prompt_graphs.py)."""

    def __init__(self, buckets: list[int], capture: Callable[[int, Any], G]) -> None:
        self.buckets = buckets
        self._capture = capture
        self._graphs: dict[int, G] = {}
        self._pool: Any = None

    def for_size(self, size: int) -> G | None:
        """The graph of the smallest bucket >= `size` (captured now if new); None past the
        largest."""
        bucket = next((b for b in self.buckets if b >= size), None)
        if bucket is None:
            return None
        graph = self._graphs.get(bucket)
        if graph is None:
            graph = self._graphs[bucket] = self._capture(bucket, self._pool)
            self._pool = graph.memory_pool()
        return graph

    def capture_all(self) -> None:
        for bucket in self.buckets:
            self.for_size(bucket)

    @property
    def captured(self) -> list[int]:
        """The buckets captured so far."""
        return sorted(self._graphs)


class DecodeGraphs(BucketedGraphs["DecodeGraph"]):
    """The decode graph of every batch bucket up to `max_batch`."""

    def __init__(
        self, forward: DecodeForward, last_ids: Tensor, scratch_table_row: int, max_batch: int
    ) -> None:
        super().__init__(
            decode_buckets(max_batch),
            lambda bucket, pool: DecodeGraph(bucket, forward, last_ids, scratch_table_row, pool),
        )

    def for_batch(self, batch: int) -> DecodeGraph:
        """The graph that runs a decode step of `batch` sequences (captured now if new)."""
        graph = self.for_size(batch)
        if graph is None:
            raise ValueError(f"a decode step of {batch} rows; at most {self.buckets[-1]}")
        return graph


class GraphInputs:
    """The inputs of a captured graph: pinned host buffers, and their device twins that the
    graph reads, refreshed by one asynchronous copy each before every replay. With a step in
    flight that copy may still be queued behind it, so `to_fill` waits for it to finish before
    handing the host buffers out to be written again."""

    def __init__(self, hosts: Sequence[Tensor], device: torch.device) -> None:
        self.host = [host.pin_memory() for host in hosts]
        self.dev = [host.to(device) for host in self.host]
        self._copied = torch.cuda.Event()  # type: ignore[no-untyped-call]

    def to_fill(self) -> list[np.ndarray]:
        """The host buffers (as numpy views of the same pinned memory), safe to write."""
        self._copied.synchronize()
        return [host.numpy() for host in self.host]

    def upload(self) -> None:
        for dev, host in zip(self.dev, self.host, strict=True):
            dev.copy_(host, non_blocking=True)
        self._copied.record()


class DecodeGraph:
    """A decode step at a fixed batch size, captured once and replayed.

    Inputs, one row each: token ids, positions, table rows, and the row of `last_ids` (the
    previous launch's sampled ids) holding each token still on the device (-1: the token id
    row holds it); see `StepInputs.feed`. `logits` and `ids` are its output buffers."""

    def __init__(
        self,
        batch: int,
        forward: DecodeForward,
        last_ids: Tensor,
        scratch_table_row: int,
        pool: Any,
    ) -> None:
        self.batch = batch
        self._forward = forward
        self._last_ids = last_ids
        self._scratch_table_row = scratch_table_row
        self.inputs = GraphInputs([torch.zeros((4, batch), dtype=torch.int32)], last_ids.device)
        self.inputs_to_fill(0)  # every row padding
        self.inputs.upload()
        self._graph, (self.logits, self.ids) = graphs.capture(self._run, warmups=2, pool=pool)
        self._samplers: dict[tuple[bool, bool], _SampleGraph] = {}
        self._logprobs: _LogprobGraph | None = None

    def _run(self) -> tuple[Tensor, Tensor]:
        d = self.inputs.dev[0]
        token_ids = ops.feed_tokens(d[0], d[3], self._last_ids)
        logits = self._forward(token_ids, d[1], d[2])
        return logits, ops.argmax(logits)

    def memory_pool(self) -> Any:
        """The graph's memory pool handle, for the next graph to share."""
        return self._graph.pool()

    def inputs_to_fill(self, batch: int) -> np.ndarray:
        """The pinned input rows for a replay of `batch` sequences: columns from `batch` on are
        set to padding (token 0 at position 0 of the scratch table row, which writes only the
        scratch page); the caller fills the first `batch`."""
        host = self.inputs.to_fill()[0]
        host[0, batch:] = 0
        host[1, batch:] = 0
        host[2, batch:] = self._scratch_table_row
        host[3, batch:] = -1
        return host

    def replay(self, batch: int) -> tuple[Tensor, Tensor]:
        """Run the graph on the inputs filled since `inputs_to_fill(batch)`."""
        self.inputs.upload()
        self._graph.replay()
        return self.logits[:batch], self.ids[:batch]

    def replay_inputs_in_place(self) -> None:
        """Run the graph again on the inputs its last replay copied in: no copy, no host work
        but the launch (what a benchmark times as a step's GPU cost)."""
        self._graph.replay()

    def sample(self, batch: int, sampling: SamplingRows) -> Tensor:
        """Sample the rows of the last replay's logits, through a captured sampling graph (one
        per combination of filters in use, captured on first need)."""
        key = (sampling.any_top_k(), sampling.any_top_p())
        sampler = self._samplers.get(key)
        if sampler is None:
            sampler = self._samplers[key] = _SampleGraph(self.logits, *key)
        return sampler.replay(batch, sampling)

    def logprobs(self, batch: int, ids: Tensor) -> DeviceLogprobs:
        """`ops.token_logprobs` of the last replay's logits (the top MAX_LOGPROBS), for the
        tokens `ids` [batch] chosen from them, through a captured graph (on first need)."""
        if self._logprobs is None:
            self._logprobs = _LogprobGraph(self.logits)
        return self._logprobs.replay(batch, ids)

    @property
    def num_sampling_graphs(self) -> int:
        return len(self._samplers)


class _SampleGraph:
    """`ops.sample` over a decode graph's logits buffer, captured once and replayed.

    With top-k / top-p the sampler is 19 small kernels (2 without); launched from Python they
    cost more host time than GPU time (0.7 ms a step at batch 1 on the H200 host, 2026-11-30).
    The per-row parameters live in pinned host buffers copied in before each replay; padding
    rows of the bucket sample greedily. `any_top_k` / `any_top_p` are fixed per graph, since
    they decide which kernels exist in it. Its own memory pool: its scratch must not alias the
    decode graphs' buffers, whose logits it reads.
    """

    def __init__(self, logits: Tensor, any_top_k: bool, any_top_p: bool) -> None:
        bucket = logits.shape[0]
        self.inputs = GraphInputs(
            [
                torch.zeros((2, bucket), dtype=torch.float32),  # temperature, top_p
                torch.zeros((bucket,), dtype=torch.int32),  # top_k
                torch.zeros((2, bucket), dtype=torch.int64),  # seeds, steps
            ],
            logits.device,
        )
        self._fill(0, None)  # every row padding
        self.inputs.upload()
        floats, top_k, ints = self.inputs.dev

        def draw() -> Tensor:
            return ops.sample(
                logits,
                floats[0],
                top_k,
                floats[1],
                ints[0],
                ints[1],
                any_top_k=any_top_k,
                any_top_p=any_top_p,
            )

        self.graph, self.ids = graphs.capture(draw)

    def _fill(self, batch: int, sampling: SamplingRows | None) -> None:
        """The first `batch` rows from `sampling`; the rest greedy (temperature 0, no filters)."""
        floats, top_k, ints = self.inputs.to_fill()
        if sampling is not None:
            floats[0, :batch] = sampling.temperature
            floats[1, :batch] = sampling.top_p
            top_k[:batch] = sampling.top_k
            ints[0, :batch] = sampling.seeds
            ints[1, :batch] = sampling.steps
        floats[0, batch:] = 0.0
        floats[1, batch:] = 1.0
        top_k[batch:] = 0
        ints[:, batch:] = 0

    def replay(self, batch: int, sampling: SamplingRows) -> Tensor:
        self._fill(batch, sampling)
        self.inputs.upload()
        self.graph.replay()
        return self.ids[:batch]


class _LogprobGraph:
    """`ops.token_logprobs` over a decode graph's logits buffer, captured once and replayed.

    The chosen ids are copied into its own input buffer on the device first (they come from
    the decode graph's argmax or a sampling graph); padding rows read token 0. Its outputs are
    overwritten by the next replay, so the caller copies them out behind it (PendingTokens).
    """

    def __init__(self, logits: Tensor) -> None:
        self._ids = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
        self.graph, self.out = graphs.capture(
            lambda: ops.token_logprobs(logits, self._ids, ops.MAX_LOGPROBS)
        )

    def replay(self, batch: int, ids: Tensor) -> DeviceLogprobs:
        self._ids[:batch].copy_(ids)
        self.graph.replay()
        chosen, values, top_ids = self.out
        return chosen[:batch], values[:batch], top_ids[:batch]
