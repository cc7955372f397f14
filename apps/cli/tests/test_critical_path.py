"""Each kernel's share of a decode step's critical path (`sv bench --profile`)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sv_cli.bench.critical_path import KernelSpan, critical_path, format_path, split_steps


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


# --- `sv bench --profile`'s glue, with the profiler and the decode graph faked -------------


class _FakeProfile:
    """torch.profiler.profile's stand-in: its `events()` are the kernels given."""

    def __init__(self, events: list[object]) -> None:
        self._events = events

    def __call__(self, **_: object) -> _FakeProfile:
        return self

    def __enter__(self) -> _FakeProfile:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def events(self) -> list[object]:
        return self._events


def _event(name: str, start: float, end: float, device: object) -> object:
    return SimpleNamespace(
        name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end)
    )


def _profile_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, events: list[object], batch: int = 1
) -> tuple[str, int]:
    import torch
    import torch.profiler
    from sv_cli.bench import profiles, runner

    replays: list[int] = []

    def decode_replay(runner: object, step: Any) -> Any:
        # the step replayed is a decode step of `batch` rows on the scratch table row
        assert step.query_lens == [1] * batch and step.table_rows == [7] * batch
        return lambda: replays.append(1)

    monkeypatch.setattr(runner, "decode_replay", decode_replay)
    monkeypatch.setattr(torch.profiler, "profile", _FakeProfile(events))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    engine = SimpleNamespace(runner=SimpleNamespace(scratch_table_row=7))
    profiles.profile_decode_path(engine, " [fp8]", tmp_path, batch, replays=6)
    return (tmp_path / "profiles.txt").read_text(), len(replays)


def test_bench_profile_prints_the_path_of_the_replays_after_the_first_four(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch.profiler import DeviceType

    cuda, cpu = DeviceType.CUDA, DeviceType.CPU
    events = [_event("cudaGraphLaunch", 0.0, 50.0, cpu)]  # host records are not kernels
    for r in range(6):  # replay r: 10 us apart; the first four run slower (warming)
        t, slow = 100.0 * r, 3.0 if r < 4 else 0.0
        events += [
            _event("_feed_tokens_kernel", t, t + 1.0, cuda),
            _event("_gemv_kernel", t + 0.5, t + 5.0 + slow, cuda),
            _event("_rms_norm_kernel", t + 4.0, t + 6.0 + slow, cuda),
        ]
    written, replayed = _profile_with(monkeypatch, tmp_path, events)
    assert replayed == 6
    printed = capsys.readouterr().out
    assert printed.strip() == written.strip()
    lines = written.splitlines()
    # the last two replays: feed 0..1, gemv to 5 (+4), norm to 6 (+1)
    assert lines[0] == "--- critical path: decode-b1 step, 701-token context [fp8]: 6.0 us a step"
    assert [line.split()[-1] for line in lines[1:]] == [
        "_gemv_kernel",
        "_feed_tokens_kernel",
        "_rms_norm_kernel",
    ]
    assert lines[1].split()[0] == "4.0"


def test_bench_profile_of_a_256_row_step_replays_that_step_and_names_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from torch.profiler import DeviceType

    events = [_event("_gemv_kernel", 10.0 * r, 10.0 * r + 3.0, DeviceType.CUDA) for r in range(6)]
    written, replayed = _profile_with(monkeypatch, tmp_path, events, batch=256)
    assert replayed == 6
    assert written.splitlines()[0] == (
        "--- critical path: decode step of 256 rows, 701-token context [fp8]: 3.0 us a step"
    )


def test_bench_profile_says_why_when_the_records_are_not_whole_replays(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from torch.profiler import DeviceType

    events = [_event("_gemv_kernel", float(t), t + 1.0, DeviceType.CUDA) for t in range(7)]
    written, _ = _profile_with(monkeypatch, tmp_path, events)
    assert written.strip() == (
        "--- critical path: decode-b1 step, 701-token context [fp8]: not computed: "
        "split_steps: 7 kernels do not divide into 6 replays of one graph"
    )


def test_the_profiler_records_carry_what_the_bench_reads() -> None:
    """The fields `profile_decode_path` reads from torch's profiler records, on a real CPU
    profile (the fakes above assume them)."""
    import torch
    from torch.profiler import DeviceType, ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(64).sum()
    records = list(prof.events())
    assert records
    for e in records:
        assert isinstance(e.name, str)
        assert e.device_type in (DeviceType.CPU, DeviceType.CUDA)
        assert e.time_range.end >= e.time_range.start
