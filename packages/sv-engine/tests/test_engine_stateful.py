"""Hypothesis stateful test of the whole engine on the CPU (FP32): arrivals while steps run,
cancels at any point, overlap turned on and off, failed steps, speculation, both admission
policies and static batching on tight pools, chunked prefill, prefix caching (and clearing
it), n > 1 choices, prompts at the context limit and one below it, and each request with a
random mix of seeded sampling, logit controls, log-probabilities and grammars (whose
allowed_token_ids may leave nothing, failing the request).

The oracle is each request run alone on a plain engine (no speculation, a pool that never
waits, the plain loop): a finished request's tokens, finish reason and log-probabilities must
be those, and a cancelled one's a prefix of them; a streamed text must add up to its
completion's. After every step the pool's pages add up; at the end every request has ended
(no deadlock, no starvation) and every page and credit is back."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from speculation_testing import VOCAB, engine_like, pattern
from sv_engine import Completion, Engine, EngineError, SamplingParams
from sv_engine.grammar import Grammar
from sv_scheduler import AdmissionError, RequestId, Scheduler, SpeculationConfig

Key = tuple[tuple[int, ...], str, int]  # prompt, repr of the params, max_model_len
Outcome = tuple[list[int], str, list[tuple[int, float]] | None, list[float | None] | None]

params_extras = st.fixed_dictionaries(
    {},
    optional={
        "logprobs": st.integers(0, 3),
        "prompt_logprobs": st.integers(0, 2),
        "repetition_penalty": st.sampled_from([1.3, 0.8]),
        "frequency_penalty": st.sampled_from([0.5, -0.5]),
        "presence_penalty": st.sampled_from([1.0]),
        "min_tokens": st.integers(1, 8),
        "logit_bias": st.dictionaries(
            st.integers(0, VOCAB - 1), st.sampled_from([-100.0, 3.0]), max_size=2
        ),
        "allowed_token_ids": st.frozensets(st.integers(0, VOCAB - 1), min_size=2, max_size=6),
        "seed_temperature": st.tuples(st.integers(0, 3), st.sampled_from([0.5, 1.0])),
        "grammar": st.sampled_from([Grammar.regex("[#-/]{2,9}"), Grammar.regex("(%&)+#?")]),
    },
)


class EngineMachine(RuleBasedStateMachine):
    base: Engine
    alone_cache: ClassVar[dict[Key, list[Outcome]]] = {}  # across examples: the same base

    @initialize(
        admission=st.sampled_from(["conservative", "preemptive"]),
        num_pages=st.integers(4, 24),
        max_num_seqs=st.integers(1, 5),
        extra_step_tokens=st.sampled_from([0, 3, 16, 8192]),
        prefix_caching=st.booleans(),
        speculate=st.sampled_from([None, 1, 3]),
        overlap=st.booleans(),
        max_model_len=st.sampled_from([40, 64, 200]),
        policy=st.sampled_from(["continuous", "continuous", "static"]),
    )
    def setup(
        self,
        admission: str,
        num_pages: int,
        max_num_seqs: int,
        extra_step_tokens: int,
        prefix_caching: bool,
        speculate: int | None,
        overlap: bool,
        max_model_len: int,
        policy: str,
    ) -> None:
        self.max_model_len = max_model_len
        spec = None if speculate is None else SpeculationConfig(max_draft=speculate)
        self.engine = engine_like(
            self.base,
            spec,
            overlap=overlap,
            admission=admission,
            num_pages=num_pages,
            max_num_seqs=max_num_seqs,
            max_step_tokens=max_num_seqs + extra_step_tokens,
            prefix_caching=prefix_caching,
            max_model_len=max_model_len,
            policy=policy,
        )
        self.requests: dict[RequestId, tuple[Key, SamplingParams, int]] = {}
        self.delivered: dict[RequestId, list[int]] = {}
        self.done: dict[RequestId, Outcome] = {}
        self.texts: dict[RequestId, list[str] | None] = {}
        self.abandoned: set[RequestId] = set()

    def alone(self, key: Key, params: SamplingParams) -> list[Outcome]:
        """The outcome of each choice of the prompt, run alone on a plain engine."""
        found = self.alone_cache.get(key)
        if found is None:
            prompt, _, max_model_len = key
            cfg = dataclasses.replace(
                self.base.scheduler.config,
                speculation=None,
                max_model_len=max_model_len,
                max_num_seqs=4,
                max_step_tokens=8192,
            )
            plain = Engine(
                self.base.tokenizer, self.base.runner, Scheduler(cfg), self.base.stop_ids
            )
            plain.overlap = False
            ids = plain.add_choices(list(prompt), params, stream_text=False)
            done: dict[RequestId, Completion] = {}
            while plain.has_unfinished():
                for e in plain.step():
                    if e.completion is not None:
                        done[e.request_id] = e.completion
            found = self.alone_cache[key] = [outcome(done[r]) for r in ids]
        return found

    @rule(
        seed=st.integers(0, 5),
        length=st.integers(1, 60),
        max_new=st.integers(1, 40),
        stop=st.sets(st.integers(3, VOCAB - 1), max_size=1),
        ignore_eos=st.booleans(),
        n=st.integers(1, 3),
        extras=params_extras,
        stream_text=st.booleans(),
    )
    def add(
        self,
        seed: int,
        length: int,
        max_new: int,
        stop: set[int],
        ignore_eos: bool,
        n: int,
        extras: dict[str, Any],
        stream_text: bool,
    ) -> None:
        prompt = pattern(seed, length)
        if len(prompt) > self.max_model_len:
            prompt = prompt[: self.max_model_len - 1]  # prompt at the limit minus one
        extras = dict(extras)
        if "seed_temperature" in extras:
            extras["seed"], extras["temperature"] = extras.pop("seed_temperature")
        try:
            params = SamplingParams(
                max_new_tokens=max_new,
                stop_token_ids=frozenset(stop),
                ignore_eos=ignore_eos,
                n=n,
                **extras,
            )
            ids = self.engine.add_choices(prompt, params, stream_text=stream_text)
        except (AdmissionError, EngineError):
            return  # too big for this pool, or a combination refused: nothing queued
        key: Key = (tuple(prompt), repr(params), self.max_model_len)
        for i, rid in enumerate(ids):
            self.requests[rid] = (key, params, i)
            self.delivered[rid] = []
            self.texts[rid] = [] if stream_text else None

    @rule()
    def failing_step(self) -> None:
        runner = self.engine.runner
        live = [r for r in self.requests if r not in self.done]

        def broken(*args: object) -> None:
            raise RuntimeError("device lost")

        runner.launch = broken  # type: ignore[method-assign,assignment]
        try:
            self.step(1)
        except RuntimeError:
            for rid in live:
                self.abandoned.add(rid)
                self.done[rid] = ([], "abandoned", None, None)
            assert not self.engine.has_unfinished()
        finally:
            del runner.launch

    @rule()
    def clear_prefix_cache(self) -> None:
        self.engine.clear_prefix_cache()

    @rule(seed=st.integers(0, 5))
    def add_at_the_limit(self, seed: int) -> None:
        prompt = pattern(seed, self.max_model_len)[: self.max_model_len]
        with pytest.raises((AdmissionError, EngineError)):
            self.engine.add_request(prompt, SamplingParams(max_new_tokens=1))

    @rule(steps=st.integers(1, 6))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            for e in self.engine.step():
                if e.token_id is not None:
                    self.delivered[e.request_id].append(e.token_id)
                text = self.texts[e.request_id]
                if text is not None:
                    text.append(e.text)
                if e.completion is not None:
                    c = e.completion
                    assert e.request_id not in self.done
                    self.done[e.request_id] = outcome(c)
                    if text is not None and c.finish_reason != "cancelled":
                        assert "".join(text) == c.text, (c.finish_reason, text, c.text)

    @precondition(lambda self: any(r not in self.done for r in self.requests))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        live = sorted(r for r in self.requests if r not in self.done)
        rid = data.draw(st.sampled_from(live))
        event = self.engine.cancel(rid)
        assert event is not None and event.completion is not None
        self.done[rid] = outcome(event.completion)

    @rule()
    def toggle_overlap(self) -> None:
        self.engine.overlap = not self.engine.overlap

    @invariant()
    def pages_add_up(self) -> None:
        if not hasattr(self, "engine"):
            return
        pool = self.engine.scheduler.pool
        assert pool.num_free + pool.num_cached + pool.num_assigned == pool.num_pages
        s = self.engine.stats
        if not self.engine.has_unfinished():
            assert s.free_pages == s.pool_pages and s.assigned_pages == 0
            assert s.free_credits == s.pool_pages

    def teardown(self) -> None:
        if not hasattr(self, "engine"):
            return
        guard = 0
        while self.engine.has_unfinished():
            self.step(1)
            guard += 1
            assert guard < 5000, "no progress: deadlock or starvation"
        s = self.engine.stats
        assert s.free_pages == s.pool_pages and s.assigned_pages == 0
        assert s.free_credits == s.pool_pages
        assert set(self.done) == set(self.requests)
        for rid, (key, params, choice) in self.requests.items():
            if rid in self.abandoned:
                continue
            out, reason, logprobs, prompt_logprobs = self.done[rid]
            want, want_reason, want_logprobs, want_prompt_logprobs = self.alone(key, params)[choice]
            assert out == self.delivered[rid], rid
            if reason == "cancelled":
                assert out == want[: len(out)], (rid, key)
                if logprobs is not None:
                    assert want_logprobs is not None
                    close(logprobs, want_logprobs[: len(logprobs)])
            else:
                assert (out, reason) == (want, want_reason), (rid, key)
                if logprobs is not None or want_logprobs is not None:
                    assert logprobs is not None and want_logprobs is not None
                    close(logprobs, want_logprobs)
            if prompt_logprobs is not None and want_prompt_logprobs is not None:
                if reason != "cancelled":
                    assert len(prompt_logprobs) == len(want_prompt_logprobs)
                for a, b in zip(prompt_logprobs, want_prompt_logprobs, strict=False):
                    assert (a is None) == (b is None)
                    assert a is None or b is None or abs(a - b) < 1e-4


def outcome(c: Completion) -> Outcome:
    return (
        c.output_ids,
        c.finish_reason,
        None if c.logprobs is None else [(t.token_id, t.logprob) for t in c.logprobs],
        None
        if c.prompt_logprobs is None
        else [None if t is None else t.logprob for t in c.prompt_logprobs],
    )


def close(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [t for t, _ in got] == [t for t, _ in want]
    assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(got, want, strict=True)), (got, want)


@pytest.fixture(scope="module")
def base(tiny_vocab_dir: Path) -> Engine:
    return Engine.from_model_dir(
        tiny_vocab_dir,
        device="cpu",
        kv_cache_mib=1,
        max_num_seqs=256,
    )


def test_engine_state_machine(base: Engine) -> None:
    EngineMachine.base = base
    run = EngineMachine.TestCase
    run.settings = settings(
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    run().runTest()
