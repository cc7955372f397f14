"""Structured output through the official `openai` client, on the default model on the CPU:
every output validates (jsonschema, re.fullmatch), streamed or not; a constraint the grammar
library cannot compile is a 400 naming the field."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest

RunningServer = Any

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0},
        "coastal": {"type": "boolean"},
    },
    "required": ["city", "population", "coastal"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
QUESTION = [{"role": "user", "content": "Describe Lisbon as JSON."}]


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_response_format_json_schema(client: openai.OpenAI, server: RunningServer) -> None:
    reply = client.chat.completions.create(
        model=server.model_name, messages=QUESTION, max_tokens=60, response_format=FORMAT
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


def test_response_format_json_schema_streamed(client: openai.OpenAI, server: RunningServer) -> None:
    stream = client.chat.completions.create(
        model=server.model_name,
        messages=QUESTION,
        max_tokens=60,
        response_format=FORMAT,
        temperature=0.8,
        seed=3,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_and_guided_fields(client: openai.OpenAI, server: RunningServer) -> None:
    reply = client.chat.completions.create(
        model=server.model_name,
        messages=QUESTION,
        max_tokens=200,
        response_format={"type": "json_object"},
        seed=1,  # without one a draw may run to max_tokens, which no grammar can finish
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    done = client.completions.create(
        model=server.model_name,
        prompt="The answer is",
        max_tokens=10,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert done.choices[0].text in ("yes", "no")
    done = client.completions.create(
        model=server.model_name,
        prompt="A date:",
        max_tokens=20,
        extra_body={"guided_regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"},
    )
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", done.choices[0].text)
    done = client.completions.create(
        model=server.model_name,
        prompt="A sum:",
        max_tokens=20,
        extra_body={"guided_grammar": 'root ::= num " + " num\nnum ::= [1-9] [0-9]?'},
    )
    assert re.fullmatch(r"[1-9][0-9]? \+ [1-9][0-9]?", done.choices[0].text)
    done = client.completions.create(
        model=server.model_name,
        prompt="Data:",
        max_tokens=200,
        seed=1,
        extra_body={"guided_json": json.dumps(SCHEMA)},
    )
    jsonschema.validate(json.loads(done.choices[0].text), SCHEMA)


def test_vllm_structured_outputs(client: openai.OpenAI, server: RunningServer) -> None:
    """vLLM's `structured_outputs` (which replaced `guided_*` in vLLM 0.12): each of its
    constraints binds the output, checked by jsonschema and re.fullmatch."""

    def text(constraint: dict[str, Any], prompt: str = "Data:", **more: Any) -> str:
        done = client.completions.create(
            model=server.model_name,
            prompt=prompt,
            max_tokens=200,
            seed=1,
            extra_body={"structured_outputs": constraint, **more},
        )
        assert done.choices[0].finish_reason == "stop", done.choices[0].text
        return done.choices[0].text

    jsonschema.validate(json.loads(text({"json": SCHEMA})), SCHEMA)
    jsonschema.validate(json.loads(text({"json": json.dumps(SCHEMA)})), SCHEMA)
    assert isinstance(json.loads(text({"json_object": True})), dict)
    assert text({"choice": ["yes", "no"]}, "The answer is") in ("yes", "no")
    date = r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"
    assert re.fullmatch(date, text({"regex": date}, "A date:"))
    sum_grammar = 'root ::= num " + " num\nnum ::= [1-9] [0-9]?'
    assert re.fullmatch(r"[1-9][0-9]? \+ [1-9][0-9]?", text({"grammar": sum_grammar}, "A sum:"))
    # disable_additional_properties: an object schema that lists no more than "a" (an object
    # listing none) then allows nothing else, at any depth: one output can match.
    open_schema = {"type": "object", "properties": {"a": {"type": "object"}}, "required": ["a"]}
    closed = {"json": open_schema, "disable_additional_properties": True}
    assert json.loads(text(closed | {"disable_any_whitespace": True})) == {"a": {}}
    chat = client.chat.completions.create(
        model=server.model_name,
        messages=QUESTION,
        max_tokens=60,
        extra_body={"structured_outputs": {"choice": ["Lisbon", "Porto"]}},
    )
    assert chat.choices[0].message.content in ("Lisbon", "Porto")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        (
            {"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}},
            "guided_json",
        ),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "'structured_outputs.regex'"),
        ({"structured_outputs": {"json": "{not json"}}, "'structured_outputs.json'"),
        (
            {"structured_outputs": {"json": "{not", "disable_additional_properties": True}},
            "'structured_outputs.json'",
        ),
        ({"structured_outputs": ["regex", "a"]}, "'structured_outputs' must be an object"),
        ({"structured_outputs": {}}, "'structured_outputs' needs one of"),
        ({"structured_outputs": {"disable_fallback": True}}, "'structured_outputs' needs one of"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "'structured_outputs.choice'"),
        ({"structured_outputs": {"json_object": False}}, "'structured_outputs.json_object'"),
        ({"structured_outputs": {"regex": "a", "backend": "x"}}, "'structured_outputs.backend'"),
        (
            {"structured_outputs": {"regex": "a", "disable_fallback": "yes"}},
            "'structured_outputs.disable_fallback' must be true or false",
        ),
        (
            {"structured_outputs": {"json_object": True, "whitespace_pattern": " ?"}},
            "'structured_outputs.whitespace_pattern' is not supported",
        ),
        ({"structured_outputs": {"structural_tag": "{}"}}, "'structured_outputs.structural_tag'"),
        ({"structured_outputs": {"regex": "a"}, "guided_regex": "a"}, "guided_regex"),
        (
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "'response_format' and 'structured_outputs.regex'",
        ),
        (
            {"response_format": {**FORMAT, "json_schema": {**FORMAT["json_schema"], "strict": 1}}},
            "response_format.json_schema.strict",
        ),
    ],
)
def test_constraints_that_cannot_compile_are_400(
    client: openai.OpenAI, server: RunningServer, extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model=server.model_name, prompt="x", max_tokens=5, extra_body=extra
        )
    assert field in str(caught.value)


def test_a_constraint_that_fails_mid_answer_is_an_error_not_a_stop(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """A regex built to explode runs the grammar out of the lexer's limits after a few tokens:
    the answer is an error naming the failed constraint (a 400 whole; streamed, an error
    event), never a finish_reason "stop" over output that does not match. Its pages go back."""
    extra = {"guided_regex": "(a{1000}){1000}"}
    before = server.wait_idle()
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model=server.model_name, prompt="x", max_tokens=20, extra_body=extra
        )
    assert "output constraint failed" in str(caught.value)
    stream = client.completions.create(
        model=server.model_name, prompt="x", max_tokens=20, extra_body=extra, stream=True
    )
    with pytest.raises(openai.APIError, match="output constraint failed"):
        for _ in stream:
            pass
    m = server.wait_idle()
    assert m["sv_kv_cache_pages_free"] == m["sv_kv_cache_pages_capacity"]
    # Both ran and finished "error": neither is also a request the server refused.
    failed, invalid = (
        'sv_requests_finished_total{finish_reason="error"}',
        ('sv_requests_rejected_total{reason="invalid"}'),
    )
    assert m[failed] - before[failed] == 2
    assert m[invalid] == before[invalid]


def test_min_tokens_with_a_constraint_is_a_400_naming_it(
    client: openai.OpenAI, server: RunningServer
) -> None:
    extra = {"guided_choice": ["yes", "no"], "min_tokens": 5}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model=server.model_name, prompt="x", max_tokens=8, extra_body=extra
        )
    assert caught.value.body["param"] == "min_tokens"  # type: ignore[index]


def test_disable_additional_properties_closes_object_schemas_only() -> None:
    """Every object schema is closed that does not say otherwise, through every keyword that
    holds schemas; values that merely look like schemas (const, enum, default, examples) and
    schemas that set additionalProperties keep theirs. Hand-written expectation."""
    from sv_server.structured import _closed_objects

    point = {"type": "object", "properties": {"x": {"type": "number"}}}
    shaped = {"type": "object", "properties": {"type": {"const": {"type": "object"}}}}
    schema = {
        "type": ["object", "null"],
        "properties": {
            "p": {"$ref": "#/$defs/point"},
            "open": {"type": "object", "additionalProperties": True},
            "list": {"type": "array", "items": point, "default": [{"type": "object"}]},
            "tuple": {"type": "array", "prefixItems": [point], "items": [point]},
            "either": {"anyOf": [point, {"type": "string"}], "enum": [{"type": "object"}]},
            "shaped": shaped,
        },
        "$defs": {"point": point},
        "not": {"properties": {"y": {}}},
    }
    closed_point = point | {"additionalProperties": False}
    assert _closed_objects(schema) == {
        "type": ["object", "null"],
        "properties": {
            "p": {"$ref": "#/$defs/point"},
            "open": {"type": "object", "additionalProperties": True},
            "list": {"type": "array", "items": closed_point, "default": [{"type": "object"}]},
            "tuple": {"type": "array", "prefixItems": [closed_point], "items": [closed_point]},
            "either": {
                "anyOf": [closed_point, {"type": "string"}],
                "enum": [{"type": "object"}],
            },
            "shaped": shaped | {"additionalProperties": False},
        },
        "$defs": {"point": closed_point},
        "not": {"properties": {"y": {}}, "additionalProperties": False},
        "additionalProperties": False,
    }
    assert "additionalProperties" not in point  # the caller's schema is not changed
