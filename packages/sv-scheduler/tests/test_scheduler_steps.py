"""Step plans: chunked prefill, sampling order, table rows, changed rows, cancellation, misuse,
prefix caching through the scheduler, and the preemptive policy's preemption."""

from __future__ import annotations

import pytest
from sv_scheduler import (
    Request,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    SequenceStatus,
    StepPlan,
)

NO_STOP = 100


def make(num_pages: int, **kw: object) -> Scheduler:
    kw.setdefault("max_model_len", 1000)
    kw.setdefault("prefix_caching", False)
    return Scheduler(SchedulerConfig(num_pages=num_pages, **kw))  # type: ignore[arg-type]


def chunks(plan: StepPlan) -> list[tuple[str | int, int, int, bool]]:
    return [(c.seq.request_id, c.start, c.end, c.samples) for c in plan.prefills]


def ids(seqs: list) -> list[str | int]:  # type: ignore[type-arg]
    return [s.request_id for s in seqs]


def test_chunked_prefill_decodes_first() -> None:
    sched = make(64, max_num_seqs=2, max_step_tokens=32)
    sched.add(Request("A", [1] * 10, 20))
    sched.add(Request("B", [2] * 50, 5))
    plan = sched.schedule()
    assert chunks(plan) == [("A", 0, 10, True), ("B", 0, 22, False)]
    assert ids(plan.sampling) == ["A"] and plan.num_tokens == 32
    sched.complete_step(plan, [NO_STOP])
    plan = sched.schedule()
    # A decodes first (1 token), B's prompt takes the remaining 31 and finishes.
    assert ids(plan.decodes) == ["A"]
    assert chunks(plan) == [("B", 22, 50, True)]
    assert ids(plan.sampling) == ["B", "A"]  # finishing prefills, then decodes
    assert plan.num_prefill_samples == 1 and plan.num_tokens == 29
    sched.complete_step(plan, [NO_STOP, NO_STOP])
    plan = sched.schedule()
    assert ids(plan.decodes) == ["A", "B"] and plan.prefills == []
    b = sched.get("B")
    assert b is not None and b.num_computed_tokens == 50 and len(b.token_ids) == 51


def test_long_prompt_never_stalls_running_decodes() -> None:
    sched = make(64, max_num_seqs=4, max_step_tokens=8)
    sched.add(Request("short", [1] * 3, 30))
    sched.complete_step(sched.schedule(), [NO_STOP])
    sched.add(Request("long", [2] * 40, 2))
    decoded = []
    while sched.get("long") is not None and not sched.get("long").decoding:  # type: ignore[union-attr]
        plan = sched.schedule()
        decoded.append(ids(plan.decodes))
        assert plan.num_tokens <= 8
        sched.complete_step(plan, [NO_STOP] * len(plan.sampling))
    assert len(decoded) == 6  # 40 tokens at 7 per step
    assert all(d == ["short"] for d in decoded)


def test_table_rows_are_stable_and_reused_lowest_first() -> None:
    sched = make(64, max_num_seqs=3)
    a = sched.add(Request("A", [1] * 3, 5))
    b = sched.add(Request("B", [1] * 3, 2))
    c = sched.add(Request("C", [1] * 3, 5))
    d = sched.add(Request("D", [1] * 3, 5))
    plan = sched.schedule()
    assert [s.table_row for s in (a, b, c)] == [0, 1, 2] and d.table_row == -1
    assert ids(plan.block_table_changed) == ["A", "B", "C"]
    sched.complete_step(plan, [NO_STOP] * 3)
    plan = sched.schedule()
    assert plan.block_table_changed == [] and [s.table_row for s in (a, b, c)] == [0, 1, 2]
    finished = sched.complete_step(plan, [NO_STOP] * 3)
    assert ids(finished) == ["B"] and b.table_row == -1
    plan = sched.schedule()
    assert d.table_row == 1 and ids(plan.block_table_changed) == ["D"]


