"""End-to-end generation through the engine on the CPU, against transformers (the oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from sv_engine import Engine, EngineError, SamplingParams, StreamEvent
from sv_kernels import reference
from sv_scheduler import AdmissionError
from sv_tokenizer import LeadingSpace, Message, TokenizerError

PROMPTS = [
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Name three colours.",
    "Translate 'good morning' into French, please, and explain the phrase in detail.",
]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=64)


@pytest.fixture(scope="module")
def oracle(tiny_llama_dir: Path) -> transformers.LlamaForCausalLM:
    return transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def hf_greedy(model: transformers.LlamaForCausalLM, prompt_ids: list[int], n: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    return out[0, len(prompt_ids) :].tolist()  # type: ignore[no-any-return]


def assert_all_pages_free(engine: Engine) -> None:
    stats = engine.stats
    assert stats.free_pages == stats.pool_pages
    assert stats.assigned_pages == 0
    assert not engine.has_unfinished()


def test_batched_greedy_equals_transformers(
    engine: Engine, oracle: transformers.LlamaForCausalLM
) -> None:
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    completions = engine.generate(PROMPTS, params)
    assert [c.prompt_ids for c in completions] == [engine.encode_prompt(p) for p in PROMPTS]
    for c in completions:
        assert c.finish_reason == "length"
        assert c.output_ids == hf_greedy(oracle, c.prompt_ids, 12)
        assert c.text == engine.tokenizer.decode(c.output_ids)
    assert_all_pages_free(engine)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_policies_give_the_same_tokens_on_a_tight_pool(tiny_llama_dir: Path, policy: str) -> None:
    """A pool too small for every request at once forces admission waits; outputs do not
    depend on the policy or on who ran beside whom (FP32)."""
    tight = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=0.04, policy=policy)
    roomy = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=64)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    got = [c.output_ids for c in tight.generate(PROMPTS, params)]
    want = [c.output_ids for c in roomy.generate(PROMPTS, params)]
    assert got == want
    assert tight.stats.admission_waits > 0
    assert tight.stats.peak_running < len(PROMPTS)
    assert_all_pages_free(tight)


def test_stream_text_concatenates_to_completion(engine: Engine) -> None:
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    texts: dict[object, str] = {}
    final = {}
    for event in engine.stream(PROMPTS[:2], params):
        texts[event.request_id] = texts.get(event.request_id, "") + event.text
        if event.completion is not None:
            final[event.request_id] = event.completion
    assert len(final) == 2
    for rid, c in final.items():
        assert texts[rid] == c.text
        assert len(c.output_ids) == 16
    assert_all_pages_free(engine)


@pytest.mark.parametrize("stream_text", [True, False])
def test_a_continuation_keeps_the_leading_space_a_text_start_drops(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch, stream_text: bool
) -> None:
    """A SentencePiece tokenizer drops the space a text starts with; a raw completion
    continues its prompt's text, so it keeps it: its text is what decoding prompt and output
    together adds past the prompt. The tokenizer's flag alone decides, so it is turned on for
    a byte-level vocabulary whose " Paris" starts with a space."""
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=16)
    tokenizer = engine.tokenizer
    monkeypatch.setattr(tokenizer, "leading_space", LeadingSpace.ONE)
    prompt = tokenizer.encode("The capital of France is")
    paris = tokenizer.encode(" Paris")
    params = SamplingParams(max_new_tokens=2, ignore_eos=True, allowed_token_ids=frozenset(paris))
    for continuation in (False, True):
        engine.add_request(prompt, params, stream_text=stream_text, continuation=continuation)
        streamed, completion = "", None
        while completion is None:
            for event in engine.step():
                streamed += event.text
                completion = event.completion or completion
        assert completion.output_ids == paris * 2
        whole = tokenizer.decode(prompt + completion.output_ids)
        expected = whole[len(tokenizer.decode(prompt)) :] if continuation else "Paris Paris"
        assert whole == "The capital of France is Paris Paris"
        assert completion.text == expected == (" Paris Paris" if continuation else "Paris Paris")
        assert streamed == (expected if stream_text else "")
    assert_all_pages_free(engine)


def test_stop_token_ends_the_request(engine: Engine) -> None:
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    free_run = engine.generate([PROMPTS[0]], params)[0].output_ids
    stop = free_run[4]
    first = free_run.index(stop)
    old = engine.stop_ids
    engine.stop_ids = frozenset({stop})
    try:
        c = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=12))[0]
    finally:
        engine.stop_ids = old
    assert c.finish_reason == "stop"
    assert c.output_ids == free_run[: first + 1]
    assert c.text == engine.tokenizer.decode(free_run[:first])
    assert_all_pages_free(engine)


def test_closing_a_stream_cancels_and_frees_pages(engine: Engine) -> None:
    stream = engine.stream(PROMPTS, SamplingParams(max_new_tokens=50, ignore_eos=True))
    for _ in range(6):
        next(stream)
    assert engine.stats.assigned_pages > 0
    stream.close()
    assert_all_pages_free(engine)


def test_a_stream_dropped_unread_cancels_its_requests(engine: Engine) -> None:
    """stream() queues its prompts at once; an iterator dropped before its first event (an
    error between the call and the loop) cancels them as closing a started one does, rather
    than leaving them to run inside the caller's next generate."""
    cancelled = engine.stats.cancelled_requests
    events = engine.stream(PROMPTS, SamplingParams(max_new_tokens=50, ignore_eos=True))
    assert engine.scheduler.num_waiting == len(PROMPTS)
    del events
    assert engine.stats.cancelled_requests == cancelled + len(PROMPTS)
    assert_all_pages_free(engine)
    finished = engine.stats.finished_requests
    engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert engine.stats.finished_requests == finished + 1


