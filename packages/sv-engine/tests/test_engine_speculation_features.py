"""Speculative decoding with the OpenAI request features on: logit controls (penalties,
logit_bias, min_tokens, min_p), log-probabilities and grammars, on the CPU in FP32.

The oracle is the plain engine, which never speculates: a verify step's choice at a draft
position must be the one plain decoding makes once the drafts before it are generated, so the
greedy outputs, finish reasons and log-probabilities (within FP32 noise of the two attention
paths) must be the plain engine's. Every page and credit is back at the end. The speculating
engines must also really accept drafts here, or the comparison proves nothing.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speculation_testing import (
    VOCAB,
    assert_all_back,
    assert_follows,
    completions,
    engine_like,
    outputs,
    pattern,
)
from sv_engine import Completion, Engine, SamplingParams, TokenLogprob
from sv_engine.grammar import Grammar
from sv_model import StepInputs
from sv_scheduler import SpeculationConfig


@pytest.fixture(scope="module")
def base(tiny_vocab_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_vocab_dir, device="cpu", kv_cache_mib=1, max_num_seqs=256)


def assert_same_logprobs(
    spec: Sequence[TokenLogprob | None] | None, plain: Sequence[TokenLogprob | None] | None
) -> None:
    """Equal within 1e-5 (relative, for the real model's larger values; the two attention
    paths sum in different orders), with the same top ids."""
    assert (spec is None) == (plain is None)
    for a, b in zip(spec or [], plain or [], strict=True):
        assert (a is None) == (b is None)
        if a is None or b is None:
            continue
        assert a.token_id == b.token_id
        assert a.logprob == pytest.approx(b.logprob, rel=1e-5, abs=1e-5)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], rel=1e-5, abs=1e-5)


def assert_same(spec: list[Completion], plain: list[Completion]) -> None:
    """Same tokens and finish reasons, and the same log-probabilities."""
    for s, p in zip(spec, plain, strict=True):
        assert (s.output_ids, s.finish_reason) == (p.output_ids, p.finish_reason)
        if s.logprobs is not None:
            assert len(s.logprobs) == len(s.output_ids)
        assert_same_logprobs(s.logprobs, p.logprobs)
        assert_same_logprobs(s.prompt_logprobs, p.prompt_logprobs)


CONTROLS = st.fixed_dictionaries(
    {
        "presence_penalty": st.sampled_from([0.0, 0.3, -0.5, 1.5]),
        "frequency_penalty": st.sampled_from([0.0, 0.2, 0.7]),
        "repetition_penalty": st.sampled_from([1.0, 1.1, 1.6]),
        "logit_bias": st.dictionaries(
            st.integers(0, VOCAB - 1), st.sampled_from([-100.0, -2.0, 1.5, 4.0]), max_size=2
        ),
        "min_tokens": st.integers(0, 12),
        "logprobs": st.sampled_from([None, 0, 3, 16]),
    }
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seeds=st.lists(st.integers(0, 10**6), min_size=1, max_size=3),
    lengths=st.lists(st.integers(4, 40), min_size=3, max_size=3),
    max_new=st.lists(st.integers(1, 40), min_size=3, max_size=3),
    controls=st.lists(CONTROLS, min_size=3, max_size=3),
    plain_row=st.booleans(),
    extra_stop=st.sets(st.integers(3, VOCAB - 1), max_size=1),
    k=st.integers(1, 6),
    admission=st.sampled_from(["conservative", "preemptive"]),
    max_step_tokens=st.sampled_from([8, 8192]),
    overlap=st.booleans(),
)
def test_greedy_speculation_with_controls_and_logprobs_gives_the_plain_output(
    base: Engine,
    seeds: list[int],
    lengths: list[int],
    max_new: list[int],
    controls: list[dict[str, Any]],
    plain_row: bool,
    extra_stop: set[int],
    k: int,
    admission: str,
    max_step_tokens: int,
    overlap: bool,
) -> None:
    prompts = [pattern(s, lengths[i]) for i, s in enumerate(seeds)]
    params = [
        SamplingParams(
            max_new_tokens=max_new[i],
            stop_token_ids=frozenset(extra_stop),
            **(
                {}
                if plain_row and i == 0
                else controls[i] | {"min_tokens": min(controls[i]["min_tokens"], max_new[i])}
            ),
        )
        for i in range(len(prompts))
    ]
    config = {
        "admission": admission,
        "num_pages": 40,
        "max_step_tokens": max_step_tokens,
        "max_num_seqs": 4,
    }
    plain = engine_like(base, None, overlap=False, **config)
    spec = engine_like(base, SpeculationConfig(max_draft=k), overlap=overlap, **config)
    assert_same(completions(spec, prompts, params), completions(plain, prompts, params))
    assert_all_back(spec)


REPEAT = pattern(7, 40)


def run_with_steps(engine: Engine, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    """One request; the tokens of each step() call that gave it any."""
    rid = engine.add_request(prompt, params, stream_text=False)
    steps = []
    while engine.has_unfinished():
        steps.append([e.token_id for e in engine.step() if e.request_id == rid])
    return [[t for t in s if t is not None] for s in steps if s]


@pytest.mark.parametrize(
    ("controls", "acts"),
    [
        ({"presence_penalty": 0.3}, True),
        ({"frequency_penalty": 0.05}, True),
        ({"repetition_penalty": 1.3}, False),  # this prompt's cycle is unchanged by it
        ({"logit_bias": {5: 2.0, 9: -100.0}}, True),
        ({"logprobs": 4, "presence_penalty": -0.4}, True),
    ],
)
def test_drafts_are_accepted_with_controls_on(
    base: Engine, controls: dict[str, Any], acts: bool
) -> None:
    """Drafts are really accepted with each feature on, the tokens are the plain ones, and
    (where `acts`) the feature really changed them."""
    params = SamplingParams(max_new_tokens=48, ignore_eos=True, **controls)
    prompt = pattern(5, 40)  # its greedy output changes cycles under a penalty
    plain = completions(engine_like(base, None), [prompt], [params])
    engine = engine_like(base, SpeculationConfig())
    steps = run_with_steps(engine, prompt, params)
    assert [t for s in steps for t in s] == plain[0].output_ids
    assert engine.stats.accepted_tokens >= 3
    uncontrolled = outputs(
        engine_like(base, None), [prompt], [SamplingParams(max_new_tokens=48, ignore_eos=True)]
    )
    assert (uncontrolled[0][0] != plain[0].output_ids) == acts
    assert_all_back(engine)


def test_prompt_logprobs_and_logprobs_with_speculation(base: Engine) -> None:
    """Echo (the prompt's own log-probabilities) and the output's, beside drafts."""
    prompts = [pattern(s, 30) for s in (5, 7)]
    params = [
        SamplingParams(max_new_tokens=40, ignore_eos=True, logprobs=3, prompt_logprobs=2),
        SamplingParams(max_new_tokens=40, ignore_eos=True, prompt_logprobs=0),
    ]
    plain = completions(engine_like(base, None), prompts, params)
    engine = engine_like(base, SpeculationConfig(), max_step_tokens=16, max_num_seqs=4)
    got = completions(engine, prompts, params)
    assert_same(got, plain)
    assert all(c.prompt_logprobs is not None for c in got)
    assert engine.stats.accepted_tokens >= 10
    assert_all_back(engine)


def test_min_tokens_and_a_stop_inside_an_accepted_run(base: Engine) -> None:
    """A stop token banned by min_tokens at the first draft positions and allowed at later
    ones: the plain engine's first allowed stop ends the speculating request too, also when it
    comes in the middle of an accepted run (some of these cases do: asserted)."""
    prompt = pattern(5, 40)  # under a presence penalty its output cycles, drafts accepted
    free = SamplingParams(max_new_tokens=48, ignore_eos=True, presence_penalty=0.3)
    steps = run_with_steps(engine_like(base, SpeculationConfig()), prompt, free)
    tokens = [t for s in steps for t in s]
    stop_mid_run = 0
    for start in range(0, 40, 6):
        for stop in list(dict.fromkeys(tokens[start:]))[:2]:
            params = SamplingParams(
                max_new_tokens=48,
                ignore_eos=True,
                stop_token_ids=frozenset({stop}),
                min_tokens=start,
                presence_penalty=0.3,
                logprobs=2,
            )
            plain = completions(engine_like(base, None), [prompt], [params])
            engine = engine_like(base, SpeculationConfig())
            assert_same(completions(engine, [prompt], [params]), plain)
            assert len(plain[0].output_ids) > start
            assert_all_back(engine)
            last = run_with_steps(engine_like(base, SpeculationConfig()), prompt, params)[-1]
            stop_mid_run += plain[0].finish_reason == "stop" and len(last) >= 2
    assert stop_mid_run >= 2


# --- grammars ----------------------------------------------------------------------------------

# The tiny model's 16 tokens are the bytes ! " # $ % & ' ( ) * + , - . / 0 (2, "#", is its EOS):
# a grammar over them that cuts some drafts and lets others through.
TINY_REGEX = r"([$%&'()]{2,4}[*+,-]){4,8}0"


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seeds=st.lists(st.integers(0, 10**6), min_size=1, max_size=3),
    length=st.integers(4, 40),
    k=st.integers(1, 6),
    penalty=st.sampled_from([0.0, 0.3]),
    logprobs=st.sampled_from([None, 3]),
    overlap=st.booleans(),
)
def test_greedy_speculation_under_a_grammar_gives_the_plain_output(
    base: Engine,
    seeds: list[int],
    length: int,
    k: int,
    penalty: float,
    logprobs: int | None,
    overlap: bool,
) -> None:
    prompts = [pattern(s, length) + [3, 5, 7, 4, 6, 8] * 3 for s in seeds]
    params = [
        SamplingParams(
            max_new_tokens=40,
            grammar=Grammar.regex(TINY_REGEX),
            presence_penalty=penalty,
            logprobs=logprobs,
        )
    ] * len(prompts)
    plain = completions(engine_like(base, None), prompts, params)
    spec = engine_like(base, SpeculationConfig(max_draft=k), overlap=overlap)
    assert_same(completions(spec, prompts, params), plain)
    for c in plain:
        if c.finish_reason == "stop":
            assert re.fullmatch(TINY_REGEX, c.text), c.text
    assert_all_back(spec)


def test_grammar_drafts_are_verified_and_accepted(base: Engine) -> None:
    prompt = pattern(3, 10) + [3, 5, 7, 4, 6, 8] * 4
    params = SamplingParams(max_new_tokens=40, grammar=Grammar.regex(TINY_REGEX))
    plain = completions(engine_like(base, None), [prompt], [params])
    engine = engine_like(base, SpeculationConfig())
    assert_same(completions(engine, [prompt], [params]), plain)
    assert engine.stats.accepted_tokens >= 4
    assert re.fullmatch(TINY_REGEX, plain[0].text)
    assert_all_back(engine)


def streamed(engine: Engine, prompt: list[int], params: SamplingParams) -> tuple[str, Completion]:
    """One request's streamed text, and its completion."""
    request_id = engine.add_request(prompt, params)
    events = []
    while engine.has_unfinished():
        events += [e for e in engine.step() if e.request_id == request_id]
    done = events[-1].completion
    assert done is not None
    return "".join(e.text for e in events), done


@pytest.mark.parametrize("prompt_seed", [0, 2, 6])
def test_a_grammar_failing_at_the_end_of_an_accepted_run_streams_the_run(
    base: Engine, prompt_seed: int
) -> None:
    """A regex of exactly 8 characters, and allowed_token_ids without the stop tokens: after
    the 8th the mask and the allowed ids leave nothing, and the request fails there. When the
    8th comes in a verify step's accepted run, followed by the refused choice, its text (and
    that of every token of the run before) is streamed, as in plain decoding: the matcher's
    failure on the last token of the run does not hide the tokens it had accepted."""
    params = SamplingParams(
        max_new_tokens=20,
        ignore_eos=True,
        grammar=Grammar.regex("[#-/]{8}"),
        allowed_token_ids=frozenset(range(3, 15)),
    )
    prompt = pattern(prompt_seed, 30)
    plain_text, plain = streamed(engine_like(base, None), prompt, params)
    assert plain.finish_reason == "error" and len(plain.text) == 8 and plain_text == plain.text
    engine = engine_like(base, SpeculationConfig(max_draft=3))
    text, done = streamed(engine, prompt, params)
    assert engine.stats.accepted_tokens > 0
    assert (done.output_ids, done.finish_reason, done.text) == (
        plain.output_ids,
        plain.finish_reason,
        plain.text,
    )
    assert text == done.text
    assert_all_back(engine)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
    },
    "required": ["name", "city", "tags"],
    "additionalProperties": False,
}
RECORD = {"name": "Ada Lovelace", "city": "London", "tags": ["mathematics", "engines", "notes"]}