def test_cancel_waiting_running_and_unknown() -> None:
    sched = make(8, max_num_seqs=1)
    a = sched.add(Request("A", [1] * 20, 10))
    b = sched.add(Request("B", [1] * 4, 10))
    sched.complete_step(sched.schedule(), [NO_STOP])
    assert sched.free_credits == 6 and sched.pool.num_assigned == 2
    assert sched.cancel("B") is b
    assert b.status is SequenceStatus.FINISHED and b.finish_reason == "cancelled"
    assert sched.cancel("B") is None and sched.cancel("nobody") is None
    assert sched.cancel("A") is a
    assert a.finish_reason == "cancelled" and a.block_table == []
    assert sched.free_credits == 8 and sched.pool.num_assigned == 0
    assert not sched.has_unfinished()
    plan = sched.schedule()
    assert plan.is_empty
    assert sched.complete_step(plan, []) == []
    assert sched.stats.cancelled_requests == 2


def test_cancel_while_the_step_runs_drops_its_token() -> None:
    sched = make(16)
    a = sched.add(Request("A", [1] * 4, 10))
    b = sched.add(Request("B", [1] * 4, 10))
    sched.complete_step(sched.schedule(), [NO_STOP, NO_STOP])
    plan = sched.schedule()
    assert ids(plan.sampling) == ["A", "B"]
    assert sched.cancel("A")
    finished = sched.complete_step(plan, [11, 12])
    assert finished == []
    assert a.output_ids == [NO_STOP] and b.output_ids == [NO_STOP, 12]
    assert sched.pool.num_assigned == 1 and sched.num_running == 1
    # A prefilling sequence cancelled mid-step is skipped too.
    sched.add(Request("C", [1] * 4, 10))
    plan = sched.schedule()
    assert chunks(plan) == [("C", 0, 4, True)]
    assert sched.cancel("C")
    assert sched.complete_step(plan, [13, 14]) == []
    assert ids(sched.running()) == ["B"]


def test_misuse_is_reported() -> None:
    sched = make(8)
    sched.add(Request("A", [1] * 4, 3))
    plan = sched.schedule()
    with pytest.raises(
        SchedulerError, match=r"schedule\(\) called again before advance\(\) or complete_step"
    ):
        sched.schedule()
    with pytest.raises(SchedulerError, match=r"needs 1 sampled tokens .* got 2"):
        sched.complete_step(plan, [1, 2])
    sched.complete_step(plan, [NO_STOP])
    with pytest.raises(SchedulerError, match="not the plan"):
        sched.complete_step(plan, [NO_STOP])


# -- prefix caching through the scheduler -----------------------------------------------------------

PROMPT = list(range(1000, 1040))  # 40 tokens: 2 full pages + 8


def test_second_request_shares_the_computed_prefix() -> None:
    sched = make(16, prefix_caching=True)
    a = sched.add(Request("A", PROMPT, 5))
    sched.complete_step(sched.schedule(), [NO_STOP])  # A's prompt is computed: pages registered
    b = sched.add(Request("B", PROMPT[:32] + [7] * 8, 5))
    plan = sched.schedule()
    assert chunks(plan) == [("B", 32, 40, True)]
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [sched.pool.refcount(p) for p in a.block_table] == [2, 2, 1]
    assert b.credits == 3  # shared pages still count fully toward B's credits
    assert sched.stats.prefix_cache_hit_tokens == 32
    sched.complete_step(plan, [NO_STOP, NO_STOP])
    finished = []
    while sched.has_unfinished():
        p = sched.schedule()
        finished += sched.complete_step(p, [NO_STOP] * len(p.sampling))
    assert {f.request_id: f.num_cached_tokens for f in finished} == {"A": 0, "B": 32}
    stats = sched.stats
    assert stats.assigned_pages == 0 and stats.free_pages == 16 and stats.cached_pages > 0


