"""Structured output on the wire: OpenAI's `response_format` and vLLM's `guided_*` fields.

    response_format {"type": "text"}                               no constraint
    response_format {"type": "json_object"}                        any JSON object
    response_format {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}
    guided_json     a JSON schema (an object, or its JSON text)
    guided_regex    a regular expression the whole output matches
    guided_choice   a list of strings, the output is one of them
    guided_grammar  an EBNF (GBNF) or Lark grammar

At most one of them per request. Each is compiled here, on a tokenizer thread, so that a
schema, regex or grammar the library cannot compile is a 400 naming the problem before the
request reaches the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sv_engine import EngineError
from sv_engine.grammar import Grammar

from sv_server.body import JsonTextError, json_value
from sv_server.errors import bad_request

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
STRUCTURED_FIELDS = frozenset({"response_format", *GUIDED_FIELDS})


def parse_grammar(body: Mapping[str, Any]) -> Grammar | None:
    """The request's output constraint, compiled and checked; None when it has none."""
    given = [(key, body[key]) for key in GUIDED_FIELDS if body.get(key) is not None]
    response_format = body.get("response_format")
    if response_format is not None:
        grammar = _response_format(response_format)
        if grammar is not None:
            given.insert(0, ("response_format", grammar))
    if not given:
        return None
    if len(given) > 1:
        names = " and ".join(f"'{key}'" for key, _ in given)
        raise bad_request(f"give one output constraint, not {names}", param=given[1][0])
    key, value = given[0]
    try:
        grammar = value if isinstance(value, Grammar) else _guided(key, value)
        grammar.compile()
    except EngineError as e:
        raise bad_request(f"'{key}': {e}", param=key) from None
    return grammar


def _response_format(value: Any) -> Grammar | None:
    param = "response_format"
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad_request("'response_format' must be an object with a 'type'", param)
    kind = value["type"]
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if kind not in allowed:
        raise bad_request(
            f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
            param,
        )
    unknown = set(value) - allowed[kind]
    if unknown:
        raise bad_request(f"unknown field 'response_format.{sorted(unknown)[0]}'", param)
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise bad_request(
            "'response_format.json_schema' must be an object with a 'name' and a 'schema'", param
        )
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise bad_request(
            f"unknown field 'response_format.json_schema.{sorted(unknown)[0]}'", param
        )
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        # (The output is held to the schema either way, as vLLM's is: OpenAI's strict false
        # only allows the model to stray.)
        raise bad_request("'response_format.json_schema.strict' must be true or false", param)
    schema = spec.get("schema")
    if schema is None:  # OpenAI's default: any JSON object
        return Grammar.json_object()
    try:
        return Grammar.json_schema(schema)
    except EngineError as e:
        raise bad_request(f"'response_format.json_schema.schema': {e}", param) from None


def _guided(key: str, value: Any) -> Grammar:
    if key == "guided_json":
        if isinstance(value, str):  # vLLM takes the schema as JSON text too
            try:
                value = json_value(value)
            except JsonTextError as e:
                raise EngineError(f"the schema's text {e}") from None
        return Grammar.json_schema(value)
    if key == "guided_regex":
        return Grammar.regex(value)
    if key == "guided_choice":
        if not isinstance(value, list):
            raise EngineError("a choice needs a non-empty list of strings")
        return Grammar.choice(value)
    return Grammar.ebnf(value)
