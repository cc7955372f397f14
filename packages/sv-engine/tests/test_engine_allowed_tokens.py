"""vLLM's allowed_token_ids through the engine on the CPU: every token, greedy or sampled, is
one of the allowed; greedy picks the allowed token the raw logits rank first (read from the
request's own raw log-probabilities, which the mask does not touch). Other rows of a batch
are untouched (test_engine_logit_controls); the mask itself is checked against a hand loop
in sv-kernels' tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sv_engine import Engine, EngineError, SamplingParams, StreamEvent
from sv_engine.grammar import Grammar

PROMPTS = ["Write a haiku about the sea.", "What is 2 + 2?", "Name three colours, please."]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=64)


def _allowed_from_first_alternatives(engine: Engine) -> frozenset[int]:
    """Tokens the raw logits of PROMPTS[0]'s first position rank 4th, 8th and 13th: a set
    whose greedy pick is known (the 4th) and is not the unconstrained one."""
    plain = SamplingParams(max_new_tokens=1, logprobs=20, ignore_eos=True)
    logprobs = engine.generate([PROMPTS[0]], plain)[0].logprobs
    assert logprobs is not None
    top = [token for token, _ in logprobs[0].top]
    return frozenset({top[3], top[7], top[12]})


def test_greedy_takes_the_best_allowed_token_each_step(engine: Engine) -> None:
    allowed = _allowed_from_first_alternatives(engine)
    params = SamplingParams(max_new_tokens=12, logprobs=20, allowed_token_ids=allowed)
    c = engine.generate([PROMPTS[0]], params)[0]
    assert c.logprobs is not None
    assert len(c.output_ids) == 12  # no stop token is allowed: only the length stops it
    checked = 0
    for token, scored in zip(c.output_ids, c.logprobs, strict=True):
        assert token in allowed
        ranked = [t for t, _ in scored.top if t in allowed]
        if ranked:  # an allowed token among the raw top 20: the best of them is the pick
            assert token == ranked[0]
            checked += 1
    assert checked >= 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_token_is_allowed(engine: Engine, temperature: float) -> None:
    allowed = frozenset({11, 400, 1234, 5000, 90000})
    params = SamplingParams(
        max_new_tokens=10, temperature=temperature, seed=3, allowed_token_ids=list(allowed)
    )
    outputs = [c.output_ids for c in engine.generate(PROMPTS, params)]
    assert all(len(ids) == 10 and set(ids) <= allowed for ids in outputs)
    if temperature:  # sampling does visit several of them
        assert len(set().union(*outputs)) > 1


def test_one_allowed_token_is_all_there_is(engine: Engine) -> None:
    params = SamplingParams(max_new_tokens=6, temperature=1.0, allowed_token_ids={777})
    assert [c.output_ids for c in engine.generate(PROMPTS, params)] == [[777] * 6] * 3


@pytest.mark.parametrize("value", [[], [-1], ["5"], [True], 5, {5: 1.0}])
def test_bad_values_refused(value: object) -> None:
    with pytest.raises(EngineError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=value)  # type: ignore[arg-type]


def test_ids_outside_the_vocabulary_are_refused_at_add(engine: Engine) -> None:
    vocab_size = engine.runner.config.vocab_size
    with pytest.raises(EngineError, match=f"allowed_token_ids has token id {vocab_size}, outside"):
        engine.add_request(PROMPTS[0], SamplingParams(allowed_token_ids={5, vocab_size}))
    assert not engine.has_unfinished()


def test_stop_ids_outside_the_vocabulary_are_refused_at_add(engine: Engine) -> None:
    """A stop id no row of the logits has can never be sampled: the request ran to its length
    limit with no sign that its stop was ignored. Refused as the other id fields are."""
    vocab_size = engine.runner.config.vocab_size
    with pytest.raises(EngineError, match=f"stop_token_ids has token id {vocab_size}, outside"):
        engine.add_request(PROMPTS[0], SamplingParams(stop_token_ids={5, vocab_size}))
    assert not engine.has_unfinished()
    last = engine.generate(PROMPTS[:1], SamplingParams(stop_token_ids={vocab_size - 1}))
    assert last[0].finish_reason in ("stop", "length")  # the vocabulary's last id is one


def _digit_ids(engine: Engine) -> frozenset[int]:
    ids = [engine.tokenizer.encode(str(d)) for d in range(10)]
    assert all(len(i) == 1 for i in ids)
    return frozenset(i[0] for i in ids)


def test_ids_the_grammar_never_allows_first_are_refused_at_add(engine: Engine) -> None:
    """Sampling bans every id outside allowed_token_ids and the grammar's mask bans every id
    it does not allow: with no id in both, every logit is banned. Refused at once, naming the
    field, where the row was sampled from nothing (as token 0) and failed the grammar."""
    params = SamplingParams(
        max_new_tokens=8, grammar=Grammar.regex("[a-z]{2,6}"), allowed_token_ids=_digit_ids(engine)
    )
    with pytest.raises(EngineError, match="allowed_token_ids has no token the regex allows first"):
        engine.add_request(PROMPTS[0], params)
    assert not engine.has_unfinished()
    assert engine.stats.free_pages == engine.stats.pool_pages


def test_a_grammar_that_leaves_no_allowed_id_fails_the_request_there(engine: Engine) -> None:
    """The regex takes a digit and then letters only; allowed_token_ids holds digits only.
    After the "1" nothing is allowed by both: the request fails there, with an error naming
    allowed_token_ids. Before, the row was sampled from nothing (token 0, "!") and the failed
    matcher's stop tokens were banned as well, so it went on giving "!" until max_new_tokens."""
    params = SamplingParams(
        max_new_tokens=12, grammar=Grammar.regex("1[a-z]+"), allowed_token_ids=_digit_ids(engine)
    )
    request_id = engine.add_request(PROMPTS[0], params)
    events = []
    while engine.has_unfinished():
        events += [e for e in engine.step() if e.request_id == request_id]
    _assert_failed_at_the_second_token(engine, events)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("max_new_tokens", [2, 3])