def test_cached_tokens_are_the_prompts_at_its_first_admission() -> None:
    """A preempted request resumes on its own cached pages, output included: what it reports
    as cached is still its prompt's share at its first admission (none here), as vLLM's."""
    from sv_scheduler import Scheduler, SchedulerConfig

    sched = Scheduler(
        SchedulerConfig(
            num_pages=6, max_model_len=1000, admission="preemptive", max_num_seqs=2,
            max_step_tokens=64, prefix_caching=True,
        )
    )  # fmt: skip
    sched.add(Request("A", list(range(1, 17)), 60))
    sched.add(Request("B", list(range(100, 104)), 60))
    finished = []
    while sched.has_unfinished():
        plan = sched.schedule()
        finished += sched.complete_step(plan, [NO_STOP] * plan.num_sampled)
    assert sched.stats.preemptions > 0 and sched.stats.prefix_cache_hit_tokens > 0
    assert {f.request_id: f.num_cached_tokens for f in finished} == {"A": 0, "B": 0}


def test_same_step_prompts_wait_for_the_shared_pages() -> None:
    """B arrives with A and starts like it: its pages are not written yet, so B waits one step
    (not an admission wait) and then starts on A's computed pages instead of computing them."""
    sched = make(16, prefix_caching=True)
    sched.add(Request("A", PROMPT, 5))
    sched.add(Request("B", PROMPT[:32] + [7] * 8, 5))
    sched.add(Request("C", [9] * 8, 5))  # behind B: FIFO, so it waits too
    plan = sched.schedule()
    assert chunks(plan) == [("A", 0, 40, True)]
    sched.complete_step(plan, [NO_STOP])
    plan = sched.schedule()
    assert chunks(plan) == [("B", 32, 40, True), ("C", 0, 8, True)]
    assert sched.stats.prefix_cache_hit_tokens == 32 and sched.stats.admission_waits == 0


def test_same_step_prompts_wait_only_for_a_page_still_to_compute() -> None:
    """A's prompt prefills in chunks of 16: B waits while A's first page is being computed,
    then shares it; D, whose start no one is computing, never waits for that."""
    sched = make(16, prefix_caching=True, max_num_seqs=2, max_step_tokens=16)
    sched.add(Request("A", PROMPT, 5))
    sched.add(Request("B", PROMPT[:16] + [7] * 4, 5))
    plan = sched.schedule()
    assert chunks(plan) == [("A", 0, 16, False)]
    sched.complete_step(plan, [])
    plan = sched.schedule()  # A's first page is cached now; B starts on it
    assert chunks(plan) == [("A", 16, 32, False)]
    sched.complete_step(plan, [])
    plan = sched.schedule()
    assert chunks(plan) == [("A", 32, 40, True), ("B", 16, 20, True)]
    assert sched.stats.prefix_cache_hit_tokens == 16
    other = make(16, prefix_caching=True, max_num_seqs=2, max_step_tokens=16)
    other.add(Request("A", PROMPT, 5))
    other.add(Request("D", [5] * 20, 5))
    assert chunks(other.schedule()) == [("A", 0, 16, False)]  # budget spent: D waits for it


def test_static_group_admits_together_even_with_a_shared_start() -> None:
    """Static: B joins A's group at once (waiting for A's page would hold B back a group)."""
    sched = make(16, prefix_caching=True, policy="static")
    sched.add(Request("A", PROMPT, 5))
    sched.add(Request("B", PROMPT, 5))
    assert chunks(sched.schedule()) == [("A", 0, 40, True), ("B", 0, 40, True)]


def test_identical_prompt_recomputes_its_last_page() -> None:
    sched = make(16, prefix_caching=True)
    sched.add(Request("A", PROMPT[:32], 5))
    sched.complete_step(sched.schedule(), [NO_STOP])
    sched.add(Request("B", PROMPT[:32], 5))
    plan = sched.schedule()
    # 32 identical tokens: at most 31 may be shared, i.e. one full page; page 2 is recomputed.
    assert chunks(plan) == [("B", 16, 32, True)]


