"""Admission arithmetic and policies, worked by hand (DESIGN.md section 6)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sv_scheduler import (
    AdmissionError,
    FinishedRequest,
    Request,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    Sequence,
    SequenceStatus,
    StepPlan,
    clamp_max_new_tokens,
    credits_for,
    max_new_tokens_that_fit,
)

NO_STOP = 100  # a token id that is nobody's stop id


def make(num_pages: int, **kw: object) -> Scheduler:
    kw.setdefault("max_model_len", 1000)
    kw.setdefault("prefix_caching", False)
    return Scheduler(SchedulerConfig(num_pages=num_pages, **kw))  # type: ignore[arg-type]


def step(
    sched: Scheduler, token_for: Callable[[Sequence], int] = lambda s: NO_STOP
) -> tuple[StepPlan, list[FinishedRequest]]:
    plan = sched.schedule()
    return plan, sched.complete_step(plan, [token_for(s) for s in plan.sampling])


def admitted(plan: StepPlan) -> list[str | int]:
    """Request ids whose first chunk starts in this plan (admitted by it)."""
    return [c.seq.request_id for c in plan.prefills if c.start == c.seq.num_cached_tokens]


# -- the arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "max_new", "pages"),
    [
        (10, 7, 1),  # 10 + 7 - 1 = 16 tokens: exactly one page
        (10, 8, 2),  # 17 tokens: one over
        (16, 1, 1),  # the prompt fills a page; the one output token is never fed back
        (16, 2, 2),
        (17, 1, 2),
        (1, 1, 1),
        (1, 16, 1),
        (1, 17, 2),
        (3000, 1800, 300),  # 4799 tokens -> 299.94 -> 300
    ],
)
def test_credits_by_hand(prompt: int, max_new: int, pages: int) -> None:
    assert credits_for(prompt, max_new, 16) == pages
    sched = make(400, max_model_len=8192)
    seq = sched.add(Request("r", [1] * prompt, max_new))
    assert seq.credits == pages


def test_context_limit_clamps_the_budget() -> None:
    assert clamp_max_new_tokens(60, 100, 64) == 4
    assert clamp_max_new_tokens(10, 5, 64) == 5
    # Unclamped this would be 159 tokens = 10 pages > the pool of 4; clamped it is 63 -> 4 pages.
    sched = make(4, max_model_len=64)
    seq = sched.add(Request("long", [1] * 60, 100))
    assert (seq.max_new_tokens, seq.credits) == (4, 4)
    finished: list[FinishedRequest] = []
    while sched.has_unfinished():
        finished += step(sched)[1]
    assert finished[0].finish_reason == "length"
    assert len(finished[0].output_ids) == 4
    assert len(finished[0].prompt_ids) + 4 == 64


@pytest.mark.parametrize(
    ("prompt", "num_pages", "max_model_len", "fit"),
    [
        (10, 4, 1000, 55),  # 10 + 55 - 1 = 64 tokens = the 4 pages exactly
        (10, 4, 40, 30),  # the context is the tighter limit
        (64, 4, 1000, 1),  # the prompt fills the pool: one output token (never fed back)
        (65, 4, 1000, 0),  # nothing fits
    ],
)
def test_max_new_tokens_that_fit_by_hand(
    prompt: int, num_pages: int, max_model_len: int, fit: int
) -> None:
    config = SchedulerConfig(num_pages=num_pages, max_model_len=max_model_len)
    assert max_new_tokens_that_fit(prompt, config) == fit
    if fit < 1:
        return
    sched = Scheduler(config)
    assert sched.add(Request("fits", [1] * prompt, fit)).max_new_tokens == fit
    over = Request("over", [1] * prompt, fit + 1)
    if prompt + fit < max_model_len:  # the pool is the limit: one token more is rejected
        with pytest.raises(AdmissionError, match="pool has only"):
            sched.add(over)
    else:  # the context is the limit: one token more is clamped back
        assert sched.add(over).max_new_tokens == fit


def test_rejections_name_the_request_and_the_numbers() -> None:
    sched = make(4, max_model_len=64)
    with pytest.raises(AdmissionError, match=r"request 'e' rejected: the prompt is empty"):
        sched.add(Request("e", [], 5))
    with pytest.raises(
        AdmissionError, match=r"request 7 rejected: max_new_tokens must be .* got 0"
    ):
        sched.add(Request(7, [1], 0))
    with pytest.raises(AdmissionError, match=r"prompt has 64 tokens but max_model_len is 64"):
        sched.add(Request("full", [1] * 64, 1))
    with pytest.raises(AdmissionError, match=r"prompt_ids\[1\] is -1"):
        sched.add(Request("neg", [1, -1], 1))
    with pytest.raises(AdmissionError, match="stop_ids must be a frozenset"):
        sched.add(Request("s", [1], 1, stop_ids={2}))  # type: ignore[arg-type]
    big = make(4, max_model_len=1000)
    with pytest.raises(
        AdmissionError,
        match=r"request 'big' rejected: it needs 5 pages \(prompt 60 \+ max_new_tokens 20 - 1 = 79 "
        r"tokens, 16 per page\) but the KV-cache pool has only 4 pages",
    ):
        big.add(Request("big", [1] * 60, 20))
    big.add(Request("fits", [1] * 60, 5))  # 64 tokens: exactly the pool
    with pytest.raises(AdmissionError, match=r"request 'fits' rejected: .* still waiting"):
        big.add(Request("fits", [1], 1))
    assert big.num_waiting == 1
    assert not sched.has_unfinished()


def test_a_rejection_quotes_the_max_new_tokens_asked_for_when_the_context_clamped_it() -> None:
    sched = make(4, max_model_len=100)
    with pytest.raises(
        AdmissionError,
        match=r"it needs 7 pages \(prompt 60 \+ max_new_tokens 40 \(clamped from 500 by "
        r"max_model_len 100\) - 1 = 99 tokens, 16 per page\) but the KV-cache pool has only 4",
    ):
        sched.add(Request("long", [1] * 60, 500))


def test_a_pool_of_one_page_is_one_page_in_the_message() -> None:
    with pytest.raises(AdmissionError, match=r"pool has only 1 page; shorten"):
        make(1, max_model_len=100).add(Request("two", [1] * 20, 1))


def test_config_errors() -> None:
    with pytest.raises(SchedulerError, match="max_step_tokens"):
        SchedulerConfig(num_pages=4, max_model_len=64, max_num_seqs=8, max_step_tokens=4)
    with pytest.raises(SchedulerError, match="policy"):
        SchedulerConfig(num_pages=4, max_model_len=64, policy="greedy")  # type: ignore[arg-type]
    with pytest.raises(SchedulerError, match="num_pages"):
        SchedulerConfig(num_pages=0, max_model_len=64)
    with pytest.raises(SchedulerError, match="max_model_len must be at least 2"):
        SchedulerConfig(num_pages=4, max_model_len=1)
    with pytest.raises(SchedulerError, match="admission must be 'conservative' or 'preemptive'"):
        SchedulerConfig(num_pages=4, max_model_len=64, admission="optimistic")  # type: ignore[arg-type]


# -- FIFO waits, lazy pages, early stop -------------------------------------------------------------


def test_fifo_head_waits_and_nobody_skips_ahead() -> None:
    sched = make(4)
    a = sched.add(Request("A", [1] * 40, 9))  # 48 tokens: 3 pages
    b = sched.add(Request("B", [1] * 20, 5))  # 24 tokens: 2 pages
    c = sched.add(Request("C", [1] * 5, 3))  # 7 tokens: 1 page
    plan, _ = step(sched)
    assert admitted(plan) == ["A"]
    assert sched.free_credits == 1
    # C would fit in the last credit, but B is the head: C waits behind it.
    assert b.status is SequenceStatus.WAITING and c.status is SequenceStatus.WAITING
    for i in range(1, 9):
        plan, finished = step(sched)
        assert admitted(plan) == []
        assert [f.request_id for f in finished] == (["A"] if i == 8 else [])
    assert a.status is SequenceStatus.FINISHED and sched.free_credits == 4
    plan, _ = step(sched)
    assert admitted(plan) == ["B", "C"]
    assert sched.free_credits == 1
    stats = sched.stats
    assert stats.admission_waits == 9  # schedule() calls 0..8 found B blocked
    assert stats.waited_requests == 1
    while sched.has_unfinished():
        step(sched)
    stats = sched.stats
    assert stats.peak_assigned_pages == 3
    assert stats.peak_running == 2
    assert stats.largest_decode_batch == 2
    assert (stats.free_pages, stats.assigned_pages, stats.free_credits) == (4, 0, 4)
    assert stats.finished_requests == 3


def test_pages_are_assigned_lazily() -> None:
    sched = make(8)
    seq = sched.add(Request("r", [1] * 20, 30))  # 49 tokens: 4 credits
    assert seq.credits == 4
    for t in range(30):
        plan = sched.schedule()
        # Step 0 writes positions 0..19; step t >= 1 writes position 19 + t.
        last_position = 19 if t == 0 else 19 + t
        assert len(seq.block_table) == last_position // 16 + 1
        assert (seq in plan.block_table_changed) == (t in (0, 13, 29))
        assert sched.pool.num_assigned == len(seq.block_table)
        finished = sched.complete_step(plan, [NO_STOP])
    assert [f.finish_reason for f in finished] == ["length"]
    assert sched.pool.num_assigned == 0
    assert sched.stats.peak_assigned_pages == 4


@pytest.mark.parametrize(("max_new", "pages"), [(7, 1), (8, 2)])
def test_page_boundary_exactly_and_one_over(max_new: int, pages: int) -> None:
    sched = make(4)
    seq = sched.add(Request("r", [1] * 10, max_new))
    peak = 0
    while sched.has_unfinished():
        plan = sched.schedule()
        peak = max(peak, len(seq.block_table))
        sched.complete_step(plan, [NO_STOP])
    assert seq.num_output_tokens == max_new
    assert peak == pages == seq.credits
    # Every position written (prompt + all outputs but the last) had a slot.
    assert seq.num_computed_tokens == 10 + max_new - 1


def test_prompt_filling_a_page_gets_a_page_for_its_first_decode() -> None:
    sched = make(4)
    seq = sched.add(Request("r", [1] * 16, 3))  # 18 tokens: 2 pages
    plan, _ = step(sched)
    assert len(seq.block_table) == 1
    plan, _ = step(sched)  # feeds the first output token at position 16
    assert plan.decodes == [seq] and seq in plan.block_table_changed
    assert len(seq.block_table) == 2
    assert seq.table.capacity == 32  # position 16 is the first of the new second page


def test_early_stop_returns_pages_and_credits() -> None:
    sched = make(6)
    seq = sched.add(Request("r", [1] * 30, 50, stop_ids=frozenset({7, 8})))  # 79 tokens: 5 pages
    step(sched)
    step(sched)
    assert sched.free_credits == 1 and sched.pool.num_assigned == 2
    _, finished = step(sched, lambda s: 8)
    assert finished == [
        FinishedRequest("r", [1] * 30, [NO_STOP, NO_STOP, 8], "stop", num_cached_tokens=0)
    ]
    assert seq.finish_reason == "stop"
    assert sched.free_credits == 6 and sched.pool.num_assigned == 0
    assert not sched.has_unfinished()


def test_ignore_eos_runs_to_the_limit() -> None:
    sched = make(6)
    sched.add(Request("r", [1] * 3, 4, stop_ids=frozenset({7}), ignore_eos=True))
    out: list[FinishedRequest] = []
    while sched.has_unfinished():
        out += step(sched, lambda s: 7)[1]
    assert out[0].output_ids == [7, 7, 7, 7] and out[0].finish_reason == "length"


def test_stop_on_the_first_token_and_at_the_limit() -> None:
    sched = make(6)
    sched.add(Request("first", [1, 2], 5, stop_ids=frozenset({9})))
    sched.add(Request("last", [1, 2], 1, stop_ids=frozenset({9})))
    _, finished = step(sched, lambda s: 9)
    # A stop token at the length limit is reported as "stop": it is the reason generation ended.
    assert {(f.request_id, tuple(f.output_ids), f.finish_reason) for f in finished} == {
        ("first", (9,), "stop"),
        ("last", (9,), "stop"),
    }


# -- static vs continuous ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "c_admitted_at", "waits"), [("continuous", 2, 2), ("static", 10, 10)]
)
def test_static_vs_continuous_on_a_tiny_pool(policy: str, c_admitted_at: int, waits: int) -> None:
    sched = make(4, policy=policy)
    sched.add(Request("A", [1] * 16, 2))  # 17 tokens: 2 pages; finishes after step 1
    sched.add(Request("B", [1] * 16, 10))  # 25 tokens: 2 pages; finishes after step 9
    sched.add(Request("C", [1] * 16, 2))  # 2 pages
    admitted_at: dict[str | int, int] = {}
    finished_at: dict[str | int, int] = {}
    t = 0
    while sched.has_unfinished():
        plan, finished = step(sched)
        for rid in admitted(plan):
            admitted_at[rid] = t
        for f in finished:
            finished_at[f.request_id] = t
        t += 1
    assert admitted_at == {"A": 0, "B": 0, "C": c_admitted_at}
    assert finished_at["A"] == 1 and finished_at["B"] == 9
    # C waited in every schedule() call before its admission: continuous for credits (0-1),
    # static for credits (0) and then for the running group (1-9).
    assert sched.stats.admission_waits == waits == c_admitted_at
    assert sched.stats.waited_requests == 1


def test_static_admits_the_whole_group_beyond_the_step_budget() -> None:
    sched = make(16, policy="static", max_num_seqs=4, max_step_tokens=8)
    for i in range(3):
        sched.add(Request(i, [1] * 6, 2))
    plan = sched.schedule()
    assert sched.num_running == 3  # the group is decided now...
    assert [(c.seq.request_id, c.start, c.end) for c in plan.prefills] == [(0, 0, 6), (1, 0, 2)]
    sched.complete_step(plan, [NO_STOP])
    plan = sched.schedule()  # ...and prefills in chunks within the budget
    assert [(c.seq.request_id, c.start, c.end) for c in plan.prefills] == [(1, 2, 6), (2, 0, 3)]
    assert plan.num_tokens == 8


def test_max_num_seqs_is_not_a_credit_wait() -> None:
    sched = make(100, max_num_seqs=2)
    for i in range(3):
        sched.add(Request(i, [1] * 4, 3))
    plan, _ = step(sched)
    assert admitted(plan) == [0, 1]
    assert sched.stats.admission_waits == 0


# -- conservative vs preemptive ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("admission", "short_admitted_at"), [("conservative", 80), ("preemptive", 1)]
)
def test_a_long_budget_holds_back_others_only_under_conservative(
    admission: str, short_admitted_at: int
) -> None:
    """A request with the whole context as its budget (a chat without max_tokens) reserves the
    pool under the conservative policy: a 2-token request behind it waits for it to finish.
    The preemptive policy admits it on its prompt's page at once."""
    sched = make(8, admission=admission)
    sched.add(Request("long", [1] * 48, 80))  # 127 tokens: all 8 pages, eventually
    step(sched)
    sched.add(Request("short", [2] * 4, 2))
    t = 1
    while sched.get("short") is None or sched.get("short").status is SequenceStatus.WAITING:  # type: ignore[union-attr]
        step(sched)
        t += 1
    assert t == short_admitted_at + 1
    while sched.has_unfinished():
        step(sched)
    assert sched.stats.free_pages == 8 and sched.stats.preemptions == 0


def test_preemptive_keeps_a_watermark_free_for_running_sequences() -> None:
    """With 200 pages the watermark is 2: a head that would leave fewer free waits, unless
    nothing runs."""
    sched = make(200, admission="preemptive", max_model_len=4000)
    sched.add(Request("A", [1] * (150 * 16 - 1), 10))  # 150 pages, its next token too
    step(sched)
    sched.add(Request("B", [2] * (48 * 16), 2))  # 48 pages: 2 left, = the watermark
    sched.add(Request("C", [3] * 16, 2))  # 1 page: it would leave 1 < 2
    plan, _ = step(sched)
    assert admitted(plan) == ["B"] and sched.stats.admission_waits == 1
    assert sched.pool.num_available == 2
    lone = make(3, admission="preemptive")  # no watermark below 100 pages
    lone.add(Request("A", [1] * 48, 1))
    assert admitted(lone.schedule()) == ["A"]