def test_json_schema_output_of_real_text_is_the_plain_one(default_model: Path) -> None:
    """The default model copying a JSON record under its schema: drafts from the prompt are
    accepted, and the output is the plain engine's and validates."""
    engine = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16)
    prompt = engine.encode_prompt(
        "Copy this JSON object exactly, with no other text:\n"
        + json.dumps(RECORD, separators=(",", ":"))
    )
    params = [SamplingParams(max_new_tokens=48, grammar=Grammar.json_schema(SCHEMA), logprobs=2)]
    plain = completions(engine, [prompt], params)
    spec = engine_like(engine, SpeculationConfig())
    assert_same(completions(spec, [prompt], params), plain)
    assert spec.stats.accepted_tokens >= 10
    for c in plain:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), SCHEMA)
    assert_all_back(spec)


def test_draft_prefix_stops_at_the_grammar_and_at_stop_tokens(default_model: Path) -> None:
    engine = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=4)
    matcher = engine.grammars.matcher(Grammar.json_schema({"type": "object"}))
    tokens = engine.tokenizer.encode('{"a":1}')  # '{"', 'a', '":', '1', '}'
    assert len(tokens) == 5
    stop = min(engine.stop_ids)
    bad = engine.tokenizer.encode("x")
    assert matcher.draft_prefix(tokens, engine.stop_ids) == len(tokens)
    assert matcher.draft_prefix(tokens[:3] + bad + tokens[3:], engine.stop_ids) == 3
    assert matcher.draft_prefix([*tokens, stop, *tokens], engine.stop_ids) == len(tokens)
    assert matcher.draft_prefix(bad, engine.stop_ids) == 0
    # The matcher itself did not move: the whole object is still allowed from the start.
    assert matcher.draft_prefix(tokens, engine.stop_ids) == len(tokens)


