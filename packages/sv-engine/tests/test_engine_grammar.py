"""Structured output: every constrained output of the real default model matches its grammar.

The oracles are independent of the grammar library: `jsonschema` validates each JSON output,
`re.fullmatch` each regex output; the choices and the EBNF language are checked by hand. Every
schema bounds its strings and arrays, so that each output completes within the token budget:
an output cut at max_new_tokens is a failure here, not a pass.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from sv_engine import Completion, Engine, EngineError, SamplingParams
from sv_engine.grammar import Grammar

SCHEMAS: list[dict[str, Any]] = [
    {  # a flat object with a pattern and bounded numbers
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,12}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {  # enums and booleans
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "bright": {"type": "boolean"},
        },
        "required": ["colour", "bright"],
        "additionalProperties": False,
    },
    {  # an array of numbers, bounded
        "type": "object",
        "properties": {
            "values": {
                "type": "array",
                "items": {"type": "number", "minimum": -10, "maximum": 10},
                "minItems": 1,
                "maxItems": 4,
            }
        },
        "required": ["values"],
        "additionalProperties": False,
    },
    {  # nested objects
        "type": "object",
        "properties": {
            "city": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "location": {
                        "type": "object",
                        "properties": {
                            "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                            "lon": {"type": "integer", "minimum": -180, "maximum": 180},
                        },
                        "required": ["lat", "lon"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "location"],
                "additionalProperties": False,
            }
        },
        "required": ["city"],
        "additionalProperties": False,
    },
    {  # an array of objects with a string pattern and a const
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^[0-9]{3}-[a-z]{2}$"},
                "kind": {"const": "item"},
            },
            "required": ["id", "kind"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 2,
    },
    {  # a union at the top
        "anyOf": [
            {"type": "integer", "minimum": 1000, "maximum": 9999},
            {"type": "string", "enum": ["none", "unknown"]},
        ]
    },
]

PROMPT = "Reply with a short JSON value describing a person, a place or a thing."


@pytest.fixture(scope="module")
def engine(default_model: Path) -> Engine:
    return Engine.from_model_dir(default_model, device="cpu", kv_cache_mib=64)


def _params(grammar: Grammar, **kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=48, grammar=grammar, **kw)


def _run_all(engine: Engine, params: list[SamplingParams]) -> list[Completion]:
    """Every request in one batch; completions in request order."""
    ids = [engine.add_request(PROMPT, p) for p in params]
    done = {}
    while engine.has_unfinished():
        for event in engine.step():
            if event.completion is not None:
                done[event.request_id] = event.completion
    stats = engine.stats
    assert stats.free_pages == stats.pool_pages and stats.assigned_pages == 0
    return [done[i] for i in ids]


@pytest.mark.parametrize("overlap", [True, False])
def test_every_schema_output_validates(engine: Engine, overlap: bool) -> None:
    """All schemas in one batch, greedy and (with overlap) sampled too."""
    engine.overlap = overlap
    # The plain loop takes every other schema: the same code path, half the CPU time.
    cases = [(schema, _params(Grammar.json_schema(schema))) for schema in SCHEMAS]
    if not overlap:
        cases = cases[::2]
    if overlap:
        cases += [
            (schema, _params(Grammar.json_schema(schema), temperature=1.0, seed=seed))
            for seed, schema in enumerate(SCHEMAS)
        ]
    try:
        completions = _run_all(engine, [params for _, params in cases])
    finally:
        engine.overlap = True
    for (schema, _), completion in zip(cases, completions, strict=True):
        assert completion.finish_reason == "stop", (completion.text, schema)
        jsonschema.validate(json.loads(completion.text), schema)


def test_json_object_regex_choice_and_ebnf(engine: Engine) -> None:
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    grammars = [
        Grammar.json_object(),
        Grammar.regex(pattern),
        Grammar.choice(["yes", "no", "maybe not"]),
        Grammar.ebnf('root ::= "(" digit ("+" digit){1,3} ")"\ndigit ::= [0-9]'),
    ]
    out = _run_all(engine, [_params(g) for g in grammars])
    assert all(c.finish_reason == "stop" for c in out), [c.text for c in out]
    assert isinstance(json.loads(out[0].text), dict)
    assert re.fullmatch(pattern, out[1].text)
    assert out[2].text in ("yes", "no", "maybe not")
    assert re.fullmatch(r"\([0-9](\+[0-9]){1,3}\)", out[3].text)


def test_grammar_end_stops_even_under_ignore_eos(engine: Engine) -> None:
    out = engine.generate([PROMPT], _params(Grammar.choice(["alpha"]), ignore_eos=True))[0]
    assert out.text == "alpha" and out.finish_reason == "stop"
    assert out.output_ids[-1] in engine.stop_ids


def test_a_grammar_past_the_lexers_limits_fails_the_request(engine: Engine) -> None:
    """A regex built to explode runs its matcher out of the lexer's limits within a few
    tokens: the request ends at the token the matcher failed on, which is not part of its
    text, and it is reported as failed with the library's reason, not as stopped."""
    out = _run_all(engine, [_params(Grammar.regex("(a{1000}){1000}"))])[0]
    assert out.finish_reason == "error", (out.text, out.finish_reason)
    assert out.error is not None and "output constraint failed" in out.error
    assert set(out.text) <= {"a"} and len(out.output_ids) < 48
    assert out.text == engine.tokenizer.decode(out.output_ids[:-1])


