"""How a model writes its tool calls (vLLM's `--tool-call-parser`), read back out of its answer.

Two formats, chosen per server (`sv serve --tool-call-parser`, by default from the tokenizer:
`default_parser`):

- `llama3_json` (Llama 3.x): the whole answer is one JSON object `{"name": N, "parameters":
  {...}}` ("arguments" is read too), optionally after `<|python_tag|>`. One call a turn; an
  answer with any other text is content.
- `hermes` (Qwen2.5, Qwen3, Hermes and the other templates that write `<tool_call>` tags): the
  answer is optional content, then one or more calls, each `<tool_call>` + a JSON object
  `{"name": N, "arguments": {...}}` + `</tool_call>`, with only whitespace between and after
  them (the last one's closing tag may be missing: a stop string or the end of the answer took
  it). The content is the text before the first `<tool_call>`, or null when that is only
  whitespace. Any other text after a call, or a call that does not parse or names no offered
  function, makes the whole answer content: no text is ever dropped. (vLLM's hermes parser
  drops text after the calls.)

`parse_answer` reads a whole answer; `AnswerSplit` holds back, while an answer streams, the
text that may still turn out to be calls (and only that), so the streamed pieces add up to
what `parse_answer` gives the whole text. `call_grammar` is the constraint of a required or
named call, written in the format (so it always parses).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sv_engine import EngineError
from sv_engine.grammar import Grammar
from sv_tokenizer import Tokenizer, ToolCall

from sv_server.body import JsonTextError, json_value, json_value_at
from sv_server.json_schemas import each_schema

ToolCallParser = Literal["llama3_json", "hermes"]
TOOL_CALL_PARSERS: tuple[ToolCallParser, ...] = ("llama3_json", "hermes")
_PYTHON_TAG = "<|python_tag|>"
HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
# A hermes call's JSON as the Qwen and Hermes templates write it: json.dumps's separators.
_HERMES_JSON = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


@dataclass(frozen=True)
class ToolAnswer:
    """An answer that holds tool calls: the content before them (hermes only; None when there
    is none) and the calls, in order."""

    content: str | None
    calls: tuple[ToolCall, ...]


def default_parser(tokenizer: Tokenizer) -> ToolCallParser:
    """hermes for a tokenizer that has `<tool_call>` and `</tool_call>` as tokens of their own
    (the templates that use them write hermes calls), else llama3_json."""
    own = all(
        tag in tokenizer.special_tokens or len(tokenizer.encode(tag)) == 1
        for tag in (HERMES_START, HERMES_END)
    )
    return "hermes" if own else "llama3_json"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_answer(parser: ToolCallParser, text: str, names: Sequence[str]) -> ToolAnswer | None:
    """`text`, a whole answer, as calls of `names` in `parser`'s format; None when it is not
    one (it is then all content)."""
    if parser == "llama3_json":
        body = text.strip()
        if body.startswith(_PYTHON_TAG):
            body = body[len(_PYTHON_TAG) :].strip()
        try:
            value = json_value(body)
        except JsonTextError:
            return None
        call = _call(value, names, ("parameters", "arguments"))
        return None if call is None else ToolAnswer(None, (call,))
    start = text.find(HERMES_START)
    if start < 0:
        return None
    calls = []
    at = start
    while at < len(text):
        if not text.startswith(HERMES_START, at):
            return None  # text between or after the calls
        # The call's JSON is read as a value inside the text, so a "</tool_call>" inside one
        # of its strings does not end it.
        try:
            value, at = json_value_at(text, _skip_space(text, at + len(HERMES_START)))
        except JsonTextError:
            return None
        call = _call(value, names, ("arguments",))
        if call is None:
            return None
        calls.append(call)
        at = _skip_space(text, at)
        if text.startswith(HERMES_END, at):
            at = _skip_space(text, at + len(HERMES_END))
        elif at < len(text):
            return None  # (only the last call may lack its closing tag)
    content = text[:start]
    return ToolAnswer(content if content.strip() else None, tuple(calls))


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _call(value: Any, names: Sequence[str], argument_keys: Sequence[str]) -> ToolCall | None:
    """A call's JSON object `{"name": ..., <argument key>: {...}}` as a call, or None."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments: Any = next((value[k] for k in argument_keys if k in value), {})
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False), new_call_id())


