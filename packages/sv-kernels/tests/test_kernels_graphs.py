"""The shared CUDA-graph capture recipe (sv_kernels.graphs)."""

from __future__ import annotations

import pytest
import torch
from kernels_testing import gpu_test
from sv_kernels import graphs
from sv_kernels.quantized import QuantizedWeight


def test_l2_bytes_off_the_gpu_is_the_default() -> None:
    assert graphs.l2_bytes(torch.device("cpu")) == graphs.DEFAULT_L2_BYTES


def test_sets_to_overflow_l2_by_hand() -> None:
    """Twice the (default, 60 MiB) L2 over the set size, rounded up, within 1..most."""
    cpu, mib = torch.device("cpu"), 1 << 20
    assert 60 * mib == graphs.DEFAULT_L2_BYTES
    assert graphs.sets_to_overflow_l2(12 * mib, cpu) == 10  # 120 / 12
    assert graphs.sets_to_overflow_l2(33 * mib, cpu) == 4  # 120 / 33 = 3.6
    assert graphs.sets_to_overflow_l2(525 * mib, cpu) == 1  # bigger than L2 alone
    assert graphs.sets_to_overflow_l2(1, cpu) == 16
    assert graphs.sets_to_overflow_l2(1, cpu, most=3) == 3
    assert graphs.sets_to_overflow_l2(0, cpu) == 16


def test_copies_to_overflow_l2_are_distinct_clones() -> None:
    """A 24 MiB tensor off the GPU (60 MiB default L2): ceil(120 / 24) = 5 sets, the tensor
    itself first, the others equal to it in storage of their own."""
    t = torch.arange(6 * 2**20, dtype=torch.float32)
    copies = graphs.copies_to_overflow_l2(t)
    assert len(copies) == 5 and copies[0] is t
    assert len({c.data_ptr() for c in copies}) == 5
    assert all(torch.equal(c, t) for c in copies)


def test_copies_to_overflow_l2_of_a_quantized_weight_clone_data_and_scales() -> None:
    """Counted by the data's bytes: 12 MiB of int8 values, ceil(120 / 12) = 10 sets."""
    w = QuantizedWeight(
        torch.ones(3 * 2**10, 2**12, dtype=torch.int8), torch.rand(3 * 2**10), "int8", torch.float32
    )
    copies = graphs.copies_to_overflow_l2(w)
    assert len(copies) == 10 and copies[0] is w
    assert (
        len({c.data.data_ptr() for c in copies}) == len({c.scale.data_ptr() for c in copies}) == 10
    )
    assert all(torch.equal(c.data, w.data) and torch.equal(c.scale, w.scale) for c in copies)
    assert all((c.kind, c.dtype) == ("int8", torch.float32) for c in copies)


@gpu_test
def test_l2_bytes_of_the_gpu_is_plausible() -> None:
    assert 1 << 20 <= graphs.l2_bytes(torch.device("cuda")) <= 1 << 30


@gpu_test
def test_capture_replays_on_new_inputs() -> None:
    x = torch.randn(1000, device="cuda")
    calls = [0]

    def run() -> torch.Tensor:
        calls[0] += 1
        return torch.cumsum(x * 2 + 1, 0)

    graph, out = graphs.capture(run, warmups=2)
    assert calls[0] == 3  # two warm-ups, one capture; replays run no Python
    x.copy_(torch.linspace(-3, 3, 1000, device="cuda"))
    graph.replay()
    torch.testing.assert_close(out, torch.cumsum(x * 2 + 1, 0))
    assert calls[0] == 3


@gpu_test
def test_capture_into_a_shared_pool() -> None:
    x = torch.ones(256, device="cuda")
    first, out1 = graphs.capture(lambda: x + 1)
    second, out2 = graphs.capture(lambda: x * 3, pool=first.pool())
    x.fill_(2.0)
    first.replay()
    second.replay()
    assert torch.equal(out1, torch.full_like(x, 3.0))
    assert torch.equal(out2, torch.full_like(x, 6.0))


@gpu_test
def test_graph_ms_per_call_scales_with_the_work() -> None:
    small = [torch.empty(1 << 20, device="cuda") for _ in range(2)]
    big = [torch.empty(64 << 20, device="cuda") for _ in range(2)]
    small_ms = graphs.graph_ms_per_call([small[0].zero_, small[1].zero_], rep_ms=20)
    big_ms = graphs.graph_ms_per_call([big[0].zero_, big[1].zero_], rep_ms=20)
    # 256 MiB written at a few TB/s is ~0.1 ms; 4 MiB is launch-bound, far below that.
    assert 0 < small_ms < big_ms < 5.0
    assert big_ms > 10 * small_ms


@gpu_test
def test_graph_ms_per_call_raises_for_uncapturable_work_and_leaves_the_rng_usable() -> None:
    """A failed capture must not leave torch's CUDA generator registered with it: random
    numbers, and captures that draw them, still work afterwards, with the same seed."""
    x = torch.ones(8, device="cuda")
    torch.cuda.manual_seed(1234)
    with pytest.raises(Exception):  # noqa: B017 - torch raises a plain RuntimeError subclass
        graphs.graph_ms_per_call([lambda: x.sum().item()])
    assert torch.isfinite(torch.randn(4, device="cuda")).all()
    assert torch.cuda.initial_seed() == 1234
    graph, out = graphs.capture(lambda: torch.randn(4, device="cuda"))
    graph.replay()
    assert out.shape == (4,) and torch.isfinite(out).all()
