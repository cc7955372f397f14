"""The throughput rows' account of prompt and decode steps, host and GPU (`sv bench`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from sv_cli.bench import timing


@dataclass
class _Event:
    """A CUDA event's stand-in: its time on a clock, in ms."""

    at: float = 0.0

    def record(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:
        return end.at - self.at


@dataclass
class _Step:
    query_lens: list[int]


class _Runner:
    def __init__(self) -> None:
        self.launched: list[_Step] = []

    def launch(self, step: _Step) -> str:
        self.launched.append(step)
        return "pending"


def test_step_times_split_prompt_and_decode_steps_and_restore_the_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    clock = iter([0.0, 3.0, 3.0, 8.0, 8.0, 10.0])  # ms: a step's start, then its end
    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: _Event(next(clock)))
    runner: Any = _Runner()
    original = runner.launch
    with timing.step_times(runner) as times:
        assert runner.launch(_Step([40, 1, 1])) == "pending"  # a prompt chunk and two decodes
        runner.launch(_Step([17]))
        runner.launch(_Step([1, 1]))
    assert runner.launch == original and len(runner.launched) == 3
    text = str(times)
    assert text.startswith("2 prompt: GPU 8 ms, host ") and "; 1 decode: GPU 2 ms, host " in text
