"""Penalties, min_p, logit_bias, min_tokens and skip_special_tokens through the engine on the
CPU: every greedy token is the argmax of transformers' logits processed by the formulas,
written out here (OpenAI's presence/frequency, vLLM's repetition and min_p)."""

from __future__ import annotations

import pickle
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from sv_engine import Engine, EngineError, SamplingParams
from sv_weights import tiny_llama_config, write_random_checkpoint

PROMPTS = ["Write a haiku about the sea.", "What is 2 + 2?", "Name three colours, please."]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path) -> Engine:
    return Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=64)


@pytest.fixture(scope="module")
def tied_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model with a tied LM head: it mostly repeats tokens it has seen, which is
    what penalties act on."""
    d = tmp_path_factory.mktemp("tiny-tied")
    cfg = tiny_llama_config(vocab_size=128256, bos_token_id=128000, eos_token_ids=(128001, 128009))
    write_random_checkpoint(d, cfg, seed=1, dtype=torch.float32)
    shutil.copy(tiny_llama_dir / "tokenizer.json", d / "tokenizer.json")
    return d


@pytest.fixture(scope="module")
def tied(tied_dir: Path) -> Engine:
    return Engine.from_model_dir(tied_dir, device="cpu", kv_cache_mib=64)


@pytest.fixture(scope="module")
def tied_oracle(tied_dir: Path) -> transformers.LlamaForCausalLM:
    return transformers.LlamaForCausalLM.from_pretrained(tied_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def oracle(tiny_llama_dir: Path) -> transformers.LlamaForCausalLM:
    return transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def hf_logits(model: transformers.LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def processed(
    row: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams
) -> list[float]:
    """One position's logits after logit_bias, min_tokens, then the penalties, by the formulas."""
    mu = row.tolist()
    for token, value in p.logit_bias.items():
        mu[token] += value
    for j in set(prompt) | set(output):  # the only tokens a penalty touches
        c = output.count(j)
        mu[j] = mu[j] / p.repetition_penalty if mu[j] > 0 else mu[j] * p.repetition_penalty
        mu[j] -= c * p.frequency_penalty + (c > 0) * p.presence_penalty
    return mu


def assert_greedy_follows_the_formulas(
    engine: Engine,
    oracle: transformers.LlamaForCausalLM,
    params: SamplingParams,
    prompts: list[str] = PROMPTS,
) -> list[list[int]]:
    outputs = []
    for c in engine.generate(prompts, params):
        logits = hf_logits(oracle, c.prompt_ids + c.output_ids)
        for i, token in enumerate(c.output_ids):
            mu = processed(
                logits[len(c.prompt_ids) - 1 + i], c.prompt_ids, c.output_ids[:i], params
            )
            assert token == max(range(len(mu)), key=mu.__getitem__), f"token {i}"
        outputs.append(c.output_ids)
    return outputs


@pytest.mark.parametrize(
    "penalties",
    [
        {"presence_penalty": 1.5},
        {"frequency_penalty": 0.8},
        {"repetition_penalty": 1.8},
        {"repetition_penalty": 0.6, "presence_penalty": -0.5, "frequency_penalty": 0.3},
    ],
)
def test_penalties_follow_the_formulas(
    tied: Engine, tied_oracle: transformers.LlamaForCausalLM, penalties: dict[str, float]
) -> None:
    params = SamplingParams(max_new_tokens=10, ignore_eos=True, **penalties)  # type: ignore[arg-type]
    penalized = assert_greedy_follows_the_formulas(tied, tied_oracle, params)
    plain = SamplingParams(max_new_tokens=10, ignore_eos=True)
    assert penalized != [c.output_ids for c in tied.generate(PROMPTS, plain)]  # they acted


def test_logit_bias_bans_and_favours(engine: Engine, oracle: transformers.LlamaForCausalLM) -> None:
    plain = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
    bias = {plain.output_ids[0]: -100.0, 1234: 7.5}
    params = SamplingParams(max_new_tokens=6, ignore_eos=True, logit_bias=bias)
    [out] = assert_greedy_follows_the_formulas(engine, oracle, params)[:1]
    assert plain.output_ids[0] not in out


@pytest.mark.parametrize(
    "controls", [{"presence_penalty": 2.0}, {"allowed_token_ids": {5, 6}}], ids=str
)
def test_rows_without_controls_are_untouched_in_a_mixed_batch(
    engine: Engine, controls: dict[str, Any]
) -> None:
    plain = SamplingParams(max_new_tokens=8, ignore_eos=True)
    want = [c.output_ids for c in engine.generate(PROMPTS, plain)]
    ids = [engine.add_request(PROMPTS[0], replace(plain, **controls))]
    ids += [engine.add_request(p, plain) for p in PROMPTS[1:]]
    done: dict[int, list[int]] = {}
    while engine.has_unfinished():
        for e in engine.step():
            if e.completion is not None:
                done[e.request_id] = e.completion.output_ids
    assert [done[i] for i in ids[1:]] == want[1:]
    if "allowed_token_ids" in controls:  # and the controlled row did what it asked
        assert set(done[ids[0]]) <= controls["allowed_token_ids"]


def test_min_tokens_bans_the_stop_tokens_until_then(
    engine: Engine, oracle: transformers.LlamaForCausalLM
) -> None:
    plain = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=6, ignore_eos=True))[0]
    stop = plain.output_ids[1]  # made a stop token: without min_tokens it ends the output early
    early = engine.generate(
        PROMPTS[:1], SamplingParams(max_new_tokens=6, stop_token_ids=frozenset({stop}))
    )[0]
    assert early.finish_reason == "stop" and len(early.output_ids) <= 2
    params = SamplingParams(max_new_tokens=6, min_tokens=4, stop_token_ids=frozenset({stop}))
    c = engine.generate(PROMPTS[:1], params)[0]
    assert stop not in c.output_ids[:4] and len(c.output_ids) >= 4
    logits = hf_logits(oracle, c.prompt_ids + c.output_ids)
    banned = set(engine.stop_ids) | {stop}
    for i, token in enumerate(c.output_ids[:4]):
        row = logits[len(c.prompt_ids) - 1 + i].clone()
        row[list(banned)] = float("-inf")
        assert token == int(row.argmax())