def test_a_stream_ends_when_one_of_its_requests_is_cancelled_by_id(engine: Engine) -> None:
    """cancel(id) hands the request's final event to its caller, not to the stream that queued
    it: the stream still ends once its other request has, rather than stepping an idle engine
    forever waiting for that event."""
    steps = 0
    step = engine.step

    def counted_step() -> list[StreamEvent]:
        nonlocal steps
        steps += 1
        assert steps < 200, "the stream kept stepping an engine with nothing left to run"
        return step()

    engine.step = counted_step  # type: ignore[method-assign]
    try:
        stream = engine.stream(PROMPTS[:2], SamplingParams(max_new_tokens=8, ignore_eos=True))
        first = next(stream)
        cancelled = engine.cancel(first.request_id)
        assert cancelled is not None and cancelled.finished == "cancelled"
        rest = list(stream)
    finally:
        del engine.step
    assert len({e.request_id for e in rest} - {first.request_id}) == 1
    assert all(e.request_id != first.request_id for e in rest)
    assert [e.finished for e in rest if e.finished] == ["length"]
    assert_all_pages_free(engine)


def test_cancel_returns_a_cancelled_completion(engine: Engine) -> None:
    rid = engine.add_request(PROMPTS[1], SamplingParams(max_new_tokens=30, ignore_eos=True))
    for _ in range(3):
        engine.step()
    event = engine.cancel(rid)
    assert event is not None and event.completion is not None
    assert event.finished == "cancelled"
    assert len(event.completion.output_ids) == 3
    assert engine.cancel(rid) is None
    assert_all_pages_free(engine)


