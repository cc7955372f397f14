"""Step timings for the trace: wall time on the host, and CUDA events on the GPU.

A step's host time runs from its plan to the return of its launch (on the CPU that is the whole
forward pass, which runs synchronously; on CUDA only the queueing). Its device time is measured
between two CUDA events recorded on the stream around the launch, so with the overlapped step
loop it is the GPU's own time for that step, read once its tokens are back.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    """The timings of one step, started when it is planned."""

    __slots__ = ("_end", "_host_ms", "_start", "_t0")

    def __init__(self, cuda: bool) -> None:
        self._t0 = time.perf_counter()
        self._host_ms: float | None = None
        self._start: torch.cuda.Event | None = None
        self._end: torch.cuda.Event | None = None
        if cuda:
            self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._start.record()

    def launched(self) -> None:
        self._host_ms = (time.perf_counter() - self._t0) * 1e3
        if self._start is not None:
            self._end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._end.record()

    def result(self) -> dict[str, float | str | None]:
        """The timings, once the step's tokens are back: host_ms, span_ms (plan to tokens, on
        the host), device_ms (None without CUDA) and which clock measured the device."""
        device_ms = None
        if self._start is not None and self._end is not None:
            self._end.synchronize()
            device_ms = float(self._start.elapsed_time(self._end))
        return {
            "clock": "cuda" if self._start is not None else "wall",
            "host_ms": self._host_ms,
            "span_ms": (time.perf_counter() - self._t0) * 1e3,
            "device_ms": device_ms,
        }