def test_min_p_keeps_only_likely_enough_tokens(
    engine: Engine, oracle: transformers.LlamaForCausalLM
) -> None:
    """Sampled at temperature 1.5 with min_p 0.8 (the tiny random model's distributions are
    flat): each token's probability (at T) is at least 0.8 of the most likely one's, and
    without min_p less likely tokens do turn up."""

    def ratios(min_p: float) -> list[float]:
        out = []
        for seed in range(6):
            params = SamplingParams(
                max_new_tokens=6, ignore_eos=True, temperature=1.5, seed=seed, min_p=min_p
            )
            c = engine.generate(PROMPTS[:1], params)[0]
            logits = hf_logits(oracle, c.prompt_ids + c.output_ids)
            for i, token in enumerate(c.output_ids):
                probs = torch.softmax(logits[len(c.prompt_ids) - 1 + i] / 1.5, dim=-1)
                out.append(float(probs[token] / probs.max()))
        return out

    assert min(ratios(0.8)) >= 0.8 - 1e-5
    assert min(ratios(0.0)) < 0.8


def test_penalties_survive_preemption(tiny_llama_dir: Path) -> None:
    """A pool too small for all at once: sequences are preempted and recomputed on other table
    rows; their token counts are rebuilt, so the outputs are those of a roomy pool."""
    params = SamplingParams(
        max_new_tokens=24, ignore_eos=True, frequency_penalty=0.7, repetition_penalty=1.3
    )
    tight = Engine.from_model_dir(
        tiny_llama_dir, device="cpu", kv_cache_mib=0.06, admission="preemptive"
    )
    roomy = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=64)
    got = [c.output_ids for c in tight.generate(PROMPTS, params)]
    assert tight.stats.preemptions > 0
    assert got == [c.output_ids for c in roomy.generate(PROMPTS, params)]


def test_skip_special_tokens(engine: Engine) -> None:
    special = engine.tokenizer.special_tokens["<|reserved_special_token_0|>"]
    forced = {special: 100.0}
    shown = engine.generate(
        PROMPTS[:1],
        SamplingParams(
            max_new_tokens=2, ignore_eos=True, logit_bias=forced, skip_special_tokens=False
        ),
    )[0]
    skipped = engine.generate(
        PROMPTS[:1], SamplingParams(max_new_tokens=2, ignore_eos=True, logit_bias=forced)
    )[0]
    assert shown.output_ids == skipped.output_ids == [special, special]
    assert shown.text == "<|reserved_special_token_0|>" * 2 and skipped.text == ""


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("repetition_penalty", 0.0),
        ("repetition_penalty", float("inf")),
        ("repetition_penalty", 1e-38),  # logits divided by it leave FP32's range
        ("presence_penalty", float("nan")),
        ("presence_penalty", 1e39),  # finite in Python, infinite in the sampler's FP32
        ("presence_penalty", -2.01),
        ("frequency_penalty", "1"),
        ("frequency_penalty", 2.5),
        ("min_p", 1.5),
        ("min_p", -0.1),
        ("min_tokens", -1),
        ("min_tokens", 200),  # more than max_new_tokens
        ("logit_bias", {"5": 1.0}),
        ("logit_bias", {5: float("inf")}),
        ("skip_special_tokens", 1),
    ],
)
def test_bad_values_refused(field: str, value: object) -> None:
    with pytest.raises(EngineError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_logit_bias_outside_the_vocabulary_is_refused_at_add(engine: Engine) -> None:
    """An id past the logits is refused when the request is added, naming it: found only when
    the step applies the bias, it failed that step and so ended every other request in flight."""
    vocab_size = engine.runner.config.vocab_size
    running = engine.add_request(PROMPTS[0], SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.step()
    with pytest.raises(EngineError, match=f"logit_bias has token id {vocab_size}, outside"):
        engine.add_request(PROMPTS[1], SamplingParams(logit_bias={5: 1.0, vocab_size: 1.0}))
    finished = []
    while engine.has_unfinished():
        finished += [e.completion for e in engine.step() if e.completion is not None]
    assert [(c.request_id, c.finish_reason, len(c.output_ids)) for c in finished] == [
        (running, "length", 8)
    ]
    assert engine.stats.free_pages == engine.stats.pool_pages


def test_logit_bias_is_kept_as_it_was_checked(engine: Engine) -> None:
    """SamplingParams keeps its own copy of logit_bias: the caller's dict, changed after the
    request was added (reused for the next one), once reached the running request's steps
    unchecked, and an id past the logits failed the step, ending every request in flight."""
    vocab_size = engine.runner.config.vocab_size
    bias = {5: 1.0}
    params = SamplingParams(max_new_tokens=8, ignore_eos=True, logit_bias=bias)
    running = engine.add_request(PROMPTS[0], params)
    engine.step()
    bias[vocab_size] = 1.0  # the caller's next request's bias, or a typo
    bias[6] = float("nan")
    assert dict(params.logit_bias) == {5: 1.0}
    finished = []
    while engine.has_unfinished():
        finished += [e.completion for e in engine.step() if e.completion is not None]
    assert [(c.request_id, c.finish_reason, len(c.output_ids)) for c in finished] == [
        (running, "length", 8)
    ]
    assert pickle.loads(pickle.dumps(params)) == params