def test_a_failure_at_the_length_limit_is_the_same_failure(
    engine: Engine, overlap: bool, max_new_tokens: int
) -> None:
    """The request above fails at its second token; with a budget of 2 or 3 tokens it must
    fail there the same way, as with 12 (its last token, or the step after it, is where the
    length limit falls): not end as "length" with the refused token's text, or, with overlap,
    with one more token sampled from nothing."""
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        grammar=Grammar.regex("1[a-z]+"),
        allowed_token_ids=_digit_ids(engine),
    )
    engine.overlap = overlap
    try:
        request_id = engine.add_request(PROMPTS[0], params)
        events = []
        while engine.has_unfinished():
            events += [e for e in engine.step() if e.request_id == request_id]
    finally:
        engine.overlap = True
    _assert_failed_at_the_second_token(engine, events)


def test_a_failure_found_while_overlap_drains_ends_the_request_there(engine: Engine) -> None:
    """Overlap turned off with the step that samples the refused token in flight: the call
    that drains it must end the request at that token, as either loop alone does, not run
    one more step for it."""
    params = SamplingParams(
        max_new_tokens=12, grammar=Grammar.regex("1[a-z]+"), allowed_token_ids=_digit_ids(engine)
    )
    request_id = engine.add_request(PROMPTS[0], params)
    try:
        events = [e for e in engine.step() if e.request_id == request_id]
        engine.overlap = False
        while engine.has_unfinished():
            events += [e for e in engine.step() if e.request_id == request_id]
    finally:
        engine.overlap = True
    _assert_failed_at_the_second_token(engine, events)


def _assert_failed_at_the_second_token(engine: Engine, events: list[StreamEvent]) -> None:
    """The request of the tests above failed at its second token, whatever its budget or
    loop: an error naming allowed_token_ids, its text without the refused token, streamed
    and whole alike, every page back."""
    done = events[-1].completion
    assert done is not None
    assert done.finish_reason == "error"
    assert done.error is not None and "allowed_token_ids" in done.error
    assert done.text == "1" and len(done.output_ids) == 2
    assert "".join(e.text for e in events) == done.text
    assert engine.stats.free_pages == engine.stats.pool_pages
