"""Conservative credits under a sliding window: what a request holds at once, not its whole
budget, checked by running the scheduler with its real page release.

The oracle for the pages is the window itself: a query at position p reads positions
p-W+1 .. p, so every one of them must sit in a page the sequence still holds; and what a
sequence holds after every schedule() (its pages minus those given back) is counted from its
block table, never above its credits. The pool only refuses a page when the credits lied, so
a run that ends has never needed more.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sv_scheduler import (
    AdmissionError,
    Request,
    Scheduler,
    SchedulerConfig,
    Sequence,
    SpeculationConfig,
    StepPlan,
    check_request,
    credits_for,
    max_new_tokens_that_fit,
)

STOP = 3


def most_pages_touched(num_positions: int, page_size: int) -> int:
    """The most distinct pages `num_positions` consecutive positions can touch, by trying every
    offset within a page (an independent route to the admission module's formula)."""
    return max(
        len({p // page_size for p in range(start, start + num_positions)})
        for start in range(page_size)
    )


def held(seq: Sequence) -> int:
    return len(seq.table.pages) - seq.table.num_released


def check_window_reads(plan: StepPlan, window: int) -> None:
    """Every position a planned query reads is in a page its sequence holds."""
    queries = [(c.seq, range(c.start, c.end)) for c in plan.prefills]
    for seq in plan.decodes:
        newest = len(seq.token_ids) + seq.num_pending - 1
        queries.append((seq, range(newest, newest + 1 + len(seq.draft))))
    for seq, positions in queries:
        table = seq.table
        for q in positions:
            first_read = max(0, q - window + 1)
            assert first_read // table.page_size >= table.num_released, (seq, q)
            assert q // table.page_size < len(table.pages), (seq, q)


def fake_tokens(plan: StepPlan, rng: random.Random) -> list[int]:
    """One token per sampling entry, then the choices at draft positions. Tokens come from a
    small vocabulary (so prompt lookup finds drafts), and a draft token is often confirmed (so
    accepted runs of every length occur); STOP ends a request now and then."""
    tokens = [rng.choice((4, 5, 6, 7, 4, 5, 6, 7, STOP)) for _ in plan.sampling]
    first = {id(seq): i for i, seq in enumerate(plan.sampling)}
    choices: list[int] = []
    for seq in plan.decodes:
        draft = seq.draft
        if not draft:
            continue
        if rng.random() < 0.8:
            tokens[first[id(seq)]] = draft[0]
        for j in range(len(draft)):
            confirm = j + 1 < len(draft) and rng.random() < 0.8
            choices.append(draft[j + 1] if confirm else rng.choice((4, 5, 6, 7)))
    return tokens + choices


def run_to_end(
    sched: Scheduler, rng: random.Random, *, pipelined: bool, window: int
) -> dict[object, int]:
    """Drive the scheduler as the engine does (resolve before planning when a step drafts, or
    always when not pipelined); returns each request's peak pages held, checking it against its
    credits and the window's reads after every schedule()."""
    peak: dict[object, int] = {}
    in_flight: tuple[StepPlan, list[int]] | None = None
    for _ in range(100_000):
        if in_flight is not None and (
            not pipelined or in_flight[0].num_draft_tokens or sched.would_draft
        ):
            sched.resolve(*in_flight)
            in_flight = None
        if not sched.has_unfinished():
            break
        plan = sched.schedule()
        assert not plan.is_empty or in_flight is not None, "nothing runs: deadlock"
        for seq in sched.running():
            pages = held(seq)
            assert pages <= seq.credits, (seq, seq.credits)
            peak[seq.request_id] = max(peak.get(seq.request_id, 0), pages)
        check_window_reads(plan, window)
        tokens = fake_tokens(plan, rng)
        if in_flight is not None:
            sched.resolve(*in_flight)
        if plan.is_empty:
            in_flight = None
            continue
        sched.advance(plan)
        in_flight = (plan, tokens)
    else:
        raise AssertionError("the requests did not finish")
    if in_flight is not None:
        sched.resolve(*in_flight)
    return peak


@st.composite
def windowed_runs(draw: st.DrawFn) -> tuple[SchedulerConfig, list[Request], bool, int]:
    page_size = draw(st.sampled_from([1, 2, 4, 16]))
    window = draw(st.integers(1, 80))
    max_num_seqs = draw(st.integers(1, 6))
    max_step_tokens = draw(st.integers(max_num_seqs, 96))
    speculate = draw(st.booleans())
    speculation = SpeculationConfig(max_draft=draw(st.integers(1, 5))) if speculate else None
    shared = draw(st.lists(st.integers(4, 7), min_size=0, max_size=60))
    requests = []
    for i in range(draw(st.integers(1, 8))):
        own = draw(st.lists(st.integers(4, 7), min_size=1, max_size=90))
        prompt = (shared if draw(st.booleans()) else []) + own
        max_new = draw(st.integers(1, 250))
        requests.append(Request(i, prompt, max_new, stop_ids=frozenset({STOP})))
    base = SchedulerConfig(
        num_pages=1,
        max_model_len=512,
        page_size=page_size,
        max_num_seqs=max_num_seqs,
        max_step_tokens=max_step_tokens,
        prefix_caching=draw(st.booleans()),
        sliding_window=window,
        speculation=speculation,
    )
    # A pool from as small as the largest request allows to a little larger: requests wait
    # for credits, and pages the window gave back are reused by others.
    probe = SchedulerConfig(**{**_fields(base), "num_pages": 1 << 20})
    largest = max(check_request(r, probe)[1] for r in requests)
    num_pages = largest + draw(st.integers(0, 2 * largest))
    config = SchedulerConfig(**{**_fields(base), "num_pages": num_pages})
    return config, requests, draw(st.booleans()), draw(st.integers(0, 2**32))


def _fields(config: SchedulerConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in SchedulerConfig.__slots__}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=windowed_runs())
def test_a_windowed_request_never_holds_more_than_its_credits(
    run: tuple[SchedulerConfig, list[Request], bool, int],
) -> None:
    config, requests, pipelined, seed = run
    window = config.sliding_window
    assert window is not None
    sched = Scheduler(config)
    seqs = [sched.add(r) for r in requests]
    for seq, request in zip(seqs, requests, strict=True):
        # Never above the budget's formula, and the window's bound otherwise.
        full = credits_for(len(request.prompt_ids), seq.max_new_tokens, config.page_size)
        draft = config.speculation.max_draft if config.speculation else 0
        chunk = max(min(len(request.prompt_ids), config.max_step_tokens), 1 + 2 * draft)
        assert seq.credits == min(full, most_pages_touched(window - 1 + chunk, config.page_size))
    peak = run_to_end(sched, random.Random(seed), pipelined=pipelined, window=window)
    stats = sched.stats
    assert stats.finished_requests == len(requests)  # no deadlock
    assert stats.free_pages == config.num_pages and stats.assigned_pages == 0  # every page back
    assert stats.free_credits == config.num_pages
    for seq in seqs:
        if peak.get(seq.request_id) == seq.credits:
            event("a request reached its credits")


def test_a_cached_prefix_past_the_window_is_given_back_at_admission() -> None:
    """A request that starts on 60 cached positions, window 4, chunks of 8: it may hold only
    the window's pages and its chunk's, ceil((4 - 2 + 8) / 4) + 1 = 4 pages, not the 15 pages
    of the cached prefix (queries from position 60 on never read them)."""
    config = SchedulerConfig(
        num_pages=40,
        max_model_len=256,
        page_size=4,
        max_num_seqs=1,
        max_step_tokens=8,
        sliding_window=4,
    )
    sched = Scheduler(config)
    prompt = [4, 5, 6, 7] * 15 + [4]
    sched.add(Request("first", prompt, 2, ignore_eos=True))
    run_to_end(sched, random.Random(1), pipelined=False, window=4)
    second = sched.add(Request("second", prompt, 3, ignore_eos=True))
    assert second.credits == 4
    run_to_end(sched, random.Random(2), pipelined=True, window=4)
    assert second.num_cached_tokens == 60  # it did start on the cached prefix
    assert sched.stats.free_pages == config.num_pages


def test_more_long_requests_run_at_once_than_the_budget_formula_admits() -> None:
    """Twelve requests of 40 prompt and 600 output tokens, window 64, pages of 16, a 60-page
    pool: the budget formula reserves ceil(639 / 16) = 40 pages each (one at a time); what one
    holds at once is 64 - 1 + 40 = 103 positions, at most 8 pages, so 7 run together."""
    config = SchedulerConfig(num_pages=60, max_model_len=1024, page_size=16, sliding_window=64)
    sched = Scheduler(config)
    requests = [Request(i, [4 + i % 4] * 40, 600, ignore_eos=True) for i in range(12)]
    for request in requests:
        assert sched.add(request).credits == 8
    assert config.num_pages // credits_for(40, 600, 16) == 1
    run_to_end(sched, random.Random(0), pipelined=True, window=64)
    stats = sched.stats
    assert stats.peak_running == 7
    assert stats.finished_requests == 12
    assert stats.free_pages == stats.pool_pages == stats.free_credits
    # The pool was really shared: 7 sequences of up to 8 pages each, never over the pool.
    assert 7 * 5 <= stats.peak_assigned_pages <= 60


def test_without_a_window_or_under_preemption_the_budget_formula_stands() -> None:
    request = Request(0, [4] * 40, 600)
    for config in (
        SchedulerConfig(num_pages=30, max_model_len=1024),
        SchedulerConfig(
            num_pages=30, max_model_len=1024, sliding_window=64, admission="preemptive"
        ),
    ):
        with pytest.raises(AdmissionError, match="needs 40 pages"):
            check_request(request, config)
        assert max_new_tokens_that_fit(40, config) == 30 * 16 + 1 - 40
    windowed = SchedulerConfig(num_pages=30, max_model_len=1024, sliding_window=64)
    assert check_request(request, windowed) == (600, 8)
    assert max_new_tokens_that_fit(40, windowed) == 1024 - 40  # the window's bound fits


def test_a_window_larger_than_the_pool_is_refused_by_name() -> None:
    config = SchedulerConfig(num_pages=4, max_model_len=4096, sliding_window=100)
    with pytest.raises(AdmissionError, match="sliding window of 100 positions"):
        check_request(Request(0, [4] * 40, 1000), config)
