"""The engine's live requests and their counts of a step's optional parts (sv_engine.live).

A step builds its sampling parameters, log-probabilities, logit controls and grammar masks only
while a live request needs them, so the counts must follow every way a request arrives and
leaves: finishing, a cancel, and a failed step. The expected counts are written out by hand
from each request's parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from speculation_testing import assert_all_back
from sv_engine import Engine, SamplingParams
from sv_engine.grammar import Grammar

PROMPT = "Name a colour."

# name -> (parameters, (sampling, logprobs, controlled, constrained))
REQUESTS = {
    "greedy": (SamplingParams(max_new_tokens=6), (0, 0, 0, 0)),
    # shorter, so that a later launch can fail while they are finished but not yet reported
    "sampled": (SamplingParams(max_new_tokens=3, temperature=0.8, seed=1), (1, 0, 0, 0)),
    "logprobs": (SamplingParams(max_new_tokens=3, logprobs=2), (0, 1, 0, 0)),
    "prompt_logprobs": (SamplingParams(max_new_tokens=6, prompt_logprobs=1), (0, 1, 0, 0)),
    "biased": (SamplingParams(max_new_tokens=6, logit_bias={5: 2.0}), (0, 0, 1, 0)),
    "everything": (
        SamplingParams(
            max_new_tokens=6,
            temperature=0.7,
            seed=2,
            logprobs=1,
            logit_bias={7: 1.0},  # (min_tokens beside a grammar is refused)
            grammar=Grammar.choice(["red", "blue"]),
        ),
        (1, 1, 1, 1),
    ),
}


def _counts(engine: Engine) -> tuple[int, int, int, int]:
    live = engine._live
    return (live.num_sampling, live.num_logprobs, live.num_controlled, live.num_constrained)


def _sum(names: list[str]) -> tuple[int, ...]:
    return tuple(sum(REQUESTS[n][1][i] for n in names) for i in range(4))


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)


def test_counts_follow_adds_cancels_and_finishes(engine: Engine) -> None:
    ids = {name: engine.add_request(PROMPT, params) for name, (params, _) in REQUESTS.items()}
    assert _counts(engine) == _sum(list(REQUESTS)) == (2, 3, 2, 1)
    engine.step()
    engine.cancel(ids["everything"])
    engine.cancel(ids["logprobs"])
    left = [n for n in REQUESTS if n not in ("everything", "logprobs")]
    assert _counts(engine) == _sum(left) == (1, 1, 1, 0)
    while engine.has_unfinished():
        engine.step()
    assert _counts(engine) == (0, 0, 0, 0)
    assert not list(engine._live) and not engine._live._prompt_scores
    assert_all_back(engine)


@pytest.mark.parametrize("failing_launch", range(1, 7))  # a launch per token: 6 in all
def test_a_failed_step_forgets_every_request(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, failing_launch: int
) -> None:
    """Whichever launch fails (a request may have reached its length in the step before, and
    be finished in the scheduler but not yet reported), nothing is left counted or held."""
    for params, _ in REQUESTS.values():
        engine.add_request(PROMPT, params)
    launch = engine.runner.launch
    calls = 0

    def failing(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == failing_launch:
            raise RuntimeError("the device went away")
        return launch(*args)

    monkeypatch.setattr(engine.runner, "launch", failing)
    with pytest.raises(RuntimeError, match="went away"):
        while engine.has_unfinished():
            engine.step()
    assert _counts(engine) == (0, 0, 0, 0)
    assert not list(engine._live) and not engine._live.constrained
    assert not engine._live._prompt_scores
    assert_all_back(engine)
    monkeypatch.undo()
    # and the engine serves again, counting afresh
    out = engine.generate([PROMPT], REQUESTS["sampled"][0])
    assert len(out[0].output_ids) == 3
    assert _counts(engine) == (0, 0, 0, 0)


def _digit_ids(engine: Engine) -> frozenset[int]:
    ids = [engine.tokenizer.encode(str(d)) for d in range(10)]
    assert all(len(i) == 1 for i in ids)
    return frozenset(i[0] for i in ids)


def test_the_constrained_requests_leave_however_they_end(engine: Engine) -> None:
    """The engine checks the matchers of `LiveRequests.constrained` after every step, and only
    theirs: each request with a grammar is there from add_request to its final event, whether
    it finishes, is cancelled or fails its grammar, and one without a grammar never is."""
    grammar = Grammar.choice(["red", "blue", "green and yellow and purple"])
    ids = {
        "finishes": engine.add_request(PROMPT, SamplingParams(max_new_tokens=6, grammar=grammar)),
        "cancelled": engine.add_request(PROMPT, SamplingParams(max_new_tokens=6, grammar=grammar)),
        # the regex wants letters after the "1", allowed_token_ids only digits: it fails there
        "fails": engine.add_request(
            PROMPT,
            SamplingParams(
                max_new_tokens=12,
                grammar=Grammar.regex("1[a-z]+"),
                allowed_token_ids=_digit_ids(engine),
            ),
        ),
        "plain": engine.add_request(PROMPT, SamplingParams(max_new_tokens=6)),
    }
    constrained = {ids["finishes"], ids["cancelled"], ids["fails"]}
    assert set(engine._live.constrained) == constrained
    engine.step()
    engine.cancel(ids["cancelled"])
    constrained.discard(ids["cancelled"])
    assert set(engine._live.constrained) == constrained
    reasons: dict[object, str | None] = {}
    while engine.has_unfinished():
        for event in engine.step():
            if event.completion is not None:
                reasons[event.request_id] = event.completion.finish_reason
                constrained.discard(event.request_id)
        assert set(engine._live.constrained) == constrained
    assert reasons[ids["fails"]] == "error"
    assert set(reasons) == {ids["finishes"], ids["fails"], ids["plain"]}
    assert not engine._live.constrained and engine._live.num_constrained == 0
    assert_all_back(engine)


def test_a_preempted_constrained_request_stays_constrained(tiny_llama_dir: Path) -> None:
    """Preemption sends a sequence back to the queue, not out of the engine: its grammar is
    still checked (and still masks its tokens) when it resumes, and it leaves the constrained
    requests only at its final event. The outputs are those of a pool with room for all."""
    params = SamplingParams(max_new_tokens=24, grammar=Grammar.regex("[a-z]{20,30}"))
    prompts = [f"{PROMPT} Number {i}, please, and a long answer." for i in range(6)]
    tight = Engine.from_model_dir(
        tiny_llama_dir, device="cpu", kv_cache_mib=0.06, admission="preemptive"
    )
    ids = {tight.add_request(p, params, stream_text=False): i for i, p in enumerate(prompts)}
    got: dict[int, list[int]] = {}
    while tight.has_unfinished():
        for event in tight.step():
            if event.completion is not None:
                got[ids[event.request_id]] = event.completion.output_ids
        assert set(tight._live.constrained) == {r for r, i in ids.items() if i not in got}
    assert tight.stats.preemptions > 0
    assert not tight._live.constrained
    assert_all_back(tight)
    roomy = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=64)
    want = [c.output_ids for c in roomy.generate(prompts, params)]
    assert [got[i] for i in range(len(prompts))] == want
