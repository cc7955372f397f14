"""Prompt lookup and the accepted run, against brute-force oracles; speculation settings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sv_scheduler import Request, Scheduler, SchedulerConfig, SchedulerError, SpeculationConfig
from sv_scheduler.speculation import DraftState, accepted_run


def lookup_oracle(tokens: list[int], limit: int, ngram: int, min_ngram: int) -> list[int]:
    """The latest earlier occurrence of the longest suffix (n from ngram down), searched by
    brute force; the tokens that followed it."""
    end = len(tokens)
    for n in range(ngram, min_ngram - 1, -1):
        if n > end - 1:
            continue
        suffix = tokens[end - n :]
        for start in range(end - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + limit]
    return []


@given(
    tokens=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    cut=st.integers(0, 60),
    limit=st.integers(1, 8),
    ngram=st.integers(1, 4),
    min_ngram=st.integers(1, 4),
)
def test_lookup_finds_the_latest_occurrence_of_the_longest_suffix(
    tokens: list[int], cut: int, limit: int, ngram: int, min_ngram: int
) -> None:
    min_ngram = min(min_ngram, ngram)
    state = DraftState(SpeculationConfig(ngram=ngram, min_ngram=min_ngram, miss_limit=10**6))
    # The index grows with the sequence: look up once part way, then at the end.
    head = tokens[: max(1, min(cut, len(tokens)))]
    assert state.propose(head, limit, 0) == lookup_oracle(head, limit, ngram, min_ngram)
    assert state.propose(tokens, limit, 1) == lookup_oracle(tokens, limit, ngram, min_ngram)


def test_a_hand_made_lookup() -> None:
    state = DraftState(SpeculationConfig(ngram=2))
    #        0  1  2  3  4  5  6  7
    tokens = [7, 8, 9, 1, 7, 8, 2, 7, 8]
    assert state.propose(tokens, 3, 0) == [2, 7, 8]  # "7 8" last seen at 4..5, then 2 7 8


@pytest.mark.parametrize(
    ("draft", "choices", "accepted"),
    [([5, 6, 7], [5, 6, 7, 8], 3), ([5, 6, 7], [5, 9, 7, 8], 1), ([5], [4, 5], 0), ([], [3], 0)],
)
def test_accepted_run(draft: list[int], choices: list[int], accepted: int) -> None:
    assert accepted_run(draft, choices) == accepted


def test_misses_pause_and_success_adapts_the_length() -> None:
    state = DraftState(SpeculationConfig(max_draft=16, miss_limit=2, first_pause=4, max_pause=8))
    state.record(drafted=16, accepted=2, step=0)
    assert state.k == 8  # twice the run and its bonus token (6), but at least max_draft / 2
    state.record(drafted=8, accepted=5, step=1)
    assert state.k == 12  # twice the run and its bonus token
    state.record(drafted=12, accepted=12, step=2)
    assert state.k == 16  # doubled after a full acceptance, at most max_draft
    state.record(drafted=6, accepted=0, step=2)
    assert state.k == 8 and state.resume_step == 0  # one miss: no pause yet
    state.record(drafted=1, accepted=0, step=3)
    assert state.resume_step == 3 + 1 + 4  # second miss in a row: paused for 4 steps
    state.record(drafted=1, accepted=0, step=8)
    state.record(drafted=1, accepted=0, step=9)
    assert state.resume_step == 9 + 1 + 8  # the pause doubled
    state.record(drafted=1, accepted=0, step=18)
    state.record(drafted=1, accepted=0, step=19)
    assert state.resume_step == 19 + 1 + 8  # ... up to max_pause


@given(
    tokens=st.lists(st.integers(0, 5), min_size=1, max_size=40),
    ngram=st.integers(1, 4),
    min_ngram=st.integers(1, 4),
)
def test_may_draft_when_a_lookup_would_find_a_draft(
    tokens: list[int], ngram: int, min_ngram: int
) -> None:
    """`may_draft` of the known tokens is whether a lookup in them finds anything (the brute
    force above), and nothing while paused."""
    min_ngram = min(min_ngram, ngram)
    config = SpeculationConfig(ngram=ngram, min_ngram=min_ngram, miss_limit=1, first_pause=3)
    state = DraftState(config)
    found = bool(lookup_oracle(tokens, 1, ngram, min_ngram))
    assert state.may_draft(tokens, 0) is found
    state.miss(0)  # paused until step 4
    assert state.may_draft(tokens, 3) is False
    assert state.may_draft(tokens, 4) is found


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_draft": 0},
        {"ngram": True},
        {"ngram": 2, "min_ngram": 3},
        {"min_ngram": 0},
        {"first_pause": 9, "max_pause": 8},
        {"max_batch": 0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(SchedulerError, match="SpeculationConfig"):
        SpeculationConfig(**kwargs)  # type: ignore[arg-type]


def _draft_lengths(limit: int, steps: int) -> tuple[list[int], list[bool]]:
    """One request whose tokens cycle 1 2 3 (so prompt lookup always finds a draft), with a
    `draft_limit` allowing `limit` tokens; every choice is the cycle's next token (each draft
    is accepted in full). The draft length and `would_draft` after each step."""
    config = SchedulerConfig(
        num_pages=64,
        max_model_len=512,
        speculation=SpeculationConfig(max_draft=4, miss_limit=2, first_pause=4),
    )
    scheduler = Scheduler(config)
    asked: list[list[int]] = []

    def draft_limit(seq: object, draft: list[int]) -> int:
        asked.append(draft)
        return min(limit, len(draft))

    scheduler.draft_limit = draft_limit
    scheduler.add(Request("r", [1, 2, 3] * 4, max_new_tokens=300, ignore_eos=True))
    lengths, would = [], []
    for _ in range(steps):
        plan = scheduler.schedule()
        scheduler.advance(plan)
        seq = plan.sampling[0]
        tokens = [1 + (seq.num_tokens - 1) % 3]  # the cycle at the position of its new token
        tokens += [1 + d % 3 for d in seq.draft]  # the cycle's next token after each draft
        lengths.append(len(seq.draft))
        scheduler.resolve(plan, tokens)
        would.append(scheduler.would_draft)
    assert all(len(d) >= 1 for d in asked)
    return lengths, would


def test_draft_limit_cuts_each_draft() -> None:
    lengths, _ = _draft_lengths(limit=1, steps=12)
    assert max(lengths) == 1 and lengths.count(1) >= 8


def test_a_draft_cut_to_nothing_is_a_miss_and_pauses_speculation() -> None:
    lengths, would = _draft_lengths(limit=0, steps=6)
    assert lengths == [0] * 6
    assert would[2] is False  # the second miss in a row (the first decode's) paused it


def test_no_drafts_while_more_requests_are_unfinished_than_max_batch() -> None:
    """Three requests whose tokens cycle 1 2 3 (lookup always finds a draft) under max_batch 2,
    two running at most: no step drafts (nor would) while the third waits, though only two
    decode; once the shortest finishes and the third runs, the two left draft."""
    config = SchedulerConfig(
        num_pages=64,
        max_model_len=512,
        max_num_seqs=2,
        speculation=SpeculationConfig(max_batch=2),
    )
    scheduler = Scheduler(config)
    for i, new in enumerate((3, 40, 40)):
        scheduler.add(Request(f"r{i}", [1, 2, 3] * 4, max_new_tokens=new, ignore_eos=True))
    drafted: list[tuple[int, int]] = []  # (unfinished requests, draft tokens) per decode step
    while scheduler.has_unfinished():
        unfinished = scheduler.num_running + scheduler.num_waiting
        plan = scheduler.schedule()
        scheduler.advance(plan)
        tokens = [1 + (seq.num_tokens - 1) % 3 for seq in plan.sampling]
        for seq in plan.decodes:
            tokens += [1 + d % 3 for d in seq.draft]
        if plan.decodes:
            drafted.append((unfinished, plan.num_draft_tokens))
        scheduler.resolve(plan, tokens)
        if scheduler.num_running + scheduler.num_waiting > 2:
            assert not scheduler.would_draft
    assert any(unfinished > 2 for unfinished, _ in drafted)
    assert all(tokens == 0 for unfinished, tokens in drafted if unfinished > 2)
    assert any(tokens > 0 for unfinished, tokens in drafted if unfinished <= 2)


def test_would_draft_waits_only_for_a_suffix_seen_before() -> None:
    """A prompt of distinct tokens, then distinct new tokens: no step need wait for the one
    before it. Once the known tokens end in a pair seen before (10 11), it would draft."""
    config = SchedulerConfig(
        num_pages=64,
        max_model_len=512,
        speculation=SpeculationConfig(min_ngram=2, miss_limit=10**6),
    )
    scheduler = Scheduler(config)
    scheduler.add(Request("r", [10, 11, 12, 13, 14], max_new_tokens=40, ignore_eos=True))
    would = []
    for token in (20, 21, 22, 10, 11, 23):
        plan = scheduler.schedule()
        scheduler.advance(plan)
        assert plan.num_draft_tokens == 0 or token == 23
        scheduler.resolve(plan, [token] + [0] * plan.num_draft_tokens)
        would.append(scheduler.would_draft)
    # after 20, 21, 22: no; after 10 (a single token seen before): no; after 10 11: yes
    assert would[:5] == [False, False, False, False, True]
