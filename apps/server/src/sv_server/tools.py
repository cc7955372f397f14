"""Tool calls on /v1/chat/completions (and /v1/responses), in the model's own call format.

In: `tools` (OpenAI's function definitions), `tool_choice`: "auto" (the default with tools:
the model may call), "none" (it may not: its text is never parsed as a call), "required"
(it must call) or `{"type": "function", "function": {"name": N}}` (it must call N), and
`parallel_tool_calls` (false: at most one call). The tools reach the model through its chat
format (a folder's own template, or the built-in Llama 3 format, sv_tokenizer/tool_format.py).
A required or named call is constrained by a grammar in the server's call format
(tool_parsers.py), so it always parses and its arguments match the function's parameter schema.

Out: an answer that holds calls of offered functions (tool_parsers.py says how each format is
read) becomes `message.tool_calls`, and `message.content` the text before the calls (hermes) or
null; anything else stays `content`. The finish_reason is then "tool_calls" for auto and
required, and stays "stop" for a named call, as OpenAI's and vLLM's are. A required or named
call cut short (finish_reason "length") is neither a call nor content: its text is the call's
syntax, not the model's prose, so the message has no content and no calls. With
`parallel_tool_calls: false` only an answer's first call is taken. Streamed, text that may be
calls is held back until the answer ends, then sent as OpenAI's tool-call deltas (each call's
id, type and name first, then its arguments, under its index); other text streams as usual.

With `n` > 1 each choice is read on its own (one `ToolCallStream` each, its deltas under its
choice index). With `logprobs` a choice that became a call still reports the log-probabilities
of the tokens it generated, as `logprobs.content` (the raw call text's tokens): whole, or, when
streamed, on the first delta sent after they were held back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sv_engine import EngineError
from sv_engine.grammar import Grammar
from sv_tokenizer import ToolCall

from sv_server.errors import bad_request
from sv_server.fields import shown_value
from sv_server.tool_parsers import (
    AnswerSplit,
    ToolAnswer,
    ToolCallParser,
    call_grammar,
    parse_answer,
)

TOOL_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


@dataclass(frozen=True)
class ToolRequest:
    """The tools of a chat request, checked. `choice`: "auto", "none", "required" or the name
    of the one function the model must call; `parallel`: whether an answer may hold more
    than one call; `parser`: the server's call format."""

    tools: list[dict[str, Any]]
    choice: str
    parallel: bool = True
    parser: ToolCallParser = "llama3_json"

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
        chosen = [
            t["function"] for t in self.tools if self.choice in ("required", t["function"]["name"])
        ]
        # A named choice is one call of that function (vLLM's rule); required, one or more
        # unless parallel calls are off.
        parallel = self.parallel and self.choice == "required"
        try:
            grammar = call_grammar(self.parser, chosen, parallel)
            grammar.compile()
        except EngineError as e:
            raise bad_request(f"'tools': a function's parameters: {e}", param="tools") from None
        return grammar

    def parse(self, text: str) -> ToolAnswer | None:
        """A whole answer's calls, or None when it holds none (it is all content). A required
        or named call that does not parse (cut short) is an answer of no content, no calls."""
        if not self.parses:
            return None
        answer = parse_answer(self.parser, text, self.names)
        if answer is None:
            return None if self.choice == "auto" else ToolAnswer(None, ())
        if self.parallel or len(answer.calls) == 1:
            return answer
        return ToolAnswer(answer.content, answer.calls[:1])

    def finish_reason(self, answer: ToolAnswer | None, reason: str | None) -> str | None:
        """A choice's finish_reason, given its parsed answer and the engine's reason: calls
        finish with "tool_calls" unless the call was named (OpenAI's rule)."""
        called = answer is not None and bool(answer.calls)
        return "tool_calls" if called and self.choice in ("auto", "required") else reason


def parse_tools(
    body: Mapping[str, Any], parser: ToolCallParser = "llama3_json"
) -> ToolRequest | None:
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
        named = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") == "function" and isinstance(named, str) and named not in names:
            raise bad_request(
                f"'tool_choice' names the function {shown_value(named)}, which 'tools' does not "
                f"offer (it offers {', '.join(map(repr, names))})",
                param="tool_choice",
            )
        if choice.get("type") != "function" or not isinstance(named, str):
            raise bad_request(
                "'tool_choice' must be 'auto', 'none', 'required' or "
                "{'type': 'function', 'function': {'name': one of the tools}}",
                param="tool_choice",
            )
        choice = named
    elif choice not in ("auto", "none", "required"):
        raise bad_request(
            f"'tool_choice' must be 'auto', 'none', 'required' or a function, got {choice!r}",
            param="tool_choice",
        )
    return ToolRequest(checked, choice, parallel is not False, parser)


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


def tool_calls_body(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in calls
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
    """A whole chat answer: its message gets tool calls when its text holds them. Only the
    content is read (with a reasoning parser, a call written in the thinking is no call); the
    message's `reasoning_content`, if any, stays."""
    for choice in body["choices"]:
        message = choice["message"]
        content = message["content"]
        answer = tools.parse(content) if content is not None else None
        if answer is not None:
            message["content"] = answer.content
            if answer.calls:
                message["tool_calls"] = tool_calls_body(answer.calls)
            choice["finish_reason"] = tools.finish_reason(answer, choice["finish_reason"])


class ToolCallStream:
    """One streamed answer's text turned into chat deltas: text that may be calls is held
    back until the end (`finish`), any other text passes through as content."""

    def __init__(self, tools: ToolRequest) -> None:
        self._tools = tools
        self._split = AnswerSplit(tools.parser)
        self.answer: ToolAnswer | None = None  # the answer's calls, once `finish` found them

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return () if self.answer is None else self.answer.calls

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def held(self) -> str:
        """The text held back so far, the end of what was pushed: it may be calls."""
        return self._split.held

    def finish_reason(self, reason: str | None) -> str | None:
        """The choice's finish_reason, given the engine's (see ToolRequest.finish_reason)."""
        return self._tools.finish_reason(self.answer, reason)

    def push(self, text: str) -> list[dict[str, Any]]:
        content = self._split.push(text)
        return [{"content": content}] if content else []

    def finish(self) -> list[dict[str, Any]]:
        """The deltas of the held text, once the answer has ended."""
        held, self._split.held = self._split.held, ""
        if not held:
            return []
        answer = self._tools.parse(held)
        if answer is None:
            return [{"content": held}]
        self.answer = answer
        # (content before the calls went out before they were held: no content delta here)
        deltas: list[dict[str, Any]] = []
        for index, head in enumerate(tool_calls_body(answer.calls)):
            arguments = head["function"]["arguments"]
            head["function"] = {"name": head["function"]["name"], "arguments": ""}
            deltas.append({"tool_calls": [{"index": index, **head}]})
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})
        return deltas