def test_generated_pages_are_cached_at_finish() -> None:
    sched = make(16, prefix_caching=True)
    sched.add(Request("A", PROMPT[:10], 30))
    outputs: list[int] = []
    while sched.has_unfinished():
        plan = sched.schedule()
        token = 500 + len(outputs)
        outputs.append(token)
        sched.complete_step(plan, [token])
    # A follow-up turn whose prompt contains A's prompt and output hits pages 0..1 (32 tokens):
    # 39 tokens had KV written (the last output token was never fed).
    follow_up = PROMPT[:10] + outputs + [1, 2, 3]
    sched.add(Request("B", follow_up, 2))
    plan = sched.schedule()
    assert chunks(plan) == [("B", 32, len(follow_up), True)]


def test_cached_pages_count_as_available() -> None:
    sched = make(4, prefix_caching=True)
    sched.add(Request("A", PROMPT[:32], 1))  # 32 tokens: 2 pages, both cached after
    sched.complete_step(sched.schedule(), [NO_STOP])
    assert sched.stats.cached_pages == 2 and sched.stats.free_pages == 4
    sched.add(Request("B", [9] * 50, 14))  # 63 tokens: all 4 pages
    plan = sched.schedule()
    assert chunks(plan) == [("B", 0, 50, True)]
    assert sched.pool.num_evictions == 2 and sched.stats.cached_pages == 0


# -- preemptive policy ------------------------------------------------------------------------------


def test_preemptive_preempts_the_newest_and_recomputes() -> None:
    sched = make(4, page_size=4, admission="preemptive", max_num_seqs=2, max_step_tokens=16)
    a = sched.add(Request("A", [1] * 4, 8))  # 11 tokens: 3 pages
    b = sched.add(Request("B", [2] * 4, 8))  # 3 pages; the pool cannot hold both budgets
    sched.add(Request("C", [3] * 4, 8))  # waits: max_num_seqs is 2
    plan = sched.schedule()
    assert chunks(plan) == [("A", 0, 4, True), ("B", 0, 4, True)]  # admitted on 1 page each
    tokens = {"A": 10, "B": 20, "C": 30}
    prefill_chunks: list[tuple[str | int, int, int, bool]] = []

    def run(plan: StepPlan) -> list:  # type: ignore[type-arg]
        prefill_chunks.extend(chunks(plan))
        out = []
        for s in plan.sampling:
            tokens[s.request_id] += 1  # type: ignore[index]
            out.append(tokens[s.request_id])  # type: ignore[index]
        return sched.complete_step(plan, out)

    run(plan)
    for _ in range(4):  # positions 4..7: both get their second page at step 1
        plan = sched.schedule()
        assert plan.preempted == []
        run(plan)
    assert sched.pool.num_available == 0
    plan = sched.schedule()  # A needs a third page: B, the newest, is preempted
    assert ids(plan.preempted) == ["B"] and ids(plan.decodes) == ["A"]
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.table_row == -1
    assert b.output_ids == [21, 22, 23, 24, 25]  # kept
    assert ids(sched.waiting()) == ["B", "C"]  # back at the front of the queue
    assert sched.stats.preemptions == 1 and sched.stats.recomputed_tokens == 0
    # B needs 3 pages to recompute 9 tokens; 1 is free. C would fit, but waits behind B (FIFO).
    assert chunks(plan) == []
    run(plan)
    finished = []
    while sched.has_unfinished():
        finished += run(sched.schedule())
    # B recomputed its prompt and its 5 outputs (9 tokens) in one chunk, then went on: 8 of
    # them had KV before (the newest output had not been fed yet). C then started on the one
    # free page and, needing a second while B held 3, preempted itself (the newest) once: its
    # 4 prompt tokens were computed again, with its first output.
    assert ("B", 0, 9, True) in prefill_chunks
    assert prefill_chunks[-2:] == [("C", 0, 4, True), ("C", 0, 5, True)]
    assert (sched.stats.preemptions, sched.stats.recomputed_tokens) == (2, 8 + 4)
    assert prefill_chunks.index(("B", 0, 9, True)) < prefill_chunks.index(("C", 0, 4, True))
    assert {f.request_id: f.output_ids for f in finished} == {
        "A": list(range(11, 19)),
        "B": list(range(21, 29)),
        "C": list(range(31, 39)),
    }
    assert a.num_preemptions == 0 and b.num_preemptions == 1
    assert sched.pool.num_available == 4