class AnswerSplit:
    """A streamed answer's text, split as it comes into content to send now and text held
    back because it may be tool calls; `held` is what is held when the answer ends."""

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self.held = ""
        self._holding = False  # all that follows is held: the calls may have started
        self._passing = False  # the answer is known to be content: nothing more is held
        self._sent = False  # some content went out already
        self._call_opened = False  # hermes: a "{" followed the first tag (checked once)

    def push(self, text: str) -> str:
        """The content of `text` (with what was held before it) that can go out now."""
        self.held += text
        if self._passing:
            return self._send(len(self.held))
        if self._holding:
            if self._parser == "hermes" and not self._call_opened and self._not_a_call():
                # The first tag starts no call, so the whole answer is content (parse_answer's
                # rule): what is held goes now.
                self._holding, self._passing = False, True
                return self._send(len(self.held))
            return ""
        if self._parser == "llama3_json":
            # The answer is a call only if it is one JSON object: decided by its first
            # non-space character.
            start = self.held.lstrip()
            if not start:
                return ""
            self._holding = start[0] in "{<"
            self._passing = not self._holding
            return "" if self._holding else self._send(len(self.held))
        tag = self.held.find(HERMES_START)
        if tag >= 0:
            self._holding = True
            # Content before the calls goes now, unless it is all whitespace and nothing
            # went before it: that is no content if the calls parse, so it waits with them.
            return self._send(tag) if self._sent or self.held[:tag].strip() else ""
        # Send all but a tail that may be the start of the tag; leading whitespace waits for
        # the first other character.
        keep = _tag_prefix_length(self.held)
        if not self._sent and not self.held[: len(self.held) - keep].strip():
            return ""
        return self._send(len(self.held) - keep)

    def _not_a_call(self) -> bool:
        """Whether what follows the first `<tool_call>` is known not to be a call's JSON
        object: its first other character is not "{" (prose that names the tag)."""
        after = self.held.find(HERMES_START) + len(HERMES_START)
        body = self.held[after:].lstrip()
        self._call_opened = body.startswith("{")
        return bool(body) and not self._call_opened

    def _send(self, length: int) -> str:
        sent, self.held = self.held[:length], self.held[length:]
        self._sent = self._sent or bool(sent)
        return sent


def _tag_prefix_length(text: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `<tool_call>`."""
    for length in range(min(len(text), len(HERMES_START) - 1), 0, -1):
        if HERMES_START.startswith(text[-length:]):
            return length
    return 0


def call_grammar(
    parser: ToolCallParser, functions: Sequence[dict[str, Any]], parallel: bool
) -> Grammar:
    """The constraint of an answer that must call one of `functions` (OpenAI function
    definitions): with `parallel` and hermes, one or more calls. Arguments are always a JSON
    object (a schema without `"type": "object"` would let `5` or `null` through, which is no
    call), and each schema's `$defs` move to the root, where its `#/$defs/...` refs point.
    Its other local refs ("#", "#/properties/...") are rebased onto where its parameters sit
    in the call object: left as they are, they would point at the call itself."""
    key = "parameters" if parser == "llama3_json" else "arguments"
    definitions: dict[str, dict[str, Any]] = {"$defs": {}, "definitions": {}}
    calls = []
    for i, function in enumerate(functions):
        at = f"#/properties/{key}" if len(functions) == 1 else f"#/anyOf/{i}/properties/{key}"
        arguments = _rebased_refs(dict(function.get("parameters") or {}), at)
        for where, found in definitions.items():
            given = arguments.pop(where, None) or {}
            if not isinstance(given, dict):
                raise EngineError(f"{function['name']}'s {where} must be an object")
            for name, definition in given.items():
                if found.setdefault(name, definition) != definition:
                    raise EngineError(
                        f"two functions define {where} {name!r} differently: their "
                        "parameter schemas share one grammar, so give the definitions "
                        "different names"
                    )
        calls.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": function["name"]},
                    key: {**arguments, "type": "object"},
                },
                "required": ["name", key],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema.update({where: found for where, found in definitions.items() if found})
    if parser == "llama3_json":
        return Grammar.json_schema(schema)
    body = json.dumps({**schema, "x-guidance": _HERMES_JSON})
    more = ' ("\\n" call)*' if parallel else ""
    start, end = json.dumps(HERMES_START + "\n"), json.dumps("\n" + HERMES_END)
    return Grammar.ebnf(f"start: call{more}\ncall: {start} body {end}\nbody: %json {body}\n")


def _rebased_refs(schema: Any, at: str) -> Any:
    """`schema` with each local `$ref` but those into its `$defs`/`definitions` (which
    `call_grammar` moves to the root) made relative to `at`, the pointer of the schema's root."""

    def rebase(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            return node
        if ref[1:].startswith(("/$defs/", "/definitions/")):
            return node
        return node | {"$ref": at + ref[1:]}

    return each_schema(schema, rebase)
