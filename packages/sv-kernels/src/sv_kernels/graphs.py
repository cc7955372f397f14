"""CUDA graphs: the one capture recipe the engine and its measurements share.

A decode step is ~150 kernel launches; from Python they cost more host time than the GPU
spends on them at batch 1. Captured once into a CUDA graph, a step is one replay. torch's
rules for a capture, followed here once for every user (the model runner's decode and sampling
graphs, the GEMV tuner, the kernel benchmark):

- run the work once or twice on a side stream first, outside the capture: Triton compiles its
  kernels, cuBLAS sets up its workspaces and the caching allocator grows, none of which may
  happen inside a capture;
- capture on torch's capture stream (`torch.cuda.graph`), optionally into a memory pool shared
  with earlier graphs (graphs that never run at the same time can share their scratch);
- when a capture fails (work that cannot be captured, a host sync inside), leave the device's
  random number generator as it was: torch registers it for the capture and never releases it
  from a capture that ends in an error, so every later `torch.randn` on that GPU raised
  "Offset increment outside graph capture" (BENCHMARKS.md run 126), and so did the benchmark
  rows and tests that ran after a failed capture.

Timing a small op the way the engine runs it means replaying a graph of many calls of it over
inputs that together overflow L2 (`graph_ms_per_call`): timing one eager call measures Python's
launch cost, and timing one input set over and over measures L2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, overload

import torch

from .quantized import LinearWeight, QuantizedWeight

T = TypeVar("T")

# H100 / H200 L2 size, for when there is no device to ask (the CPU smoke runs).
DEFAULT_L2_BYTES = 60 * 2**20


def l2_bytes(device: torch.device) -> int:
    """The L2 cache size of `device` in bytes (DEFAULT_L2_BYTES off the GPU)."""
    if device.type != "cuda":
        return DEFAULT_L2_BYTES
    index = device.index if device.index is not None else torch.cuda.current_device()
    size = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0)
    return int(size) or DEFAULT_L2_BYTES


def sets_to_overflow_l2(nbytes: int, device: torch.device, most: int = 16) -> int:
    """How many distinct input sets of `nbytes` each, rotated from call to call, together
    exceed L2 twice over (at least 1, at most `most`): so a timed op reads from DRAM, as it
    does in the engine."""
    return max(1, min(most, math.ceil(2 * l2_bytes(device) / max(nbytes, 1))))


@overload
def copies_to_overflow_l2(w: torch.Tensor) -> list[torch.Tensor]: ...
@overload
def copies_to_overflow_l2(w: QuantizedWeight) -> list[QuantizedWeight]: ...
@overload
def copies_to_overflow_l2(w: LinearWeight) -> list[LinearWeight]: ...


def copies_to_overflow_l2(w: LinearWeight) -> Sequence[LinearWeight]:
    """w and enough clones of it (`sets_to_overflow_l2`) that an op timed over them in turn
    reads them from DRAM, as the engine's ops read their weights. A quantized weight's clones
    copy its data and scales; their count is set by its data's bytes."""
    if isinstance(w, QuantizedWeight):
        count = sets_to_overflow_l2(w.data.nbytes, w.device)
        return [
            w,
            *(replace(w, data=w.data.clone(), scale=w.scale.clone()) for _ in range(count - 1)),
        ]
    count = sets_to_overflow_l2(w.numel() * w.element_size(), w.device)
    return [w, *(w.clone() for _ in range(count - 1))]


def capture(
    run: Callable[[], T], *, warmups: int = 1, pool: Any = None
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Warm `run` up `warmups` times on a side stream, then capture one call of it.

    Returns the graph and what the captured call returned: its output tensors are the graph's
    static outputs, rewritten by every replay. `pool` is a memory pool handle
    (`graph.pool()` of an earlier graph) to share, or None for a pool of its own.
    """
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = run()
    except BaseException:
        # A fresh copy of the generator's seed and offset, not registered with any capture.
        generator.graphsafe_set_state(generator.clone_state())
        raise
    return graph, out


def graph_ms_per_call(
    calls: Sequence[Callable[[], object]], min_calls: int = 20, rep_ms: int = 100
) -> float:
    """Median time per call of max(min_calls, len(calls)) calls, cycling through `calls`,
    captured as one graph and replayed under `triton.testing.do_bench` (which flushes L2
    before each replay). Raises whatever capture raises for work that cannot be captured
    (a host synchronization inside, say)."""
    from triton.testing import do_bench

    count = max(min_calls, len(calls))

    def run_all() -> None:
        for i in range(count):
            calls[i % len(calls)]()

    graph, _ = capture(run_all)
    try:
        return float(do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median")) / count
    finally:
        del graph
