"""A scripted engine loop: the scheduler and the step recorder driven without a model, with
the tokens each step "samples" chosen by the test (the hooks are called as Engine calls them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from sv_scheduler import Request, Scheduler, SchedulerConfig, SchedulerStats
from sv_tokenizer import Tokenizer
from sv_trace import read_trace
from sv_trace.recorder import StepRecorder

STOP = 7  # the stop id of every scripted request
TOKEN = 1000  # what every other sampled token is
VOCAB = 1024  # the width of the logits rows the recorder is shown


class Event(NamedTuple):
    """What the recorder reads of an engine event."""

    request_id: int
    token_id: int | None
    finished: str | None


@dataclass
class Scenario:
    config: SchedulerConfig
    prompts: Sequence[Sequence[int]]
    max_new: Sequence[int]
    stop_at: dict[int, int] = field(default_factory=dict)  # request -> output token that is STOP
    cancel_after: dict[int, int] = field(default_factory=dict)  # step -> request to cancel


@dataclass
class Run:
    records: list[dict[str, Any]]
    stats: SchedulerStats
    outputs: dict[int, list[int]]

    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == "step"]


def prompt(n: int, seed: int) -> list[int]:
    """n distinct-looking token ids (never STOP)."""
    return [100 + (seed * 131 + i * 17) % 5000 for i in range(n)]


def run(scenario: Scenario, tokenizer: Tokenizer, path: Path) -> Run:
    scheduler = Scheduler(scenario.config)
    recorder = StepRecorder.open(path, scheduler, tokenizer, cuda=False)
    outputs: dict[int, list[int]] = {}
    for rid, (ids, max_new) in enumerate(zip(scenario.prompts, scenario.max_new, strict=True), 1):
        scheduler.add(Request(rid, list(ids), max_new, stop_ids=frozenset({STOP})))
        recorder.queued(rid, ids, max_new)
        outputs[rid] = []

    def token_for(rid: int) -> int:
        return STOP if scenario.stop_at.get(rid) == len(outputs[rid]) + 1 else TOKEN

    steps = 0
    while scheduler.has_unfinished():
        plan = scheduler.schedule()
        assert not plan.is_empty, "a scripted plan computed nothing"
        recorder.planned(plan)
        tokens = [token_for(int(seq.request_id)) for seq in plan.sampling]
        # The runner's logits observer: rows that favour the token each request samples.
        logits = torch.zeros(len(tokens), VOCAB)
        logits[range(len(tokens)), tokens] = 4.0
        recorder.on_logits(logits, torch.tensor(tokens))
        recorder.launched(plan)
        scheduler.advance(plan)
        finished = {f.request_id: f.finish_reason for f in scheduler.resolve(plan, tokens)}
        events = []
        for seq, token in zip(plan.sampling, tokens, strict=True):
            rid = int(seq.request_id)
            outputs[rid].append(token)
            events.append(Event(rid, token, finished.get(rid)))
        recorder.resolved(plan, tokens, events)
        cancel = scenario.cancel_after.get(plan.step)
        if cancel is not None and scheduler.cancel(cancel):
            recorder.cancelled(cancel)
        steps += 1
        assert steps < 10_000
    stats = scheduler.stats
    recorder.close(stats)
    return Run(read_trace(path), stats, outputs)
