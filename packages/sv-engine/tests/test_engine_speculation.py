"""Speculative decoding (prompt lookup) against the plain engine, on the CPU in FP32.

The oracle is the plain engine, which never speculates: with greedy decoding the speculating
engine must produce the same tokens and finish reasons, for any prompts, draft lengths, n-gram
sizes, admission policies, pool sizes, step budgets (chunked prefill) and with or without the
overlapped loop; every page and credit must be back at the end. Sampling is checked two ways:
the same seed gives the same tokens, and over many seeds the outputs follow the model's own
distribution (probabilities from teacher-forced logits, a chi-square test).

The model is a small random Llama with a 16-token vocabulary: its outputs fall into patterns
that its own prompt and output contain, so drafts are found and accepted for real.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from speculation_testing import (
    VOCAB,
    assert_all_back,
    assert_follows,
    engine_like,
    outputs,
    pattern,
)
from sv_engine import Engine, SamplingParams
from sv_model import StepInputs
from sv_scheduler import SpeculationConfig


@pytest.fixture(scope="module")
def base(tiny_vocab_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_vocab_dir, device="cpu", kv_cache_mib=1, max_num_seqs=256)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seeds=st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
    lengths=st.lists(st.integers(1, 40), min_size=4, max_size=4),
    max_new=st.lists(st.integers(1, 48), min_size=4, max_size=4),
    ignore_eos=st.booleans(),
    extra_stop=st.sets(st.integers(3, VOCAB - 1), max_size=1),
    k=st.integers(1, 6),
    n=st.integers(1, 4),
    admission=st.sampled_from(["conservative", "preemptive"]),
    num_pages=st.sampled_from([12, 40, 64]),
    max_step_tokens=st.sampled_from([8, 32, 8192]),
    overlap=st.booleans(),
    prefix_caching=st.booleans(),
)
def test_greedy_speculation_gives_the_plain_output(
    base: Engine,
    seeds: list[int],
    lengths: list[int],
    max_new: list[int],
    ignore_eos: bool,
    extra_stop: set[int],
    k: int,
    n: int,
    admission: str,
    num_pages: int,
    max_step_tokens: int,
    overlap: bool,
    prefix_caching: bool,
) -> None:
    # A prompt twice in a batch shares its prefix pages.
    prompts = [pattern(s, lengths[i]) for i, s in enumerate(seeds)] + [
        pattern(seeds[0], lengths[0])
    ]
    params = [
        SamplingParams(
            max_new_tokens=max_new[i % 4],
            ignore_eos=ignore_eos,
            stop_token_ids=frozenset(extra_stop),
        )
        for i in range(len(prompts))
    ]
    config = {
        "admission": admission,
        "num_pages": num_pages,
        "max_step_tokens": max_step_tokens,
        "max_num_seqs": 4,
        "prefix_caching": prefix_caching,
    }
    plain = engine_like(base, None, overlap=False, **config)
    spec = engine_like(base, SpeculationConfig(max_draft=k, ngram=n), overlap=overlap, **config)
    assert outputs(spec, prompts, params) == outputs(plain, prompts, params)
    assert_all_back(spec)
    s = spec.stats
    assert s.accepted_tokens <= s.drafted_tokens


def flat(steps: list[list[int]]) -> list[int]:
    return [token for step in steps for token in step]


def run_with_steps(engine: Engine, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    """One request; the tokens of each step() call, as lists."""
    rid = engine.add_request(prompt, params, stream_text=False)
    steps = []
    while engine.has_unfinished():
        steps.append([e.token_id for e in engine.step() if e.request_id == rid])
    return [s for s in steps if s]


REPEAT = pattern(7, 40)


def test_speculation_accepts_drafts_and_saves_steps(base: Engine) -> None:
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    plain = run_with_steps(engine_like(base, None), REPEAT, params)
    spec_engine = engine_like(base, SpeculationConfig())
    spec = run_with_steps(spec_engine, REPEAT, params)
    assert flat(spec) == flat(plain)
    s = spec_engine.stats
    assert s.accepted_tokens > 10 and len(spec) < len(plain) - 10
    assert_all_back(spec_engine)


def test_max_new_tokens_inside_an_accepted_run(base: Engine) -> None:
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    plain = flat(run_with_steps(engine_like(base, None), REPEAT, params))
    spec = run_with_steps(engine_like(base, SpeculationConfig()), REPEAT, params)
    # A step that kept 3 or more tokens: the limit falls on the middle one.
    at = next(i for i, toks in enumerate(spec) if len(toks) >= 3)
    end = sum(len(toks) for toks in spec[:at]) + 2
    params = SamplingParams(max_new_tokens=end, ignore_eos=True)
    engine = engine_like(base, SpeculationConfig())
    assert outputs(engine, [REPEAT], [params]) == [(plain[:end], "length")]
    assert_all_back(engine)
    steps = run_with_steps(engine_like(base, SpeculationConfig()), REPEAT, params)
    assert len(steps[-1]) == 2  # the last step kept its first token and one accepted


def test_stop_inside_an_accepted_run_of_real_text(default_model: Path) -> None:
    """The default model copying text: a stop token first seen in the middle of an accepted
    run ends the request there, as in plain decoding."""
    text = (
        "Repeat the following text exactly, word for word:\n\nThe quick brown fox jumps over "
        "the lazy dog. It was a sunny day in the park, and the children were playing football."
    )
    engine = Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=16)
    params = SamplingParams(max_new_tokens=24)
    prompt = engine.encode_prompt(text)
    plain = flat(run_with_steps(engine, prompt, params))
    spec_engine = engine_like(engine, SpeculationConfig())
    spec = run_with_steps(spec_engine, prompt, params)
    assert flat(spec) == plain
    starts = [sum(len(toks) for toks in spec[:i]) for i in range(len(spec))]
    stop_at = next(
        start + 1
        for start, toks in zip(starts, spec, strict=True)
        if len(toks) >= 3 and toks[1] not in plain[: start + 1]
    )
    stop = plain[stop_at]
    params = SamplingParams(max_new_tokens=24, stop_token_ids=frozenset({stop}))
    steps = run_with_steps(engine_like(engine, SpeculationConfig()), prompt, params)
    assert flat(steps) == plain[: stop_at + 1]
    assert len(steps[-1]) >= 2 and steps[-1][-1] == stop
    assert_all_back(engine)


def test_cancel_while_a_verify_step_is_in_flight(base: Engine) -> None:
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    other = pattern(11, 30)
    want_other = outputs(engine_like(base, None), [other], [params])
    engine = engine_like(base, SpeculationConfig())
    rid = engine.add_request(REPEAT, params, stream_text=False)
    oid = engine.add_request(other, params, stream_text=False)
    delivered: list[int] = []
    got_other: list[int] = []
    for _ in range(200):
        for e in engine.step():
            (delivered if e.request_id == rid else got_other).append(e.token_id)  # type: ignore[arg-type]
        flying = engine._in_flight
        if flying is not None and any(s.request_id == rid and s.draft for s in flying.plan.decodes):
            break
    else:
        pytest.fail("no verify step of the request was ever in flight")
    event = engine.cancel(rid)
    assert event is not None and event.completion is not None
    assert event.completion.output_ids == delivered
    assert event.completion.finish_reason == "cancelled"
    while engine.has_unfinished():
        for e in engine.step():
            assert e.request_id == oid
            got_other.append(e.token_id)  # type: ignore[arg-type]
    assert got_other == want_other[0][0]
    assert_all_back(engine)


def test_seeded_sampling_gives_the_plain_tokens(base: Engine) -> None:
    prompts = [pattern(s, 24) for s in range(12)]
    params = [
        SamplingParams(max_new_tokens=30, temperature=0.3, top_k=8 * (s % 2), seed=s)
        for s in range(12)
    ]
    spec = engine_like(base, SpeculationConfig())
    assert outputs(spec, prompts, params) == outputs(engine_like(base, None), prompts, params)
    assert spec.stats.accepted_tokens > 0
    assert_all_back(spec)


def test_speculative_sampling_follows_the_model_distribution(base: Engine) -> None:
    """Outputs of 3 tokens under 600 seeds against the probabilities the model gives those
    sequences (softmax of teacher-forced FP32 logits at temperature T), by a chi-square test.
    The prompt ends with the model's own greedy cycle, so the drafts the second decode verifies
    are accepted often and rejected often."""
    temperature, length, draws = 0.15, 3, 600
    start = pattern(5, 20)
    greedy = outputs(engine_like(base, None), [start], [SamplingParams(max_new_tokens=12)])
    prompt = start + greedy[0][0]
    engine = engine_like(base, SpeculationConfig(max_draft=2, max_batch=None))  # 600 at once
    params = [
        SamplingParams(max_new_tokens=length, temperature=temperature, ignore_eos=True, seed=s)
        for s in range(draws)
    ]
    seen = Counter(tuple(out) for out, _ in outputs(engine, [prompt] * draws, params))
    # Speculation really made the samples: drafts accepted (the token then comes from the
    # draft position's logits) and rejected (from p with the draft taken out).
    s = engine.stats
    assert s.accepted_tokens >= 30 and s.drafted_tokens - s.accepted_tokens >= 30
    assert_all_back(engine)

    # The oracle: one teacher-forced row per distinct (t1, t2) seen gives p(t1), p(t2 | t1)
    # and p(t3 | t1, t2) at once; rows packed a few at a time into the pool's pages.
    prefixes = sorted({seq[:2] for seq in seen})
    runner = base.runner
    pages_per_row = -(-(len(prompt) + 2) // runner.page_size)
    rows_per_step = runner.num_pages // pages_per_row
    logp: dict[tuple[int, ...], torch.Tensor] = {}
    for first in range(0, len(prefixes), rows_per_step):
        batch = prefixes[first : first + rows_per_step]
        runner.set_block_tables(
            [
                (r, list(range(r * pages_per_row, (r + 1) * pages_per_row)))
                for r in range(len(batch))
            ]
        )
        ids = [prompt + list(prefix) for prefix in batch]
        n = len(ids[0])
        step = StepInputs(
            token_ids=[t for row in ids for t in row],
            positions=list(range(n)) * len(batch),
            table_rows=list(range(len(batch))),
            query_lens=[n] * len(batch),
            seq_lens=[n] * len(batch),
            sample_rows=list(range(len(batch))),
        )
        logits = runner.logits(step, every_token=True).double().view(len(batch), n, -1)
        for prefix, row in zip(batch, logits, strict=True):
            logp[prefix] = torch.log_softmax(row[len(prompt) - 1 :] / temperature, dim=-1)

    def probability(seq: tuple[int, ...]) -> float:
        table = logp[seq[:2]]
        return math.exp(sum(float(table[i, t]) for i, t in enumerate(seq)))

    assert_follows(seen, probability, draws)
