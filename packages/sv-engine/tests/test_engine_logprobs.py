"""Log-probabilities through the engine on the CPU, against transformers' FP32 log_softmax."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from sv_engine import Engine, EngineError, SamplingParams, TokenLogprob
from sv_model import PendingTokens, StepInputs

PROMPTS = [
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Translate 'good morning' into French, please, and explain the phrase in detail.",
]
TOL = 1e-4


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> Engine:
    # A small step budget splits the longer prompts into chunks (prompt logprobs per chunk).
    return Engine.from_model_dir(
        tiny_llama_dir, device="cpu", kv_cache_mib=64, max_num_seqs=4, max_step_tokens=8
    )


@pytest.fixture(scope="module")
def oracle(tiny_llama_dir: Path) -> transformers.LlamaForCausalLM:
    return transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def hf_logprobs(model: transformers.LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: row p is the log-distribution of token p + 1."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def assert_matches(got: TokenLogprob, want_row: torch.Tensor, k: int) -> None:
    assert got.logprob == pytest.approx(float(want_row[got.token_id]), abs=TOL)
    values, ids = torch.topk(want_row, k)
    assert [t for t, _ in got.top] == ids.tolist()  # the order too
    assert [v for _, v in got.top] == pytest.approx(values.tolist(), abs=TOL)


def test_output_logprobs_equal_transformers(
    engine: Engine, oracle: transformers.LlamaForCausalLM
) -> None:
    params = SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=20)
    for c in engine.generate(PROMPTS, params):
        assert c.logprobs is not None and len(c.logprobs) == len(c.output_ids)
        want = hf_logprobs(oracle, c.prompt_ids + c.output_ids)
        for i, got in enumerate(c.logprobs):
            assert got.token_id == c.output_ids[i]
            assert_matches(got, want[len(c.prompt_ids) - 1 + i], 20)


def test_greedy_output_unchanged_by_logprobs(engine: Engine) -> None:
    plain = engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, ignore_eos=True))
    scored = engine.generate(
        PROMPTS, SamplingParams(max_new_tokens=10, ignore_eos=True, logprobs=5)
    )
    assert [c.output_ids for c in scored] == [c.output_ids for c in plain]
    assert all(c.logprobs is None for c in plain)


def test_sampled_tokens_scored_on_the_raw_logits(
    engine: Engine, oracle: transformers.LlamaForCausalLM
) -> None:
    """Temperature and top-k change the draw, not the reported distribution."""
    params = SamplingParams(
        max_new_tokens=5, ignore_eos=True, temperature=1.7, top_k=40, seed=3, logprobs=2
    )
    [c] = engine.generate(PROMPTS[:1], params)
    assert c.logprobs is not None
    want = hf_logprobs(oracle, c.prompt_ids + c.output_ids)
    for i, got in enumerate(c.logprobs):
        assert_matches(got, want[len(c.prompt_ids) - 1 + i], 2)


def test_prompt_logprobs_equal_transformers_across_chunks_and_cache(
    engine: Engine, oracle: transformers.LlamaForCausalLM
) -> None:
    """Every prompt token but the first is scored, chunk by chunk (8-token steps), also when
    the same prompt's pages are in the prefix cache from the run before; and ranked as vLLM
    ranks it: how many tokens are at least as likely (within the tolerance of the oracle's
    values, where near ties could go either way)."""
    params = SamplingParams(max_new_tokens=2, ignore_eos=True, prompt_logprobs=3)
    engine.generate(PROMPTS[2:], SamplingParams(max_new_tokens=1))  # fills the prefix cache
    ranks = []
    for c in engine.generate(PROMPTS, params):
        scored = c.prompt_logprobs
        assert scored is not None and len(scored) == len(c.prompt_ids) > 8
        assert scored[0] is None
        want = hf_logprobs(oracle, c.prompt_ids)
        for p, got in enumerate(scored[1:], start=1):
            assert got is not None and got.token_id == c.prompt_ids[p]
            assert_matches(got, want[p - 1], 3)
            own = want[p - 1, got.token_id]
            assert got.rank is not None
            assert int((want[p - 1] > own + TOL).sum()) < got.rank
            assert got.rank <= int((want[p - 1] >= own - TOL).sum())
            ranks.append(got.rank)
    assert len(set(ranks)) > 10  # (a random model: ranks all over its vocabulary)


def test_stream_events_carry_the_completions_logprobs(engine: Engine) -> None:
    params = SamplingParams(max_new_tokens=4, ignore_eos=True, logprobs=1)
    events = list(engine.stream(PROMPTS[:2], params))
    for request_id in {e.request_id for e in events}:
        mine = [e for e in events if e.request_id == request_id]
        completion = mine[-1].completion
        assert completion is not None
        assert [e.logprob for e in mine] == completion.logprobs


def test_a_request_keeps_no_object_per_token(engine: Engine) -> None:
    """Neither a running request nor its completion holds a TokenLogprob per token (the
    garbage collector walks every live one): the events' die with them, and the completion's
    are made as they are read, equal to the events'."""

    def live_token_logprobs() -> int:
        return sum(isinstance(o, TokenLogprob) for o in gc.get_objects())

    before = live_token_logprobs()
    request = engine.add_request(
        PROMPTS[0], SamplingParams(max_new_tokens=40, ignore_eos=True, logprobs=3)
    )
    seen: list[tuple[int, float, tuple[tuple[int, float], ...]]] = []
    completion = None
    while completion is None:
        events = engine.step()
        scored = [e.logprob for e in events]
        assert all(t is not None for t in scored)  # every event carries its token's
        seen += [(t.token_id, t.logprob, t.top) for t in scored if t is not None]
        completion = next((e.completion for e in events if e.completion), None)
        del events, scored
        assert live_token_logprobs() == before
    assert completion.request_id == request and completion.logprobs is not None
    assert len(seen) == len(completion.logprobs) == 40
    assert [(t.token_id, t.logprob, t.top) for t in completion.logprobs] == seen


