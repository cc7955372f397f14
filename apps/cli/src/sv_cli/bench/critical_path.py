"""What each kernel of a graph-replayed decode step adds to the step's time.

Under programmatic dependent launch a kernel starts while the one before it still runs, so the
kernels' durations overlap and their sum overstates a step (BENCHMARKS.md run 88: 1,559 us of
kernel time in a ~800 us step). What a kernel costs the step is how much later the step's work
ends because of it: its end minus the latest end of the kernels before it, or nothing when it
ends before them. Over one step these shares add up to the step's span, from its first
kernel's start to its last kernel's end.

`critical_path` computes that per kernel name over replays of one step; `sv bench --profile`
prints it for decode steps of 1 and 256 rows (the profiler's kernel records go in as
`KernelSpan`s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSpan:
    """One kernel's run on the GPU, in microseconds on the profiler's clock."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class PathShare:
    """One kernel name's part of a step: per step, its calls and the microseconds it adds to
    the step's end (`path_us`); per call, its mean duration (`busy_us`)."""

    name: str
    calls: float
    path_us: float
    busy_us: float


def split_steps(kernels: Sequence[KernelSpan], steps: int) -> list[list[KernelSpan]]:
    """The kernels of `steps` replays of one graph, in order of start, as one list per replay.

    Every replay launches the same kernels, so there must be a whole number per replay; a
    ValueError otherwise (the profiler missed or added some)."""
    if steps < 1 or not kernels or len(kernels) % steps:
        raise ValueError(
            f"split_steps: {len(kernels)} kernels do not divide into {steps} replays of one graph"
        )
    ordered = sorted(kernels, key=lambda k: k.start_us)
    size = len(ordered) // steps
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def critical_path(steps: Sequence[Sequence[KernelSpan]]) -> tuple[float, list[PathShare]]:
    """(mean span of a step in us, each kernel name's share, the largest `path_us` first).

    Each step's kernels are taken in order of start; a kernel's share is how far its end moves
    the latest end seen so far in its step (at least 0)."""
    if not steps or not all(steps):
        raise ValueError("critical_path: needs at least one step, each with a kernel")
    path: dict[str, float] = {}
    busy: dict[str, float] = {}
    calls: dict[str, int] = {}
    spans = 0.0
    for step in steps:
        ordered = sorted(step, key=lambda k: k.start_us)
        first = latest = ordered[0].start_us
        for k in ordered:
            path[k.name] = path.get(k.name, 0.0) + max(0.0, k.end_us - latest)
            busy[k.name] = busy.get(k.name, 0.0) + (k.end_us - k.start_us)
            calls[k.name] = calls.get(k.name, 0) + 1
            latest = max(latest, k.end_us)
        spans += latest - first
    n = len(steps)
    shares = [
        PathShare(name, calls[name] / n, path[name] / n, busy[name] / calls[name]) for name in path
    ]
    shares.sort(key=lambda s: -s.path_us)
    return spans / n, shares


def format_path(label: str, span_us: float, shares: Sequence[PathShare]) -> str:
    """The table `sv bench --profile` prints: per kernel name, us a step on the critical path,
    its share of the span, calls a step, us per call on it and mean duration per call."""
    lines = [f"--- critical path: {label}: {span_us:.1f} us a step"]
    for s in shares:
        lines.append(
            f"  {s.path_us:8.1f} us {s.path_us / span_us:5.1%} {s.calls:6.1f}x "
            f"{s.path_us / s.calls:7.2f} us/call on the path, {s.busy_us:7.2f} running  "
            f"{s.name[:70]}"
        )
    return "\n".join(lines)
