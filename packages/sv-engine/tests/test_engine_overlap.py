"""The overlapped step loop (the next step launched before this one's tokens are read) gives
exactly the events of the plain loop, on the CPU reference: greedy and seeded sampling, stop
tokens, length limits, arrivals while steps are in flight, chunked prefill beside decodes, a
tight pool, cancellation, and a step that fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from sv_engine import Engine, SamplingParams
from sv_model import StepInputs

PROMPTS = [
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Name three colours.",
    "Translate 'good morning' into French, please, and explain the phrase in detail.",
    "Count from one to ten.",
]


def make(tiny_llama_dir: Path, overlap: bool, **kw: object) -> Engine:
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", **kw)  # type: ignore[arg-type]
    engine.overlap = overlap
    return engine


def params_for(i: int) -> SamplingParams:
    if i % 2:
        return SamplingParams(max_new_tokens=6 + 3 * i, temperature=0.9, top_p=0.9, seed=i)
    return SamplingParams(max_new_tokens=6 + 3 * i, temperature=0.7, top_k=40, seed=i)


Events = list[tuple[int | None, str]]


def drive(engine: Engine, stop_ids: frozenset[int]) -> list[Events]:
    """Two requests, then three more arriving while steps run; every event of each request."""
    engine.stop_ids = stop_ids
    events: dict[int, Events] = {}
    ids = [engine.add_request(p, params_for(i)) for i, p in enumerate(PROMPTS[:2])]
    calls = 0
    while engine.has_unfinished():
        for e in engine.step():
            events.setdefault(e.request_id, []).append((e.token_id, e.text))
            if e.completion is not None:
                c = e.completion
                events[e.request_id].append((None, f"{c.finish_reason} {c.output_ids} {c.text!r}"))
        calls += 1
        if calls == 3:
            ids += [engine.add_request(p, params_for(i + 2)) for i, p in enumerate(PROMPTS[2:])]
    assert sorted(events) == sorted(ids)
    stats = engine.stats
    assert stats.free_pages == stats.pool_pages and stats.assigned_pages == 0
    return [events[rid] for rid in ids]


def test_overlap_gives_the_events_of_the_plain_loop(tiny_llama_dir: Path) -> None:
    # A tight pool (admission waits) and a small step budget (prompts prefill in chunks beside
    # running decodes).
    kw = {"kv_cache_mib": 0.05, "max_step_tokens": 24, "max_num_seqs": 4}
    plain = make(tiny_llama_dir, overlap=False, **kw)
    overlapped = make(tiny_llama_dir, overlap=True, **kw)
    feeds: list[int] = []
    launch = overlapped.runner.launch

    def spy(step: StepInputs):  # type: ignore[no-untyped-def]
        feeds.append(len(step.feed))
        return launch(step)

    overlapped.runner.launch = spy  # type: ignore[method-assign]
    # Stop ids: one token each of two free runs, so some requests stop early.
    free = drive(plain, frozenset())
    stops = frozenset({free[0][3][0], free[1][4][0]})
    want = drive(plain, stops)
    got = drive(overlapped, stops)
    assert got == want
    reasons = [events[-1][1].split()[0] for events in want]
    assert "stop" in reasons and "length" in reasons
    assert plain.stats.admission_waits > 0
    # The overlapped engine really ran ahead: most steps fed tokens the host had not seen.
    assert sum(n > 0 for n in feeds) > len(feeds) // 2


def test_cancel_while_a_step_is_in_flight(tiny_llama_dir: Path) -> None:
    engine = make(tiny_llama_dir, overlap=True, kv_cache_mib=64)
    rid = engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=30, ignore_eos=True))
    other = engine.add_request(PROMPTS[1], SamplingParams(max_new_tokens=30, ignore_eos=True))
    delivered = []
    for _ in range(4):
        delivered += [e.token_id for e in engine.step() if e.request_id == rid]
    event = engine.cancel(rid)
    assert event is not None and event.completion is not None
    assert event.completion.output_ids == delivered  # not the token still on the device
    assert all(e.request_id == other for e in engine.step())  # nothing more for rid
    engine.cancel(other)
    assert not engine.has_unfinished()
    stats = engine.stats
    assert stats.free_pages == stats.pool_pages and stats.assigned_pages == 0


def test_cancel_before_the_last_token_of_a_length_limit_arrives(tiny_llama_dir: Path) -> None:
    # With the step that holds its last token in flight, the request has left the scheduler
    # (its length limit is known at advance) but its final event is still to come: cancelling
    # it then ends it as cancelled, and no late "length" event follows (a stream closed early).
    engine = make(tiny_llama_dir, overlap=True, kv_cache_mib=64)
    short = engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=4, ignore_eos=True))
    other = engine.add_request(PROMPTS[1], SamplingParams(max_new_tokens=40, ignore_eos=True))
    delivered: list[int] = []
    while len(delivered) < 3:
        delivered += [e.token_id for e in engine.step() if e.request_id == short]
    assert engine.scheduler.get(short) is None  # its 4th token is the step in flight
    event = engine.cancel(short)
    assert event is not None and event.completion is not None
    assert (event.completion.finish_reason, event.completion.output_ids) == ("cancelled", delivered)
    assert engine.cancel(short) is None
    engine.cancel(other)
    assert not engine.has_unfinished() and engine.step() == []
    stats = engine.stats
    assert (stats.finished_requests, stats.cancelled_requests) == (0, 2)
    assert stats.free_pages == stats.pool_pages and stats.assigned_pages == 0


def test_a_failed_step_ends_every_request_and_the_engine_goes_on(tiny_llama_dir: Path) -> None:
    engine = make(tiny_llama_dir, overlap=True, kv_cache_mib=64)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    want = engine.generate(PROMPTS[:2], params)
    for p in PROMPTS[:3]:
        engine.add_request(p, params)
    engine.step()
    engine.step()
    launch = engine.runner.launch

    def broken(step: StepInputs):  # type: ignore[no-untyped-def]
        raise RuntimeError("device lost")

    engine.runner.launch = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()
    engine.runner.launch = launch  # type: ignore[method-assign]
    assert not engine.has_unfinished()
    stats = engine.stats
    assert stats.free_pages == stats.pool_pages and stats.assigned_pages == 0
    got = engine.generate(PROMPTS[:2], params)
    assert [c.output_ids for c in got] == [c.output_ids for c in want]


def test_overlap_can_be_turned_off_between_steps(tiny_llama_dir: Path) -> None:
    engine = make(tiny_llama_dir, overlap=True, kv_cache_mib=64)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want = [c.output_ids for c in engine.generate(PROMPTS[:2], params)]
    ids = [engine.add_request(p, params) for p in PROMPTS[:2]]
    tokens: dict[int, list[int]] = {rid: [] for rid in ids}
    calls = 0
    while engine.has_unfinished():
        for e in engine.step():
            if e.token_id is not None:
                tokens[e.request_id].append(e.token_id)
        calls += 1
        engine.overlap = calls % 3 != 0  # off every third step, on again after
    assert [tokens[rid] for rid in ids] == want
