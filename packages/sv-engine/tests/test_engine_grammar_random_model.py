"""The 1B GPU test's JSON-schema batch (test_model_gpu.py) on the CPU, with a random model.

A random model follows no format of its own, so only the schema decides whether an output can
end within its budget: an unbounded JSON integer lets it write digits for ever (the random 1B
checkpoint of the GPU test does exactly that on the CPU: all 8 requests ran to 64 tokens of
digits), so the schema bounds every value and the budget covers its longest valid output.
Oracles: `jsonschema` for each output, and a fresh engine for one that served other work first.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from sv_engine import Completion, Engine, EngineError, SamplingParams
from sv_engine.grammar import Grammar

# The GPU test's schema. Every value is bounded: the integer's digits, the enum, the string's
# length in characters.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 100},
        "tag": {"enum": ["a", "b"]},
        "s": {"type": "string", "maxLength": 10},
    },
    "required": ["n", "tag", "s"],
    "additionalProperties": False,
}
# Every token the grammar allows is at least one byte, so the budget need only exceed the
# longest valid output in bytes, plus the stop token: '{"n":100,"tag":"a","s":"' (24), the
# string, '"}' (2). The library's string takes at most 4 bytes a character (UTF-8; it writes no
# \u escapes), 66 bytes in all; the budget would hold even 12-byte \u-escaped surrogate pairs.
BUDGET = 160


def batch_params() -> list[SamplingParams]:
    """The GPU test's batch: one greedy request and seven sampled ones, one grammar object."""
    grammar = Grammar.json_schema(SCHEMA)
    return [SamplingParams(max_new_tokens=BUDGET, grammar=grammar)] + [
        SamplingParams(max_new_tokens=BUDGET, grammar=grammar, temperature=1.0, seed=i)
        for i in range(7)
    ]


def run_batch(engine: Engine) -> list[Completion]:
    """Every request added up front, then stepped to the end (as the GPU test does)."""
    ids = [
        engine.add_request([128000, 1000 + i, 2000 + i], p) for i, p in enumerate(batch_params())
    ]
    done = {}
    while engine.has_unfinished():
        for event in engine.step():
            if event.completion is not None:
                done[event.request_id] = event.completion
    assert engine.stats.free_pages == engine.stats.pool_pages
    return [done[i] for i in ids]


def serve_other_work(engine: Engine) -> None:
    """What the GPU module's earlier tests ask of the same engine before the JSON batch:
    greedy and seeded top-p batches with overlap off and on, logprobs, logit_bias, a presence
    penalty, min_p, min_tokens with a stop id; and beyond them n > 1, a regex, a cancel."""
    rng = random.Random(5)
    prompts = [[rng.randint(0, 127999) for _ in range(rng.randint(10, 80))] for _ in range(6)]
    for params in (
        SamplingParams(max_new_tokens=12, ignore_eos=True),
        SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=0.8, top_p=0.9, seed=7),
    ):
        for overlap in (False, True):
            engine.overlap = overlap
            engine.generate(prompts, params)
            engine.clear_prefix_cache()
    prompt = prompts[0]
    engine.generate(prompts[:3], SamplingParams(max_new_tokens=8, ignore_eos=True, logprobs=20))
    for extra in (
        {"logit_bias": {1234: 100.0}},
        {"presence_penalty": 2.0},
        {"temperature": 1.0, "seed": 3, "min_p": 0.5, "logprobs": 1},
        {"min_tokens": 3, "stop_token_ids": frozenset({prompt[-1]})},
        {"n": 2, "temperature": 1.0, "seed": 4},
        {"grammar": Grammar.regex("(yes|no)( (yes|no)){3}")},
    ):
        engine.generate([prompt], SamplingParams(max_new_tokens=8, **extra))
    stream = engine.stream([prompt], SamplingParams(max_new_tokens=30, ignore_eos=True))
    next(stream)
    stream.close()  # cancelled mid-request
    assert not engine.has_unfinished()


def engine_on(model_dir: Path) -> Engine:
    return Engine.from_model_dir(model_dir, device="cpu", kv_cache_mib=64, max_num_seqs=32)


def test_every_output_of_the_gpu_tests_batch_validates(tiny_llama_dir: Path) -> None:
    for completion in run_batch(engine_on(tiny_llama_dir)):
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), SCHEMA)


def test_an_engine_that_served_other_work_constrains_as_a_fresh_one(tiny_llama_dir: Path) -> None:
    """Nothing the earlier requests leave on the engine (table rows, token counts, pages,
    sampling state, the prefix cache) changes the constrained batch: token for token what a
    fresh engine gives it."""
    fresh = [c.output_ids for c in run_batch(engine_on(tiny_llama_dir))]
    used = engine_on(tiny_llama_dir)
    serve_other_work(used)
    assert [c.output_ids for c in run_batch(used)] == fresh


def test_boolean_schemas_are_schemas(tiny_llama_dir: Path) -> None:
    """`true` is the schema any JSON value matches (as `{}`), so it constrains like `{}`;
    `false` matches none, so it is refused naming that, not the library's own words."""
    engine = engine_on(tiny_llama_dir)
    params = SamplingParams(max_new_tokens=BUDGET, grammar=Grammar.json_schema(True), seed=0)
    completion = engine.generate([[128000, 1000, 2000]], params)[0]
    assert completion.finish_reason in ("stop", "length")
    if completion.finish_reason == "stop":
        json.loads(completion.text)
    with pytest.raises(EngineError, match="the schema false matches no value"):
        Grammar.json_schema(False).compile()
