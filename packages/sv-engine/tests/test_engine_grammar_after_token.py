"""`SamplingParams.grammar_after_token`: the grammar binds only the tokens after the first one of
an id (a reasoning model's `</think>`), on the tiny 16-token model, in FP32.

Oracles: the tokens up to and including that id are the very tokens of the same seeded request
without a grammar (nothing was masked: the grammar forbids some of them), and the text after it
`re.fullmatch`es the regex; speculation gives the plain engine's tokens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from speculation_testing import assert_all_back, completions, engine_like, pattern
from sv_engine import Completion, Engine, EngineError, SamplingParams
from sv_engine.grammar import Grammar
from sv_scheduler import SpeculationConfig

# The tiny model's tokens are the bytes ! " # ... / 0 (ids 0..15; 2, "#", is its EOS).
REGEX = r"([$%&'()]{2,4}[*+,-]){2,4}0"
# The token the grammar waits for, as a reasoning model's </think>: "&", which this model's
# greedy output often repeats (so drafts run through it).
AFTER = 5
GRAMMAR = Grammar.regex(REGEX)


@pytest.fixture(scope="module")
def base(tiny_vocab_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_vocab_dir, device="cpu", kv_cache_mib=1, max_num_seqs=64)


def prompts(n: int) -> list[list[int]]:
    return [pattern(seed, 12) for seed in range(n)]


def sampled(seed: int, grammar: Grammar | None = None) -> SamplingParams:
    """A seeded request, with `grammar` after AFTER if given. AFTER comes up now and then; the
    EOS never (a stop before AFTER would end the request before the grammar starts)."""
    return SamplingParams(
        max_new_tokens=48,
        temperature=1.0,
        seed=seed,
        logit_bias={AFTER: 1.5, 2: -100.0},
        grammar=grammar,
        grammar_after_token=AFTER if grammar is not None else None,
    )


def split(engine: Engine, completion: Completion) -> tuple[list[int], str]:
    """(the tokens up to and including the first AFTER, the text after it)."""
    ids = completion.output_ids
    at = ids.index(AFTER) + 1
    return ids[:at], engine.tokenizer.decode(ids[at:]).removesuffix("#")


@pytest.mark.parametrize("overlap", [True, False])
def test_the_grammar_binds_only_the_tokens_after_the_token(base: Engine, overlap: bool) -> None:
    engine = engine_like(base, None, overlap=overlap)
    n = 12
    free = completions(engine, prompts(n), [sampled(s) for s in range(n)])
    bound = completions(
        engine,
        prompts(n),
        [sampled(s, GRAMMAR) for s in range(n)],
    )
    ended = 0
    forbidden = 0
    for plain, got in zip(free, bound, strict=True):
        if AFTER not in got.output_ids:  # never reached: nothing was masked at all
            assert (got.output_ids, got.finish_reason) == (plain.output_ids, plain.finish_reason)
            continue
        before, after = split(engine, got)
        assert plain.output_ids[: len(before)] == before  # the same draws, unmasked
        # a token the grammar could never have begun with came before it
        forbidden += not re.fullmatch(r"[$%&'()]*", engine.tokenizer.decode(before[:-1]))
        if got.finish_reason == "stop":
            assert re.fullmatch(REGEX, after), after
            ended += 1
    assert ended >= 3 and forbidden >= 3  # the seeds cover what the test is about
    assert_all_back(engine)


OPENER = 14  # "/": the token that opens the wait, as a reasoning model's <think>


def test_with_an_opener_the_grammar_waits_only_if_the_answer_opens_with_it(base: Engine) -> None:
    """The first token is the opener or one the grammar allows; after the opener the thinking
    is free (a token the grammar forbids is in it) up to AFTER, and the rest matches; any
    other first token starts the grammar at once: the whole text matches."""
    engine = engine_like(base, None)
    n = 16
    params = [
        SamplingParams(
            max_new_tokens=48,
            temperature=1.0,
            seed=s,
            logit_bias={OPENER: 3.0, AFTER: 1.5, 2: -100.0},
            grammar=GRAMMAR,
            grammar_after_token=AFTER,
            grammar_wait_opener=OPENER,
        )
        for s in range(n)
    ]
    opened = bound = 0
    for c in completions(engine, prompts(n), params):
        first = engine.tokenizer.decode(c.output_ids[:1])
        assert first == "/" or re.fullmatch(r"[$%&'()]", first), c.output_ids
        if c.finish_reason != "stop":
            continue
        if first != "/":
            assert re.fullmatch(REGEX, c.text.removesuffix("#")), c.text
            bound += 1
            continue
        thinking, after = split(engine, c)
        assert re.fullmatch(REGEX, after), after
        opened += not re.fullmatch(r"[$%&'()]*", engine.tokenizer.decode(thinking[1:-1]))
    assert opened >= 2 and bound >= 2  # the seeds cover both ways
    assert_all_back(engine)


def test_a_budget_spent_before_the_token_ends_with_length(base: Engine) -> None:
    engine = engine_like(base, None)
    never = {AFTER: -100.0, 2: -100.0}
    params = SamplingParams(
        max_new_tokens=20,
        temperature=1.0,
        seed=5,
        logit_bias=never,
        grammar=GRAMMAR,
        grammar_after_token=AFTER,
    )
    plain = SamplingParams(max_new_tokens=20, temperature=1.0, seed=5, logit_bias=never)
    got, free = completions(engine, prompts(2)[:1] * 2, [params, plain])
    assert (got.output_ids, got.finish_reason) == (free.output_ids, "length")
    assert_all_back(engine)


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_speculation_gives_the_plain_output(base: Engine, k: int) -> None:
    """Drafts stop before the token (the choice after it needs the grammar's first mask, which
    a draft run through it would not get): still the plain engine's tokens."""
    plain_engine = engine_like(base, None)
    ps = []
    for seed in range(8):  # prompts that hold the model's own greedy continuation: long drafts
        p = pattern(seed, 30)
        greedy = completions(plain_engine, [p], [SamplingParams(max_new_tokens=12)])
        ps += [p + greedy[0].output_ids + p, p + greedy[0].output_ids]
    params = [SamplingParams(max_new_tokens=30, grammar=GRAMMAR, grammar_after_token=AFTER)]
    params *= len(ps)
    plain = completions(plain_engine, ps, params)
    spec = engine_like(base, SpeculationConfig(max_draft=k))
    got = completions(spec, ps, params)
    assert [(c.output_ids, c.finish_reason) for c in got] == [
        (c.output_ids, c.finish_reason) for c in plain
    ]
    assert sum(AFTER in c.output_ids for c in plain) >= 8
    assert spec.stats.accepted_tokens > 0
    assert_all_back(spec)