def test_preemptive_lone_sequence_preempts_nobody_but_itself_never() -> None:
    """A request whose budget fits the pool always completes alone."""
    sched = make(3, page_size=4, admission="preemptive")
    sched.add(Request("A", [1] * 5, 8))  # 12 tokens: 3 pages = the pool
    n = 0
    while sched.has_unfinished():
        plan = sched.schedule()
        assert plan.preempted == []
        sched.complete_step(plan, [NO_STOP] * len(plan.sampling))
        n += 1
    assert n == 8 and sched.stats.preemptions == 0


# -- pipelined: advance, schedule the next step, then resolve ---------------------------------------


def test_pipelined_stop_is_applied_one_step_late_and_its_next_token_dropped() -> None:
    sched = make(16, page_size=4)
    a = sched.add(Request("A", [1] * 4, 10, stop_ids=frozenset({7})))
    plan0 = sched.schedule()
    sched.advance(plan0)
    assert a.token_ids == [1] * 4 and a.num_pending == 1 and a.num_output_tokens == 1
    plan1 = sched.schedule()  # A feeds its pending token at position 4
    assert ids(plan1.decodes) == ["A"] and a.num_computed_tokens == 4
    with pytest.raises(SchedulerError, match="step 0 is unresolved"):
        sched.advance(plan1)
    finished = sched.resolve(plan0, [7])  # a stop token: A ends now, with pages back
    assert [(f.request_id, f.output_ids, f.finish_reason) for f in finished] == [("A", [7], "stop")]
    assert a.status is SequenceStatus.FINISHED and sched.pool.num_assigned == 0
    sched.advance(plan1)  # A's token of step 1 is dropped
    assert a.token_ids == [1] * 4 + [7]
    assert sched.resolve(plan1, [9]) == [] and a.token_ids == [1] * 4 + [7]
    assert not sched.has_unfinished() and sched.free_credits == 16


def test_pipelined_length_limit_is_known_at_advance() -> None:
    sched = make(16, page_size=4)
    a = sched.add(Request("A", [1] * 4, 2))
    sched.complete_step(sched.schedule(), [NO_STOP])
    plan = sched.schedule()
    sched.advance(plan)  # A's second and last token: it leaves before its value is known
    assert not sched.has_unfinished() and sched.pool.num_assigned == 0
    assert sched.schedule().is_empty
    (done,) = sched.resolve(plan, [55])
    assert (done.output_ids, done.finish_reason) == ([NO_STOP, 55], "length")
    assert a.token_ids[-1] == 55
    assert sched.cancel("A") is None  # reported: nothing left to cancel
    assert (sched.stats.finished_requests, sched.stats.cancelled_requests) == (1, 0)


def test_an_id_whose_finish_is_unreported_is_not_taken_again() -> None:
    """Between advance and resolve a finished request is still the id's: a new request of
    the same id would have resolve report the old one's finish and cancel hit the new one."""
    from sv_scheduler import AdmissionError

    sched = make(16, page_size=4)
    sched.add(Request("A", [1] * 4, 1))
    plan = sched.schedule()
    sched.advance(plan)  # A's only token: it finishes here, unreported
    with pytest.raises(AdmissionError, match=r"'A' rejected: .* not reported yet"):
        sched.add(Request("A", [9], 5))
    (done,) = sched.resolve(plan, [55])
    assert (done.request_id, done.output_ids) == ("A", [55])
    sched.add(Request("A", [9], 5))  # reported: the id is free again