def test_output_logprobs_read_as_a_list() -> None:
    """OutputLogprobs is a sequence of the TokenLogprobs made from its rows: indexing (negative
    too), slices, iteration, equality with a list of the same items, truncation."""
    from sv_engine.logprobs import OutputLogprobs

    values = torch.tensor([[-0.5, -1.5], [-0.25, -2.25]])
    step = PendingTokens(
        torch.tensor([3, 1]), (torch.tensor([-0.5, -2.25]), values, torch.tensor([[3, 0], [9, 1]]))
    ).logprobs()
    assert step is not None
    out = OutputLogprobs(2)
    first = out.add(1, step, 1)
    out.add(3, step, 0)
    out.add(9, step, 1)
    eager = [
        TokenLogprob(1, -2.25, ((9, -0.25), (1, -2.25))),
        TokenLogprob(3, -0.5, ((3, -0.5), (0, -1.5))),
        TokenLogprob(9, -2.25, ((9, -0.25), (1, -2.25))),
    ]
    assert first == eager[0]
    assert len(out) == 3 and out == eager and eager == out and list(out) == eager
    assert out[-1] == eager[2] and out[1:] == eager[1:] and out[::-2] == eager[::-2]
    assert out != eager[:2] and out != [*eager[:2], eager[0]]
    with pytest.raises(IndexError):
        out[3]
    assert out.truncate(2) is out and out == eager[:2]


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [-1, 21, True, 2.0])
def test_bad_logprobs_refused(field: str, value: object) -> None:
    with pytest.raises(EngineError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_first_stream_event_carries_the_prompt_logprobs(engine: Engine) -> None:
    params = SamplingParams(max_new_tokens=3, ignore_eos=True, prompt_logprobs=0)
    events = list(engine.stream(PROMPTS[:1], params))
    completion = events[-1].completion
    assert completion is not None and completion.prompt_logprobs is not None
    assert events[0].prompt_logprobs == completion.prompt_logprobs
    assert len(completion.prompt_logprobs) == len(completion.prompt_ids)
    assert all(e.prompt_logprobs is None for e in events[1:])


def test_prompt_logprobs_of_one_token_chunks(
    tiny_llama_dir: Path, oracle: transformers.LlamaForCausalLM
) -> None:
    """A 4-token step budget with 3 sequences decoding leaves a prompt one token per step:
    those steps feed one token per sequence, and still score the prompt."""
    engine = Engine.from_model_dir(
        tiny_llama_dir, device="cpu", kv_cache_mib=64, max_num_seqs=4, max_step_tokens=4
    )
    first = [SamplingParams(max_new_tokens=40, ignore_eos=True)] * 3
    ids = [engine.add_request(p, q) for p, q in zip(PROMPTS[:2] + PROMPTS[:1], first, strict=True)]
    for _ in range(6):
        engine.step()
    scored = engine.add_request(PROMPTS[2], SamplingParams(max_new_tokens=1, prompt_logprobs=1))
    done = {}
    while engine.has_unfinished():
        done |= {e.request_id: e.completion for e in engine.step() if e.completion is not None}
    assert set(ids) < set(done)
    c = done[scored]
    assert c is not None and c.prompt_logprobs is not None
    assert len(c.prompt_logprobs) == len(c.prompt_ids)
    want = hf_logprobs(oracle, c.prompt_ids)
    for p, got in enumerate(c.prompt_logprobs[1:], start=1):
        assert got is not None
        assert_matches(got, want[p - 1], 1)


def test_token_logprob_reads_its_row_when_asked() -> None:
    """A TokenLogprob made from a step's arrays equals (and hashes and prints as) one made
    from the hand-built tuples of its row's first k entries, as plain Python ints and floats;
    the step's arrays copy the runner's host tensors (pinned buffers on CUDA, reused later)."""

    ids = torch.tensor([3, 1])
    chosen = torch.tensor([-0.5, -2.25])
    values = torch.tensor([[-0.5, -1.5, -3.0], [-0.25, -2.25, -4.0]])
    top_ids = torch.tensor([[3, 0, 7], [9, 1, 2]])
    rows = PendingTokens(ids, (chosen, values, top_ids)).logprobs()
    assert rows is not None
    values.fill_(0.0)  # the step's rows are its own
    lazy = TokenLogprob.of_row(1, rows.chosen[1], rows, 1, 2)
    eager = TokenLogprob(1, -2.25, ((9, -0.25), (1, -2.25)))
    assert repr(lazy) == repr(eager)
    assert lazy == eager and hash(lazy) == hash(eager)
    assert lazy.top == ((9, -0.25), (1, -2.25))
    assert all(type(t) is int and type(v) is float for t, v in lazy.top)
    assert lazy != TokenLogprob(1, -2.25, ((9, -0.25),))
    assert TokenLogprob.of_row(3, rows.chosen[0], rows, 0, 0).top == ()


def assert_same_scores(
    got: Sequence[TokenLogprob | None] | None, want: Sequence[TokenLogprob | None] | None
) -> None:
    """The same tokens, ranks and top ids (as far as `want`'s go), the values within 1e-5: a
    prompt token scored in another step's batch may differ in the last bit on the CPU."""
    assert got is not None and want is not None and len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is None or b is None:
            continue
        assert (a.token_id, a.rank) == (b.token_id, b.rank)
        assert a.logprob == pytest.approx(b.logprob, rel=1e-5, abs=1e-5)
        top = a.top[: len(b.top)]
        assert [t for t, _ in top] == [t for t, _ in b.top]
        assert [v for _, v in top] == pytest.approx([v for _, v in b.top], rel=1e-5, abs=1e-5)


def _count_scored(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A spy on the runner: how many prompt tokens each launched step scores (the device
    work of prompt_logprobs: a logits row per token, its log-softmax, top and rank)."""
    scored: list[int] = []
    launch = engine.runner.launch

    def counting(step: StepInputs) -> PendingTokens:
        scored.append(sum(len(targets) for _, _, targets in step.prompt_logprobs))
        return launch(step)

    monkeypatch.setattr(engine.runner, "launch", counting)
    return scored


def test_the_choices_of_a_prompt_score_it_once(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n choices with prompt_logprobs score their prompt once between them (whichever choice's
    chunk comes to a token first scores it, 8-token steps interleaving them), and each shows
    the prompt_logprobs of the same request with n = 1."""
    params = SamplingParams(max_new_tokens=3, ignore_eos=True, prompt_logprobs=2)
    [one] = engine.generate(PROMPTS[2], params)
    assert one.prompt_logprobs is not None and len(one.prompt_logprobs) > 8
    scored = _count_scored(engine, monkeypatch)
    choices = engine.generate(PROMPTS[2], replace(params, n=3, temperature=1.0, seed=5))
    assert sum(scored) == len(one.prompt_ids) - 1
    assert len(choices) == 3 and len({tuple(c.output_ids) for c in choices}) > 1
    assert_same_scores(choices[0].prompt_logprobs, one.prompt_logprobs)
    assert all(c.prompt_logprobs == choices[0].prompt_logprobs for c in choices[1:])
    assert not engine.has_unfinished()


def test_requests_of_one_prompt_share_its_scores_until_the_last_ends(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server queues each choice as a request of its own: live requests of the same prompt
    asking for the same K share its scores, also when the one that scored part of it is
    cancelled before its step comes back; a different K is scored apart, and a request after
    the last sharer ended scores the prompt afresh."""
    params = SamplingParams(max_new_tokens=2, ignore_eos=True, prompt_logprobs=1)
    [want] = engine.generate(PROMPTS[2], params)
    scored = _count_scored(engine, monkeypatch)
    first = engine.add_request(PROMPTS[2], params)
    engine.step()  # its first 8-token chunk is scored...
    engine.overlap = True
    try:
        later = [engine.add_request(PROMPTS[2], params) for _ in range(2)]
        other_k = engine.add_request(PROMPTS[2], replace(params, prompt_logprobs=3))
        engine.step()  # ...and with overlap, the next step is launched before this returns
        assert engine.cancel(first) is not None  # (its rows in flight still go to the others)
        done = {}
        while engine.has_unfinished():
            done |= {e.request_id: e.completion for e in engine.step() if e.completion}
    finally:
        engine.overlap = False
    assert set(done) == {*later, other_k}
    n = len(want.prompt_ids) - 1
    assert sum(scored) == 2 * n  # once for K = 1 (two requests and a cancelled one), once for 3
    for request_id in later:
        assert_same_scores(done[request_id].prompt_logprobs, want.prompt_logprobs)
    assert_same_scores(done[other_k].prompt_logprobs, want.prompt_logprobs)
    assert all(len(s.top) == 3 for s in (done[other_k].prompt_logprobs or [])[1:] if s)
    assert not engine._live._prompt_scores  # nothing kept once they ended
    scored.clear()
    [again] = engine.generate(PROMPTS[2], params)
    assert sum(scored) == n
    assert_same_scores(again.prompt_logprobs, want.prompt_logprobs)


def test_shared_scores_are_each_requests_own_once_given(engine: Engine) -> None:
    """Requests that share their prompt's scores while in flight each get a list of their
    own: a choice cancelled mid-prefill keeps the scores it had when it ended (the others'
    later chunks do not grow it after its final event), and changing one choice's list
    leaves the others' alone."""
    params = SamplingParams(max_new_tokens=2, ignore_eos=True, prompt_logprobs=1)
    for overlap in (False, True):
        engine.overlap = overlap
        try:
            cancelled, kept, other = (engine.add_request(PROMPTS[2], params) for _ in range(3))
            engine.step()  # the first 8-token chunk is scored
            event = engine.cancel(cancelled)
            assert event is not None and event.completion is not None
            partial = event.completion.prompt_logprobs
            assert partial is not None and len(partial) > 1
            had = list(partial)
            done = {}
            while engine.has_unfinished():
                done |= {e.request_id: e.completion for e in engine.step() if e.completion}
        finally:
            engine.overlap = False
        assert partial == had  # as it was when the request ended
        first, second = done[kept].prompt_logprobs, done[other].prompt_logprobs
        assert first is not None and second is not None and first == second
        assert len(first) == len(done[kept].prompt_ids) > len(had)
        first.pop()
        assert len(second) == len(done[other].prompt_ids)
    assert not engine._live._prompt_scores