# --- sampling ----------------------------------------------------------------------------------


def test_seeded_sampling_with_controls_gives_the_plain_tokens(base: Engine) -> None:
    prompts = [pattern(s, 24) for s in range(10)]
    params = [
        SamplingParams(
            max_new_tokens=30,
            temperature=0.3,
            seed=s,
            frequency_penalty=0.2 * (s % 3),
            repetition_penalty=1.0 + 0.1 * (s % 2),
            min_p=0.05 * (s % 2),
            min_tokens=s,
            logprobs=2 if s % 4 == 0 else None,
        )
        for s in range(10)
    ]
    # Short drafts from single-token matches, retried often: the tiny model accepts some.
    spec = engine_like(base, SpeculationConfig(max_draft=4, min_ngram=1, miss_limit=2))
    got = completions(spec, prompts, params)
    assert [c.output_ids for c in got] == [
        c.output_ids for c in completions(engine_like(base, None), prompts, params)
    ]
    assert spec.stats.accepted_tokens > 0
    assert_all_back(spec)


def test_speculative_sampling_with_penalties_follows_the_penalized_distribution(
    base: Engine,
) -> None:
    """3-token outputs under 600 seeds with frequency and presence penalties, against the
    probabilities of OpenAI's formula applied by hand to teacher-forced FP32 logits (logit -
    frequency * count - presence * (count > 0), over the tokens generated before), by a
    chi-square test. The drafts are accepted and rejected often (asserted)."""
    temperature, length, draws = 0.15, 3, 600
    frequency, presence = 0.4, 0.3
    start = pattern(5, 20)
    greedy = outputs(engine_like(base, None), [start], [SamplingParams(max_new_tokens=12)])
    prompt = start + greedy[0][0]
    engine = engine_like(base, SpeculationConfig(max_draft=2, max_batch=None))  # 600 at once
    params = [
        SamplingParams(
            max_new_tokens=length,
            temperature=temperature,
            ignore_eos=True,
            seed=s,
            frequency_penalty=frequency,
            presence_penalty=presence,
        )
        for s in range(draws)
    ]
    seen = Counter(tuple(out) for out, _ in outputs(engine, [prompt] * draws, params))
    s = engine.stats
    assert s.accepted_tokens >= 30 and s.drafted_tokens - s.accepted_tokens >= 30
    assert_all_back(engine)

    runner = base.runner
    n = len(prompt) + 2
    pages = -(-n // runner.page_size)
    prefixes = sorted({seq[:2] for seq in seen})
    logits: dict[tuple[int, ...], torch.Tensor] = {}
    for first in range(0, len(prefixes), runner.num_pages // pages):
        batch = prefixes[first : first + runner.num_pages // pages]
        runner.set_block_tables(
            [(r, list(range(r * pages, (r + 1) * pages))) for r in range(len(batch))]
        )
        step = StepInputs(
            token_ids=[t for prefix in batch for t in prompt + list(prefix)],
            positions=list(range(n)) * len(batch),
            table_rows=list(range(len(batch))),
            query_lens=[n] * len(batch),
            seq_lens=[n] * len(batch),
            sample_rows=list(range(len(batch))),
        )
        rows = runner.logits(step, every_token=True).double().view(len(batch), n, -1)
        for prefix, row in zip(batch, rows, strict=True):
            logits[prefix] = row[len(prompt) - 1 :]

    def probability(seq: tuple[int, ...]) -> float:
        table = logits[seq[:2]]
        logp = 0.0
        for i, t in enumerate(seq):
            counts = torch.bincount(torch.tensor(seq[:i], dtype=torch.long), minlength=VOCAB)
            x = table[i] - frequency * counts - presence * (counts > 0).double()
            logp += float(torch.log_softmax(x / temperature, dim=-1)[t])
        return math.exp(logp)

    assert_follows(seen, probability, draws)
