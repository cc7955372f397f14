"""Structured output on the wire: OpenAI's `response_format` and vLLM's `structured_outputs`
(and the `guided_*` fields it replaced).

    response_format {"type": "text"}                               no constraint
    response_format {"type": "json_object"}                        any JSON object
    response_format {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}
    structured_outputs {"json": ...}        a JSON schema (an object, or its JSON text)
    structured_outputs {"regex": ...}       a regular expression the whole output matches
    structured_outputs {"choice": [...]}    a list of strings, the output is one of them
    structured_outputs {"grammar": ...}     an EBNF (GBNF) or Lark grammar
    structured_outputs {"json_object": true}                       any JSON object
    guided_json, guided_regex, guided_choice, guided_grammar        the same four, as vLLM
                                                                    before 0.12 took them

At most one of them per request. `structured_outputs` also takes vLLM's options:
`disable_additional_properties` (true: every object schema in `json` that does not say
otherwise allows only its listed properties), `disable_any_whitespace` and `disable_fallback`
(accepted either way: sv's JSON never has free whitespace between tokens, and there is one
grammar library, so nothing to fall back to); `whitespace_pattern` and `structural_tag` are
a 400. Each constraint is compiled here, on a tokenizer thread, so that a schema, regex or
grammar the library cannot compile is a 400 naming the problem before the request reaches the
engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sv_engine import EngineError
from sv_engine.grammar import Grammar

from sv_server.body import JsonTextError, json_value
from sv_server.errors import bad_request
from sv_server.fields import optional_bool
from sv_server.json_schemas import each_schema

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
STRUCTURED_FIELDS = frozenset({"response_format", "structured_outputs", *GUIDED_FIELDS})
_KINDS = ("json", "regex", "choice", "grammar")  # guided_<kind>, structured_outputs.<kind>
_OPTIONS = frozenset(
    {
        "json_object",
        "disable_additional_properties",
        "disable_any_whitespace",
        "disable_fallback",
        "whitespace_pattern",
        "structural_tag",
    }
)


def parse_grammar(body: Mapping[str, Any]) -> Grammar | None:
    """The request's output constraint, compiled and checked; None when it has none."""
    # (name in messages, the 400's param, a Grammar or what _guided builds one of)
    given: list[tuple[str, str, Any]] = [
        (key, key, body[key]) for key in GUIDED_FIELDS if body.get(key) is not None
    ]
    if body.get("structured_outputs") is not None:
        given.insert(0, _structured_outputs(body["structured_outputs"]))
    response_format = body.get("response_format")
    if response_format is not None:
        grammar = _response_format(response_format)
        if grammar is not None:
            given.insert(0, ("response_format", "response_format", grammar))
    if not given:
        return None
    if len(given) > 1:
        names = " and ".join(f"'{name}'" for name, _, _ in given)
        raise bad_request(f"give one output constraint, not {names}", param=given[1][1])
    name, param, value = given[0]
    try:
        # "guided_json" and "structured_outputs.json" are both a "json"
        kind = name.rsplit(".", 1)[-1].removeprefix("guided_")
        grammar = value if isinstance(value, Grammar) else _guided(kind, value)
        grammar.compile()
    except EngineError as e:
        raise bad_request(f"'{name}': {e}", param=param) from None
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


def _structured_outputs(value: Any) -> tuple[str, str, Any]:
    """vLLM's `structured_outputs` object: its one constraint, as parse_grammar's `given`."""
    param = "structured_outputs"
    kinds = " ".join(f"'{kind}'," for kind in _KINDS) + " or 'json_object'"
    if not isinstance(value, dict):
        raise bad_request(f"'structured_outputs' must be an object with one of {kinds}", param)
    unknown = set(value) - set(_KINDS) - _OPTIONS
    if unknown:
        raise bad_request(f"unknown field 'structured_outputs.{sorted(unknown)[0]}'", param)
    for option in ("disable_additional_properties", "disable_any_whitespace", "disable_fallback"):
        optional_bool(value, option, within=param)
    for option, why in (
        ("whitespace_pattern", "JSON output here never has free whitespace between tokens"),
        ("structural_tag", "give the tag's schema as 'json' instead"),
    ):
        if value.get(option) is not None:
            raise bad_request(f"'structured_outputs.{option}' is not supported: {why}", param)
    if value.get("json_object") not in (None, True):
        raise bad_request(
            "'structured_outputs.json_object' must be true (leave it out for no constraint)", param
        )
    given = [kind for kind in (*_KINDS, "json_object") if value.get(kind) is not None]
    if not given:
        raise bad_request(f"'structured_outputs' needs one of {kinds}", param)
    if len(given) > 1:
        names = " and ".join(f"'structured_outputs.{kind}'" for kind in given)
        raise bad_request(f"give one output constraint, not {names}", param)
    kind = given[0]
    if kind == "json_object":
        return f"{param}.json_object", param, Grammar.json_object()
    constraint = value[kind]
    if kind == "json" and value.get("disable_additional_properties"):
        try:
            constraint = _closed_objects(_schema(constraint))
        except EngineError as e:
            raise bad_request(f"'structured_outputs.json': {e}", param) from None
    return f"{param}.{kind}", param, constraint


def _guided(kind: str, value: Any) -> Grammar:
    if kind == "json":
        return Grammar.json_schema(_schema(value))
    if kind == "regex":
        return Grammar.regex(value)
    if kind == "choice":
        if not isinstance(value, list):
            raise EngineError("a choice needs a non-empty list of strings")
        return Grammar.choice(value)
    return Grammar.ebnf(value)


def _schema(value: Any) -> Any:
    """A JSON schema given as an object, or (as vLLM takes it too) as its JSON text."""
    if not isinstance(value, str):
        return value
    try:
        return json_value(value)
    except JsonTextError as e:
        raise EngineError(f"the schema's text {e}") from None


def _closed_objects(schema: Any) -> Any:
    """`schema` with `"additionalProperties": false` in every object schema that does not set
    it (vLLM's disable_additional_properties), never inside a `const`, `enum` or `default`
    value that looks like a schema (`each_schema`)."""

    def close(node: dict[str, Any]) -> dict[str, Any]:
        kind = node.get("type")
        is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
        if (is_object or "properties" in node) and "additionalProperties" not in node:
            return node | {"additionalProperties": False}
        return node

    return each_schema(schema, close)
