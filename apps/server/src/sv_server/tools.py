"""Tool calls on /v1/chat/completions, in Llama 3.x's JSON tool-call format.

In: `tools` (OpenAI's function definitions) and `tool_choice`: "auto" (the default with tools:
the model may call one), "none" (it may not: its text is never parsed as a call), "required"
(it must call one) or `{"type": "function", "function": {"name": N}}` (it must call N). The
tools reach the model through its chat format (a folder's own template, or the built-in Llama 3
format, sv_tokenizer/tool_format.py). A required or named call is constrained by a grammar
(the JSON schema of `{"name": ..., "parameters": ...}` over the allowed functions), so it
always parses and its arguments match the function's parameter schema.

Out: an answer that is one JSON object `{"name": N, "parameters": {...}}` (optionally after
`<|python_tag|>`) naming an offered function becomes `message.tool_calls` with
`finish_reason: "tool_calls"`; anything else stays `content`. Streamed, text that starts like
a call is held back until the answer ends, then sent as OpenAI's tool-call deltas (the call's
id, type and name first, then its arguments); other text streams as usual.

With `n` > 1 each choice is read on its own (one `ToolCallStream` each, its deltas under its
choice index). With `logprobs` a choice that became a call still reports the log-probabilities
of the tokens it generated, as `logprobs.content` (the raw call text's tokens): whole, or, when
streamed, on the first delta sent after they were held back.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sv_engine import EngineError
from sv_engine.grammar import Grammar
from sv_tokenizer import ToolCall

from sv_server.body import JsonTextError, json_value
from sv_server.errors import bad_request

TOOL_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolRequest:
    """The tools of a chat request, checked. `choice`: "auto", "none", "required" or the name
    of the one function the model must call."""

    tools: list[dict[str, Any]]
    choice: str

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def parses(self) -> bool:
        """Whether the answer is read for a tool call."""
        return self.choice != "none"

    def grammar(self) -> Grammar | None:
        """The constraint of a required or named call; None for auto and none."""
        if self.choice in ("auto", "none"):
            return None
        chosen = [t for t in self.tools if self.choice in ("required", t["function"]["name"])]
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t["function"]["name"]},
                    "parameters": t["function"].get("parameters") or {"type": "object"},
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for t in chosen
        ]
        grammar = Grammar.json_schema(calls[0] if len(calls) == 1 else {"anyOf": calls})
        try:
            grammar.compile()
        except EngineError as e:
            raise bad_request(f"'tools': a function's parameters: {e}", param="tools") from None
        return grammar


def parse_tools(body: Mapping[str, Any]) -> ToolRequest | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    if tools is None:
        if choice not in (None, "none"):
            raise bad_request("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    if not isinstance(tools, list) or not tools or len(tools) > MAX_TOOLS:
        raise bad_request(f"'tools' must be a list of 1 to {MAX_TOOLS} functions", "tools")
    checked = [_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise bad_request("'tools' names a function twice", param="tools")
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        function = choice.get("function")
        if (
            choice.get("type") != "function"
            or not isinstance(function, dict)
            or function.get("name") not in names
        ):
            raise bad_request(
                "'tool_choice' must be 'auto', 'none', 'required' or "
                "{'type': 'function', 'function': {'name': one of the tools}}",
                param="tool_choice",
            )
        choice = function["name"]
    elif choice not in ("auto", "none", "required"):
        raise bad_request(
            f"'tool_choice' must be 'auto', 'none', 'required' or a function, got {choice!r}",
            param="tool_choice",
        )
    return ToolRequest(checked, choice)


def _tool(item: Any, index: int) -> dict[str, Any]:
    param = f"tools[{index}]"
    if (
        not isinstance(item, dict)
        or item.get("type") != "function"
        or set(item)
        != {
            "type",
            "function",
        }
    ):
        raise bad_request(f"{param} must be {{'type': 'function', 'function': {{...}}}}", "tools")
    function = item["function"]
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request(f"{param}.function must be an object with a 'name'", "tools")
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise bad_request(f"unknown field '{param}.function.{sorted(unknown)[0]}'", "tools")
    if not _NAME.fullmatch(function["name"]):
        raise bad_request(
            f"{param}.function.name must be 1-64 letters, digits, '_' or '-'", "tools"
        )
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise bad_request(f"{param}.function.description must be a string", "tools")
    if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
        raise bad_request(f"{param}.function.parameters must be a JSON schema object", "tools")
    return {"type": "function", "function": dict(function)}


def parse_tool_call(text: str, names: list[str]) -> ToolCall | None:
    """The model's answer as a call of one of `names`, or None when it is not one."""
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].strip()
    try:
        value = json_value(body)
    except JsonTextError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("parameters", value.get("arguments", {}))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False), new_call_id())


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def tool_calls_body(call: ToolCall) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    ]


def delta_chunk(
    response_id: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    *,
    index: int,
    logprobs: dict[str, Any] | None,
) -> dict[str, Any]:
    """A chat stream chunk of choice `index` carrying `delta` (content or tool-call deltas)
    and the log-probabilities of the tokens it is the first to show, if asked for."""
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def apply_to_response(body: dict[str, Any], tools: ToolRequest) -> None:
    """A whole chat answer: its message becomes a tool call when the text is one. Only the
    content is read (with a reasoning parser, a call written in the thinking is no call); the
    message's `reasoning_content`, if any, stays."""
    if not tools.parses:
        return
    for choice in body["choices"]:
        message = choice["message"]
        content = message["content"]
        call = parse_tool_call(content, tools.names) if content is not None else None
        if call is not None:
            message["content"] = None
            message["tool_calls"] = tool_calls_body(call)
            choice["finish_reason"] = "tool_calls"


class ToolCallStream:
    """One streamed answer's text turned into chat deltas: text that may be a call is held
    back until the end (`finish`), any other text passes through as content."""

    def __init__(self, tools: ToolRequest) -> None:
        self._names = tools.names
        self._held = ""
        self._holding: bool | None = None  # None until the first non-space character
        self.call: ToolCall | None = None  # the answer's call, once `finish` found one

    @property
    def called(self) -> bool:
        return self.call is not None

    def push(self, text: str) -> list[dict[str, Any]]:
        if self._holding is False:
            return [{"content": text}]
        self._held += text
        start = self._held.lstrip()
        if not start:
            return []
        if self._holding is None:
            self._holding = start[0] in "{<"
        if self._holding:
            return []
        held, self._held = self._held, ""
        return [{"content": held}]

    def finish(self) -> list[dict[str, Any]]:
        """The deltas of the held text, once the answer has ended."""
        held, self._held = self._held, ""
        if not held:
            return []
        call = parse_tool_call(held, self._names) if self._holding else None
        if call is None:
            return [{"content": held}]
        self.call = call
        head = tool_calls_body(call)[0]
        head["function"] = {"name": call.name, "arguments": ""}
        return [
            {"tool_calls": [{"index": 0, **head}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": call.arguments}}]},
        ]
