"""sv_kernels.int8_threads: the CPU int8 matmul's thread count follows measured call times.

The kernel here is a stand-in that advances a fake clock by a cost per thread count, so the
choice is tested against known timings; the real kernel's bits on one and two threads are
compared separately."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from sv_kernels import int8_threads
from sv_kernels.int8_threads import MAX_PROBE_EVERY_S, PROBE_CALLS, ThreadChoice
from sv_kernels.quantized import quantize


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(int8_threads, "time", fake)
    return fake


@pytest.fixture
def two_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def _calls(choice: ThreadChoice, clock: _Clock, cost: dict[int, float], n: int) -> list[int]:
    """Run n calls whose time is cost[threads]; the thread count each ran on."""
    seen: list[int] = []

    def kernel() -> torch.Tensor:
        threads = torch.get_num_threads()
        seen.append(threads)
        clock.now += cost[threads]
        return torch.tensor([float(threads)])

    for _ in range(n):
        out = choice.run(kernel)
        assert out.item() == seen[-1]
        assert torch.get_num_threads() == 2, "torch's thread count was not restored"
    return seen


# Seconds a call: two threads 0.55x one's on a quiet machine, 30x slower on a busy one.
QUIET = {1: 0.0018, 2: 0.001}
BUSY = {1: 0.0018, 2: 0.030}


def _for_seconds(
    choice: ThreadChoice, clock: _Clock, cost: dict[int, float], s: float
) -> list[int]:
    return _calls(choice, clock, cost, int(s / cost[choice.current or 2]) + 1)


@pytest.mark.usefixtures("two_threads")
def test_a_quiet_machine_keeps_all_threads_and_probes_ever_less(clock: _Clock) -> None:
    choice = ThreadChoice()
    seen = _calls(choice, clock, QUIET, 40_000)  # 40 s
    assert seen[:PROBE_CALLS] == [2] * PROBE_CALLS
    assert seen[PROBE_CALLS : 2 * PROBE_CALLS] == [1] * PROBE_CALLS  # timed early
    assert seen.count(1) < 0.002 * len(seen)
    assert choice.wait == MAX_PROBE_EVERY_S
    assert choice.current == 2


@pytest.mark.usefixtures("two_threads")
def test_a_busy_machine_moves_to_one_thread_and_back(clock: _Clock) -> None:
    choice = ThreadChoice()
    _calls(choice, clock, QUIET, 3000)  # 3 s: probes lost, each wait doubled
    assert choice.current == 2
    # Two threads now wait for a descheduled partner: the next probe of one thread wins.
    _for_seconds(choice, clock, BUSY, choice.wait + 0.1)
    assert choice.current == 1
    seen = _for_seconds(choice, clock, BUSY, 2.0)
    assert seen.count(2) <= 3 * PROBE_CALLS  # probes of two threads, ever rarer
    # Quiet again: a probe of two threads wins it back.
    _for_seconds(choice, clock, QUIET, MAX_PROBE_EVERY_S + 0.1)
    assert choice.current == 2


def test_one_thread_is_never_probed(clock: _Clock) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        choice = ThreadChoice()
        seen: list[int] = []

        def kernel() -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return torch.zeros(1)

        for _ in range(300):
            choice.run(kernel)
        assert set(seen) == {1}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.usefixtures("two_threads")
def test_the_thread_count_is_restored_when_the_kernel_fails(clock: _Clock) -> None:
    choice = ThreadChoice()

    def kernel() -> torch.Tensor:
        clock.now += 0.001
        if torch.get_num_threads() == 1:
            raise RuntimeError("kernel failed on the probe")
        return torch.zeros(1)

    with pytest.raises(RuntimeError, match="kernel failed on the probe"):
        for _ in range(2 * PROBE_CALLS):
            choice.run(kernel)
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_the_int8_kernel_gives_the_same_bits_on_one_and_two_threads() -> None:
    gen = torch.Generator().manual_seed(0)
    for n, k in ((576, 1536), (3072, 576), (960, 576)):
        w = quantize(torch.randn(n, k, generator=gen), "int8")
        x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
        ones = torch.ones(n, dtype=torch.bfloat16)
        two = torch._weight_int8pack_mm(x, w.data, ones)
        torch.set_num_threads(1)
        one = torch._weight_int8pack_mm(x, w.data, ones)
        torch.set_num_threads(2)
        assert torch.equal(one, two), (n, k)
