"""Sampling parameters at their edges reach the step inputs intact."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from sv_engine import Engine, EngineError, SamplingParams
from sv_engine.params import sampler_seed


def test_a_top_k_past_any_integer_type_means_keep_every_token(tiny_llama_dir: Path) -> None:
    """top_k beyond the vocabulary keeps every token, as top_k 0 does; a value no int32 holds
    (10**30) must not fail the step (it did, and took every request in flight with it)."""
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    prompts = ["Name three colours.", "Count from one to ten."]

    def run(top_k: int) -> list[list[int]]:
        params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=top_k, seed=7)
        return [c.output_ids for c in engine.generate(prompts, params)]

    everything = run(0)
    assert run(10**30) == everything
    assert run(engine.runner.config.vocab_size) == everything
    assert run(1) != everything  # top-k really filters: greedy differs from these draws


@pytest.mark.parametrize("dtype", ["bf16", torch.int8, torch.float8_e4m3fn])
def test_a_dtype_the_model_cannot_compute_in_is_refused_at_load(
    tiny_llama_dir: Path, dtype: object
) -> None:
    """from_model_dir(dtype=...) takes a floating-point torch dtype; anything else is an
    EngineError naming it at load (a string failed inside torch, an integer dtype loaded and
    then failed the first request in a kernel)."""
    with pytest.raises(EngineError, match=f"dtype must be None .* got {dtype!r}"):
        Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8, dtype=dtype)  # type: ignore[arg-type]


def test_params_that_are_not_sampling_params_are_refused_by_name(tiny_llama_dir: Path) -> None:
    """A dict of OpenAI's fields as params failed with an AttributeError on its first missing
    attribute; it is an EngineError naming the type, and nothing stays queued."""
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    for call in (engine.generate, engine.stream):
        with pytest.raises(EngineError, match="params must be a SamplingParams or None, got dict"):
            call(["Hi", "Name a colour."], {"max_new_tokens": 4})  # type: ignore[arg-type]
    assert engine.stats.free_pages == engine.stats.pool_pages
    assert [c.output_ids for c in engine.generate(["Hi"], SamplingParams(max_new_tokens=2))]


@pytest.mark.parametrize("ids", [[5, 7], (5, 7), {5, 7}])
def test_stop_token_ids_as_vllm_passes_them_are_taken(tiny_llama_dir: Path, ids: object) -> None:
    """vLLM's stop_token_ids is a list: a list, tuple or set is kept as the frozenset, and a
    generation stops at the first of them as with the frozenset itself."""
    params = SamplingParams(max_new_tokens=8, stop_token_ids=ids)  # type: ignore[arg-type]
    assert params.stop_token_ids == frozenset({5, 7})
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    free = engine.generate(["Hi"], SamplingParams(max_new_tokens=8, ignore_eos=True))[0]
    stop = free.output_ids[3]  # the fourth greedy token: stopping at it ends the output there
    got = engine.generate(["Hi"], SamplingParams(max_new_tokens=8, stop_token_ids=[stop]))[0]  # type: ignore[arg-type]
    first = free.output_ids.index(stop)
    assert got.output_ids == free.output_ids[: first + 1] and got.finish_reason == "stop"


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_a_bool_is_not_a_temperature_or_top_p(field: str) -> None:
    with pytest.raises(EngineError, match=f"{field} must be"):
        SamplingParams(**{field: True})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_num_seqs", 0),
        ("max_step_tokens", 0),
        ("max_step_tokens", -5),
        ("max_step_tokens", "8"),
    ],
)
def test_step_sizes_below_one_are_refused_by_name(
    tiny_llama_dir: Path, name: str, value: object
) -> None:
    """max_num_seqs 0 was refused by the scheduler (its own error type) only after the
    weights had loaded."""
    with pytest.raises(EngineError, match=f"{name} must be a positive integer, got"):
        Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8, **{name: value})  # type: ignore[arg-type]


def test_max_step_tokens_below_max_num_seqs_is_refused_not_raised(tiny_llama_dir: Path) -> None:
    """A step holds one decode token of every running sequence (vLLM refuses the same): 16
    step tokens with 256 sequences was raised to 256 in silence, so a caller asking for
    16-token prompt chunks got 256-token ones."""
    with pytest.raises(
        EngineError, match=r"max_step_tokens \(16\) must be at least max_num_seqs \(256\)"
    ):
        Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8, max_step_tokens=16)
    engine = Engine.from_model_dir(
        tiny_llama_dir, device="cpu", kv_cache_mib=8, max_step_tokens=16, max_num_seqs=4
    )
    assert engine.scheduler.config.max_step_tokens == 16


def test_a_temperature_below_vllms_epsilon_is_greedy(tiny_llama_dir: Path) -> None:
    """Below 1e-5 (vLLM's _SAMPLING_EPS) a temperature samples greedily. Divided by 1e-39 the
    logits left FP32's range and the draw was the lowest-id infinite column, not the argmax."""
    params = SamplingParams(max_new_tokens=6, temperature=1e-39, seed=0, ignore_eos=True)
    assert params.temperature == 0.0 and params.greedy
    assert SamplingParams(temperature=1e-5).temperature == 1e-5  # from 1e-5 on: sampled
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    greedy = SamplingParams(max_new_tokens=6, ignore_eos=True)
    want = engine.generate(["Name three colours."], greedy)[0].output_ids
    assert engine.generate(["Name three colours."], params)[0].output_ids == want


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # FP32's range: 1e39 was inf in the step's inputs (a NaN row; two +inf biases always
        # picked the lower id)
        ({"temperature": 1e39}, "temperature must be in [0, 3.403e+38]"),
        ({"logit_bias": {1: 1e39}}, "logit_bias must map token ids to numbers FP32 holds"),
        ({"logit_bias": {1: -1e39}}, "logit_bias must map token ids to numbers FP32 holds"),
        ({"ignore_eos": "false"}, "ignore_eos must be true or false, got 'false'"),
    ],
)
def test_values_past_what_the_step_holds_are_refused(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(EngineError, match=re.escape(message)):
        SamplingParams(**fields)  # type: ignore[arg-type]


def test_allowed_ids_that_are_all_banned_are_refused(tiny_llama_dir: Path) -> None:
    """A row with no token left came out as token 0, outside allowed_token_ids."""
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)
    eos = min(engine.stop_ids)
    word = engine.tokenizer.decode([300])
    assert engine.tokenizer.encode(word) == [300]  # a one-token word
    cases = [
        (SamplingParams(allowed_token_ids={eos}, min_tokens=2), "or a stop token, banned until"),
        (SamplingParams(allowed_token_ids={300}, bad_words=[word]), "a one-token bad word"),
    ]
    for params, message in cases:
        with pytest.raises(EngineError, match="allowed_token_ids leaves nothing to generate"):
            engine.add_request("Hi", params)
        with pytest.raises(EngineError, match=re.escape(message)):
            engine.add_request("Hi", params)
    assert not engine.has_unfinished()
    # One id left is enough: eos once min_tokens is 0, or a word not banned.
    done = engine.generate(["Hi"], SamplingParams(allowed_token_ids={eos, 300}, min_tokens=2))
    assert done[0].output_ids[:2] == [300, 300]


def test_seeds_a_multiple_of_2_32_apart_draw_differently(tiny_llama_dir: Path) -> None:
    """The sampler's state is 32 bits; the bits above are mixed in, not dropped (seed 1 and
    2**32 + 1 gave the same draws). Below 2**32 a seed is its own."""
    assert [sampler_seed(s) for s in (0, 1, 2**32 - 1)] == [0, 1, 2**32 - 1]
    assert sampler_seed(2**32 + 1) != 1 and sampler_seed(-1) != sampler_seed(2**32 - 1)
    assert all(0 <= sampler_seed(s) < 2**32 for s in (-(2**70), -1, 2**63, 2**100))
    engine = Engine.from_model_dir(tiny_llama_dir, device="cpu", kv_cache_mib=8)

    def draw(seed: int) -> list[int]:
        params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=seed, ignore_eos=True)
        return engine.generate(["Hi"], params)[0].output_ids

    assert draw(1) != draw(2**32 + 1)
    assert draw(2**32 + 1) == draw(2**32 + 1)
