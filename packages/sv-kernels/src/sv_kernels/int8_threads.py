"""How many of torch's threads the CPU int8 matmul runs on: one, or all, whichever its own
recent calls measured faster.

torch's int8 kernel (`torch._weight_int8pack_mm`) splits a matrix's rows between the threads,
one OpenMP parallel region per call. On a quiet 2-core machine two threads take 0.55-0.6 of
one thread's time (the kernel is compute-bound). On a machine whose cores are also busy with
other work, a region waits for a partner thread that was descheduled, up to a time slice:
with one other busy process on the 2-core development machine, 8-12 ms a call on two threads
against 0.2-0.5 ms on one (an int8 decode forward ~40 -> ~760 ms on average). No OpenMP
setting wins both: passive workers (OMP_WAIT_POLICY=PASSIVE) fixed the busy case but cost a
sleeping worker's wake-up per region, 57-100 ms a forward on the quiet machine.

So each matrix shape keeps its own choice, measured: it runs on its current thread count and,
every so often, for PROBE_CALLS calls on the other; when the probe ends, the count whose recent
calls had the lower median time is kept. A probe that loses doubles the wait before the next
(from PROBE_EVERY_S up to MAX_PROBE_EVERY_S seconds), so a steady machine pays little for the
probing and a change of load is noticed within seconds; a probe that wins brings the next
one near. The products are the same bits on
any number of threads (each output row is one thread's sum).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

import torch
from torch import Tensor

from .cpu_ops import on_threads

PROBE_CALLS = 4
PROBE_EVERY_S = 0.25
MAX_PROBE_EVERY_S = 16.0
_KEPT = 8  # recent call times kept per thread count


class ThreadChoice:
    """The thread count of one matrix shape's int8 calls (see the module doc)."""

    def __init__(self) -> None:
        self.current = 0  # none yet: torch's count on the first call
        self.wait = PROBE_EVERY_S
        self.next_probe = 0.0  # the first probe follows the first PROBE_CALLS calls
        self.probe_left = 0
        self.probing = False
        self.times: dict[int, deque[float]] = {}

    def run(self, kernel: Callable[[], Tensor]) -> Tensor:
        """kernel() on the chosen number of threads; torch's own count is restored after."""
        most = torch.get_num_threads()
        if most == 1:
            return kernel()
        start = time.perf_counter()
        threads = self._next(most, start)
        out = on_threads(threads, kernel)
        self.times.setdefault(threads, deque(maxlen=_KEPT)).append(time.perf_counter() - start)
        return out

    def _next(self, most: int, now: float) -> int:
        """The thread count of the call starting at `now` (`most`: torch's)."""
        if self.current not in (1, most):
            self.current = most
        other = 1 if self.current == most else most
        if self.probe_left:
            self.probe_left -= 1
            return other
        if self.probing:  # the probe's calls have all run and been timed
            self.probing = False
            self.next_probe = now + self._decide(self.current, other)
            return self.current
        timed = len(self.times.get(self.current, ())) >= PROBE_CALLS
        if timed and now >= self.next_probe:  # probe: the other count's own recent calls only
            self.probing, self.probe_left = True, PROBE_CALLS - 1
            self.times.pop(other, None)
            return other
        return self.current

    def _decide(self, current: int, probed: int) -> float:
        """Keep the faster count; the seconds until the next probe."""
        ours, theirs = self.times[current], self.times.get(probed)
        if theirs and statistics.median(theirs) < statistics.median(ours):
            self.current, self.wait = probed, PROBE_EVERY_S
        else:
            self.wait = min(2 * self.wait, MAX_PROBE_EVERY_S)
        return self.wait


_choices: dict[tuple[int, ...], ThreadChoice] = {}


def choice_for(shape: tuple[int, ...]) -> ThreadChoice:
    """The process's choice for int8 matrices of this [N, K] shape."""
    found = _choices.get(shape)
    if found is None:
        found = _choices[shape] = ThreadChoice()
    return found
