"""Each kernel's share of a decode step's critical path (`sv bench --profile`)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sv_cli.critical_path import KernelSpan, critical_path, format_path, split_steps


def _shares(steps: list[list[KernelSpan]]) -> dict[str, tuple[float, float, float]]:
    _, shares = critical_path(steps)
    return {s.name: (s.calls, s.path_us, s.busy_us) for s in shares}


def test_back_to_back_kernels_each_add_their_time_and_the_gap_before_them() -> None:
    step = [KernelSpan("a", 0.0, 10.0), KernelSpan("b", 12.0, 20.0)]
    span, _ = critical_path([step])
    assert span == 20.0
    assert _shares([step]) == {"a": (1, 10.0, 10.0), "b": (1, 10.0, 8.0)}


def test_overlapping_kernels_add_only_what_ends_later() -> None:
    # b starts under a and ends 4 us after it; c runs and ends inside b: it adds nothing
    step = [KernelSpan("a", 0.0, 10.0), KernelSpan("b", 5.0, 14.0), KernelSpan("c", 6.0, 9.0)]
    span, shares = critical_path([step])
    assert span == 14.0
    assert _shares([step]) == {"a": (1, 10.0, 10.0), "b": (1, 4.0, 9.0), "c": (1, 0.0, 3.0)}
    assert [s.name for s in shares] == ["a", "b", "c"]  # the largest share first


def test_shares_are_per_step_and_durations_per_call() -> None:
    one = [KernelSpan("g", 0.0, 4.0), KernelSpan("n", 3.0, 5.0), KernelSpan("g", 4.5, 9.0)]
    two = [
        KernelSpan("g", 100.0, 106.0),
        KernelSpan("n", 106.0, 107.0),
        KernelSpan("g", 107.0, 111.0),
    ]
    span, _ = critical_path([one, two])
    assert span == (9.0 + 11.0) / 2
    # g: step one 4 + 4 = 8, step two 6 + 4 = 10, so 9 a step over 2 calls; its four calls
    # ran 4, 4.5, 6 and 4 us. n: 1 and 1.
    assert _shares([one, two]) == {"g": (2, 9.0, 4.625), "n": (1, 1.0, 1.5)}


@given(
    st.lists(
        st.tuples(st.sampled_from("abcd"), st.floats(0, 1e4), st.floats(0, 1e3)),
        min_size=1,
        max_size=40,
    )
)
def test_the_shares_add_up_to_the_span_from_first_start_to_last_end(
    spans: list[tuple[str, float, float]],
) -> None:
    step = [KernelSpan(name, start, start + length) for name, start, length in spans]
    span, shares = critical_path([step])
    expected = max(k.end_us for k in step) - min(k.start_us for k in step)
    assert span == pytest.approx(expected, abs=1e-6)
    assert sum(s.path_us for s in shares) == pytest.approx(expected, abs=1e-6)
    assert all(s.path_us >= 0 for s in shares)


def test_split_steps_orders_by_start_and_cuts_equal_replays() -> None:
    kernels = [KernelSpan(n, t, t + 1) for t, n in enumerate("xyzxyz")]
    shuffled = kernels[:]
    random.Random(0).shuffle(shuffled)
    assert split_steps(shuffled, 2) == [kernels[:3], kernels[3:]]


@pytest.mark.parametrize(("count", "steps"), [(5, 2), (0, 1), (4, 0)])
def test_split_steps_refuses_kernels_that_are_not_whole_replays(count: int, steps: int) -> None:
    kernels = [KernelSpan("k", float(t), t + 1.0) for t in range(count)]
    with pytest.raises(ValueError, match=f"{count} kernels do not divide into {steps} replays"):
        split_steps(kernels, steps)


def test_critical_path_refuses_no_steps_or_an_empty_step() -> None:
    with pytest.raises(ValueError, match="at least one step"):
        critical_path([])
    with pytest.raises(ValueError, match="at least one step"):
        critical_path([[KernelSpan("a", 0.0, 1.0)], []])


def test_format_path_names_each_kernel_with_its_share() -> None:
    step = [KernelSpan("_gemv_kernel", 0.0, 30.0), KernelSpan("_rms_norm_kernel", 29.0, 40.0)]
    text = format_path("decode-b1", *critical_path([step]))
    lines = text.splitlines()
    assert lines[0] == "--- critical path: decode-b1: 40.0 us a step"
    assert "30.0 us 75.0%" in lines[1] and lines[1].endswith("_gemv_kernel")
    assert "10.0 us 25.0%" in lines[2] and lines[2].endswith("_rms_norm_kernel")