def test_seeded_sampling_draws_what_the_reference_sampler_draws(
    engine: Engine, oracle: transformers.LlamaForCausalLM
) -> None:
    """Each sampled token is the reference sampler's draw on transformers' logits for the
    sequence so far, with the request's seed and the token's output index as the step. Another
    seed draws other tokens, also one 2**32 apart (the sampler's state is 32 bits; the bits
    above are mixed in: `sampler_seed`)."""

    def run(seed: int) -> list[int]:
        p = SamplingParams(
            max_new_tokens=10, temperature=1.0, top_p=0.9, seed=seed, ignore_eos=True
        )
        return engine.generate([PROMPTS[0]], p)[0].output_ids

    prompt_ids = engine.encode_prompt(PROMPTS[0])
    got = run(1)
    with torch.no_grad():
        ids = torch.tensor([prompt_ids + got])
        logits = oracle(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    n = len(got)
    want = reference.sample(
        logits,
        torch.full((n,), 1.0),
        torch.zeros(n, dtype=torch.int32),
        torch.full((n,), 0.9),
        torch.full((n,), 1, dtype=torch.int64),
        torch.arange(n, dtype=torch.int64),
    )
    assert got == want.tolist()
    assert run(1) != run(2)
    assert run(2**32 + 1) != got
    assert run(2**70 + 1) == run(2**70 + 1)


def test_prefix_cache_serves_a_repeated_prompt(engine: Engine) -> None:
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    a = engine.generate([prompt], params)[0]
    b = engine.generate([prompt], params)[0]
    assert a.num_cached_tokens == 0
    assert b.num_cached_tokens >= 16 * ((len(b.prompt_ids) - 1) // 16)
    assert a.output_ids == b.output_ids


def test_bad_requests_are_refused_clearly(tiny_llama_dir: Path, engine: Engine) -> None:
    with pytest.raises(EngineError, match="empty"):
        engine.generate(["   "])
    with pytest.raises(EngineError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(EngineError, match="vocabulary"):
        engine.generate([[5, 10**7]])
    small = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=64, max_model_len=32)
    with pytest.raises(AdmissionError):
        small.generate([" ".join(["word"] * 64)])
    assert_all_pages_free(small)
    with pytest.raises(EngineError, match="does not exist"):
        Engine.from_model_dir(tiny_llama_dir / "nope")


def test_stop_token_ids_stop_beside_the_models_own(
    engine: Engine, oracle: transformers.LlamaForCausalLM
) -> None:
    """A request's stop_token_ids end it at the first such token transformers' greedy output
    has, under ignore_eos too; the stop token is in output_ids, not in the text."""
    prompt_ids = engine.encode_prompt(PROMPTS[0])
    expected = hf_greedy(oracle, prompt_ids, 12)
    stop = expected[5]
    first = expected.index(stop)
    for ignore_eos in (True, False):
        params = SamplingParams(
            max_new_tokens=12, ignore_eos=ignore_eos, stop_token_ids=frozenset({stop})
        )
        (done,) = engine.generate([PROMPTS[0]], params)
        if ignore_eos or not set(expected[:first]) & engine.stop_ids:
            assert done.finish_reason == "stop"
            assert done.output_ids == expected[: first + 1]
            assert done.text == engine.tokenizer.decode(expected[:first])
    streamed = list(
        engine.stream(
            [PROMPTS[0]],
            SamplingParams(max_new_tokens=12, ignore_eos=True, stop_token_ids=frozenset({stop})),
        )
    )
    assert "".join(e.text for e in streamed) == engine.tokenizer.decode(expected[:first])
    assert streamed[-1].finished == "stop"
    assert_all_pages_free(engine)
    with pytest.raises(EngineError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=frozenset({-1}))


def test_a_lone_str_is_one_prompt(engine: Engine, oracle: transformers.LlamaForCausalLM) -> None:
    """generate/stream take a list of prompts, but a str on its own is one prompt (as vLLM's
    generate takes it), not a prompt per character."""
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    prompt_ids = engine.tokenizer.chat_format.encode_user_prompt(PROMPTS[1])
    [c] = engine.generate(PROMPTS[1], params)
    assert c.prompt_ids == prompt_ids
    assert c.output_ids == hf_greedy(oracle, prompt_ids, 4)
    events = list(engine.stream(PROMPTS[1], params))
    assert [e.token_id for e in events] == c.output_ids
    assert_all_pages_free(engine)


@pytest.mark.parametrize("bad", [None, 5, b"Hi", 2.5, [1, "a"]])
def test_what_is_not_a_prompt_is_refused_by_name(engine: Engine, bad: object) -> None:
    """An item that is not a prompt is an EngineError naming its type, and the prompts before
    it are not left queued."""
    with pytest.raises(EngineError, match="a prompt is a str, a list of Message, or a list of"):
        engine.generate([PROMPTS[0], bad])  # type: ignore[list-item]
    assert engine.scheduler.num_waiting == 0
    assert_all_pages_free(engine)


def test_a_prompt_the_chat_format_refuses_leaves_nothing_queued(engine: Engine) -> None:
    """Adding a list of prompts is all or none whatever the error: here the chat format's
    TokenizerError (an unknown role) on the second prompt, after the first was queued."""
    dialog = [Message("user", "Hi"), Message("robot", "beep")]
    with pytest.raises(TokenizerError, match="role 'robot'"):
        engine.generate([PROMPTS[0], dialog])
    with pytest.raises(TokenizerError, match="role 'robot'"):
        engine.stream([PROMPTS[0], dialog])
    assert engine.scheduler.num_waiting == 0
    assert_all_pages_free(engine)