def test_min_tokens_with_a_grammar_is_refused(engine: Engine) -> None:
    """A grammar that completes within min_tokens allows only the stop tokens, which
    min_tokens bans: the row had no token left and came out as token 0, with no error (an
    audit: choice ["yes", "no"] with min_tokens 5 gave [4607, 0], finish "stop")."""
    params = _params(Grammar.choice(["yes", "no"]), min_tokens=5)
    with pytest.raises(EngineError, match="min_tokens cannot be combined with an output"):
        engine.add_request(PROMPT, params)
    assert not engine.has_unfinished()


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(engine: Engine) -> None:
    """A plain request batched with constrained ones gets the tokens it gets alone."""
    plain = SamplingParams(max_new_tokens=16)
    alone = engine.generate([PROMPT], plain)[0].output_ids
    batched = _run_all(engine, [plain, _params(Grammar.json_object())])
    assert batched[0].output_ids == alone


@pytest.mark.parametrize(
    ("grammar", "problem"),
    [
        (
            lambda: Grammar.json_schema({"type": "object", "properties": {"a": {"$ref": "#/x"}}}),
            "json_schema",
        ),
        (lambda: Grammar.regex("(unclosed"), "regex"),
        (lambda: Grammar.ebnf("root ::= undefined_rule"), "grammar"),
        (lambda: Grammar.choice([]), "choice"),
        (lambda: Grammar.json_schema("not a schema"), "schema"),
    ],
)
def test_grammars_that_cannot_compile_are_refused(
    engine: Engine, grammar: Any, problem: str
) -> None:
    with pytest.raises(EngineError, match=problem):
        engine.add_request(PROMPT, _params(grammar()))
    assert not engine.has_unfinished()


def test_logprobs_under_a_grammar_are_of_the_raw_logits(engine: Engine) -> None:
    """The mask is applied in place before sampling; log-probabilities still score the raw
    logits (finite, not renormalized over the allowed tokens), as a request whose logits are
    processed into a new tensor (a logit_bias of 0, a no-op) reports them."""
    grammar = Grammar.choice(["alpha", "beta"])

    def run(**extra: Any) -> Completion:
        # A cold prefix cache each time: both prompts run the same steps (a cached prompt's
        # shorter prefill gives FP32 logits that differ in the last bits).
        engine.clear_prefix_cache()
        return engine.generate([PROMPT], _params(grammar, logprobs=3, **extra))[0]

    raw, processed = run(), run(logit_bias={0: 0.0})
    assert raw.output_ids == processed.output_ids
    assert raw.logprobs is not None and processed.logprobs is not None
    for a, b in zip(raw.logprobs, processed.logprobs, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-6)
        assert a.top == b.top and all(v > -1e30 for _, v in a.top)
    assert raw.logprobs[0].logprob < -1e-3  # not the ~0 of a distribution over the mask