def test_draft_prefix_stops_before_the_token_while_waiting(base: Engine) -> None:
    matcher = base.grammars.matcher(GRAMMAR, after_token=AFTER)
    assert matcher.waiting
    assert matcher.draft_prefix([0, 1, 14], base.stop_ids) == 3  # anything: nothing is masked
    assert matcher.draft_prefix([0, AFTER, 3, 4], base.stop_ids) == 1
    matcher.accept(0)
    assert matcher.waiting
    matcher.accept(AFTER)
    assert not matcher.waiting
    assert matcher.draft_prefix([0], base.stop_ids) == 0  # "!": the grammar's now
    opening = base.grammars.matcher(GRAMMAR, after_token=AFTER, wait_opener=OPENER)
    assert not opening.waiting and opening.also_allowed == OPENER
    opening.accept(OPENER)
    assert opening.waiting and opening.also_allowed is None


def test_a_cancelled_waiting_request_leaves_nothing_behind(base: Engine) -> None:
    engine = engine_like(base, None)
    params = sampled(1, GRAMMAR)
    stream = engine.stream([prompts(1)[0]], params)
    next(stream)
    stream.close()
    assert_all_back(engine)
    assert engine._live.num_constrained == 0  # no grammar row is left to mask
    # and the engine constrains afresh afterwards
    again = completions(engine, prompts(1), [params])
    fresh = completions(engine_like(base, None), prompts(1), [params])
    assert again[0].output_ids == fresh[0].output_ids


def test_the_wait_is_checked() -> None:
    with pytest.raises(EngineError, match="grammar_after_token needs a grammar"):
        SamplingParams(grammar_after_token=3)
    with pytest.raises(EngineError, match="grammar_after_token must be a token id"):
        SamplingParams(grammar=GRAMMAR, grammar_after_token=-1)
    with pytest.raises(EngineError, match="grammar_wait_opener needs a grammar_after_token"):
        SamplingParams(grammar=GRAMMAR, grammar_wait_opener=3)
    with pytest.raises(EngineError, match="grammar_wait_opener must be a token id"):
        SamplingParams(grammar=GRAMMAR, grammar_after_token=3, grammar_wait_opener=True)


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"grammar_after_token": 16}, "grammar_after_token"),
        ({"grammar_after_token": 3, "grammar_wait_opener": 99}, "grammar_wait_opener"),
    ],
)
def test_a_token_outside_the_vocabulary_is_refused(
    base: Engine, fields: dict[str, int], name: str
) -> None:
    params = SamplingParams(grammar=GRAMMAR, **fields)
    with pytest.raises(EngineError, match=rf"{name} has token id \d+, outside"):
        base.add_request([3, 4, 5], params)