def test_pipelined_cancel_before_a_length_finish_is_reported() -> None:
    # A reached its limit when the step was advanced, but its last token is not known yet:
    # cancelling it then ends it as cancelled, with the tokens resolved so far, and resolve
    # reports nothing for it (a caller that closed its stream gets no late "length" finish).
    sched = make(16, page_size=4)
    a = sched.add(Request("A", [1] * 4, 2))
    b = sched.add(Request("B", [1] * 4, 10))
    sched.complete_step(sched.schedule(), [NO_STOP, NO_STOP])
    plan = sched.schedule()
    sched.advance(plan)
    assert sched.get("A") is None and a.status is SequenceStatus.FINISHED
    assert sched.cancel("A") is a
    assert a.finish_reason == "cancelled" and a.output_ids == [NO_STOP]
    assert sched.cancel("A") is None
    assert sched.resolve(plan, [55, 56]) == []
    assert a.output_ids == [NO_STOP] and b.output_ids == [NO_STOP, 56]
    stats = sched.stats
    assert (stats.finished_requests, stats.cancelled_requests) == (0, 1)
    assert stats.assigned_pages == 2  # B's two pages; A's came back at advance


def test_abandon_counts_unreported_finishes_as_cancelled() -> None:
    sched = make(16, page_size=4)
    sched.add(Request("A", [1] * 4, 2))
    sched.complete_step(sched.schedule(), [NO_STOP])
    sched.advance(sched.schedule())  # A finishes by length; its step then fails
    sched.abandon()
    stats = sched.stats
    assert (stats.finished_requests, stats.cancelled_requests) == (0, 1)
    assert not sched.has_unfinished() and stats.free_pages == 16


def test_pipelined_cancel_drops_the_pending_token() -> None:
    sched = make(16, page_size=4)
    a = sched.add(Request("A", [1] * 4, 10))
    sched.complete_step(sched.schedule(), [NO_STOP])
    plan = sched.schedule()
    sched.advance(plan)
    assert sched.cancel("A")
    assert a.output_ids == [NO_STOP] and sched.pool.num_assigned == 0
    assert sched.resolve(plan, [55]) == [] and a.output_ids == [NO_STOP]


def test_pipelined_stop_of_a_sequence_preempted_meanwhile() -> None:
    """Preemptive policy: B is preempted (back to the queue) while its newest token is still
    pending; that token turns out to be a stop token, so B finishes instead of recomputing."""
    sched = make(4, page_size=4, admission="preemptive", max_num_seqs=2, max_step_tokens=16)
    sched.add(Request("A", [1] * 4, 8))
    b = sched.add(Request("B", [2] * 4, 8, stop_ids=frozenset({7})))
    sched.add(Request("C", [3] * 4, 8))
    for _ in range(4):
        plan = sched.schedule()
        sched.complete_step(plan, [NO_STOP] * len(plan.sampling))
    plan = sched.schedule()  # positions 4..: no page needed yet
    assert plan.preempted == []
    sched.advance(plan)
    following = sched.schedule()  # A needs its third page: B, the newest, is preempted
    assert ids(following.preempted) == ["B"] and ids(sched.waiting()) == ["B", "C"]
    assert b.num_pending == 1 and b.num_tokens == len(b.token_ids) + 1
    finished = sched.resolve(plan, [NO_STOP, 7])
    assert [(f.request_id, f.finish_reason) for f in finished] == [("B", "stop")]
    assert b.output_ids == [NO_STOP] * 4 + [7]
    assert ids(sched.waiting()) == ["C"] and b.status is SequenceStatus.FINISHED
    sched.advance(following)
    sched.resolve(following, [NO_STOP] * len(following.sampling))
    while sched.has_unfinished():
        plan = sched.schedule()
        sched.complete_step(plan, [NO_STOP] * len(plan.sampling))
    assert sched.pool.num_available == 4 and sched.stats.finished_requests == 3
