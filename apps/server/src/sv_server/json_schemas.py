"""Walking a JSON schema: every schema inside one, never the JSON data some keywords hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Keywords whose values are JSON data, not schemas (a "$ref" or a "type" there is only a
# value); and those whose values map names (a property's may be "const") to schemas.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_NAMED_SCHEMAS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def each_schema(schema: Any, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """A copy of `schema` with `change` applied to every schema object in it, the innermost
    first and `schema` itself last; the caller's schema is not changed."""
    if isinstance(schema, list):
        return [each_schema(item, change) for item in schema]
    if not isinstance(schema, dict):
        return schema
    walked: dict[str, Any] = {}
    for name, value in schema.items():
        if name in _DATA_KEYWORDS:
            walked[name] = value
        elif name in _NAMED_SCHEMAS and isinstance(value, dict):
            walked[name] = {key: each_schema(inner, change) for key, inner in value.items()}
        else:
            walked[name] = each_schema(value, change)
    return change(walked)
