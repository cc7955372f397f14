"""How `sv bench` times things: CUDA events around a call, graph replays queued back to back
(so the host's speed cannot leave the GPU idle in the timed span), the rooflines every figure
is divided by (copy bandwidth, BF16 GEMM rate, pinned host-to-device copies), the host's own
speed, and the instruments a throughput row reports beside its figure (each step's host and GPU
time, the garbage collector's time)."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

from sv_cli.bench.report import Report, Row


def cuda_ms(fn: Callable[[], object], iters: int = 10, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    times.sort()
    return times[len(times) // 2]


def back_to_back(replay: Callable[[], object], replays: int) -> Callable[[], None]:
    """A call that queues `replay` (a graph's bare replay) `replays` times without waiting."""

    def replay_all() -> None:
        for _ in range(replays):
            replay()

    return replay_all


def replayed_ms(replay: Callable[[], object], replays: int = 20) -> float:
    """GPU ms of one `replay`, queued `replays` times back to back between two events so that
    the host's speed cannot leave the GPU idle in the timed span."""
    return cuda_ms(back_to_back(replay, replays), iters=5, warmup=1) / replays


def _copy_bandwidth(nbytes: int) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    import torch

    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / (cuda_ms(lambda: dst.copy_(src)) / 1e3)


def _gemm_rate(n: int) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    return 2 * n**3 / (cuda_ms(lambda: a @ b) / 1e3)


def _h2d_bandwidth(nbytes: int) -> float:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return nbytes / (cuda_ms(lambda: dev.copy_(host, non_blocking=True), iters=5) / 1e3)


def host_probe_ms() -> float:
    """Milliseconds for a fixed pure-Python loop: how fast the host is right now. The device
    host's speed drifts (0.12-0.29 s for this loop within one session, 2026-11-30), and every
    host-bound figure (load, throughput, serving) moves with it; the report records it at the
    start and the end of a run."""
    t0 = time.perf_counter()
    sum(range(10**7))
    return (time.perf_counter() - t0) * 1e3


def measure_rooflines(report: Report) -> dict[str, float]:
    import torch

    roof = {
        "copy_bw": _copy_bandwidth(1 << 30),
        "gemm": _gemm_rate(8192),
        "h2d": _h2d_bandwidth(1 << 30),
    }
    torch.cuda.empty_cache()
    report.add(Row("roofline: d2d copy bandwidth", roof["copy_bw"] / 1e9, "GB/s"))
    report.add(Row("roofline: bf16 GEMM 8192^3", roof["gemm"] / 1e12, "TFLOP/s"))
    report.add(Row("roofline: pinned h2d copy", roof["h2d"] / 1e9, "GB/s"))
    report.add(Row("host probe at start", host_probe_ms(), "ms", note="sum(range(10**7))"))
    return roof


def free_device_memory() -> None:
    """Give a dropped engine's device memory back now: an engine holds reference cycles, so
    its KV pool would wait for a full collection, which then runs inside the next timed
    benchmark (146 ms in run 87's throughput-b64) while that one's engine sizes its pool on
    the memory not yet freed."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()


class CollectorTime:
    """Time spent in Python's garbage collector, and its full collections, while open."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.full += info["generation"] == 2

    def __str__(self) -> str:
        return f"garbage collector {self.seconds * 1e3:.0f} ms, {self.full} full collections"


class StepTimes:
    """Each launched step's host time (queueing it) and GPU time (CUDA events around it),
    apart for steps that feed a chunk of several tokens (prompts; a verify step's drafts too)
    and for decode steps: a step whose host time reaches its GPU time left the GPU waiting on
    Python (BENCHMARKS.md, run 162)."""

    def __init__(self) -> None:
        self._steps: list[tuple[bool, float, Any, Any]] = []

    def record(self, prompt: bool, host_s: float, start: Any, end: Any) -> None:
        self._steps.append((prompt, host_s, start, end))

    def __str__(self) -> str:
        parts = []
        for prompt, name in ((True, "prompt"), (False, "decode")):
            steps = [s for s in self._steps if s[0] == prompt]
            if steps:
                gpu = sum(start.elapsed_time(end) for _, _, start, end in steps)
                host = sum(s[1] for s in steps) * 1e3
                parts.append(f"{len(steps)} {name}: GPU {gpu:,.0f} ms, host {host:,.0f} ms")
        return "; ".join(parts)


@contextlib.contextmanager
def step_times(runner: Any) -> Iterator[StepTimes]:
    """Time every `runner.launch` while open (the GPU figures are read when printed, after the
    run: reading them synchronizes)."""
    import torch

    times = StepTimes()
    launch = runner.launch

    def timed(step: Any) -> Any:
        started = time.perf_counter()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        pending = launch(step)
        end.record()
        times.record(any(n > 1 for n in step.query_lens), time.perf_counter() - started, start, end)
        return pending

    runner.launch = timed
    try:
        yield times
    finally:
        runner.launch = launch


@contextlib.contextmanager
def collector_time() -> Iterator[CollectorTime]:
    """A collection that walks every live object can stall a step by 100+ ms (BENCHMARKS.md,
    run 83): the throughput rows say how much of their time it took."""
    timer = CollectorTime()
    gc.callbacks.append(timer)
    try:
        yield timer
    finally:
        gc.callbacks.remove(timer)
