"""Llama 3.x's JSON tool calls, as plain messages for the built-in Llama 3 chat format.

Meta's Llama 3.2 chat template (the HF folder's tokenizer_config.json, which TemplateChatFormat
renders itself) writes a conversation with tools this way, and this module writes the same text
when a folder has no template:

- the tool definitions go into the first user message, after a fixed instruction, each as
  indented JSON;
- an assistant turn that called a tool is `{"name": NAME, "parameters": ARGUMENTS}`;
- a tool's result is an `ipython` turn (Llama3ChatFormat writes role "tool" as "ipython"),
  its content as a JSON string (the template's `content | tojson`: a string is "iterable" to
  Jinja), so quoted and escaped, not trimmed.

JSON is written as the template's `tojson` writes it: `json.dumps` with non-ASCII as it is,
and the call's arguments decoded and written again (`{"city": "Lisbon"}` whatever spacing the
client sent).

Everything here becomes message content, which the chat formats encode as plain text: a tool
definition or argument that spells a special token cannot forge one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .errors import TokenizerError
from .messages import Message, ToolCall

LLAMA3_TOOL_INSTRUCTION = (
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name '
    "and its value}.Do not use variables.\n\n"
)


def tool_call_text(call: ToolCall) -> str:
    """An assistant's tool call as Llama 3.x writes it (and as the model is asked to)."""
    return '{"name": "' + call.name + '", "parameters": ' + _tojson(call.decoded_arguments) + "}"


def _tojson(value: Any, indent: int | None = None) -> str:
    """JSON as the HF templates' `tojson` filter writes it."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


# A tool's result: OpenAI's role "tool", or Llama's own name for it, "ipython"; Meta's template
# writes either's content as a JSON string (`content | tojson`).
TOOL_RESULT_ROLES = ("tool", "ipython")


def with_llama3_tools(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None
) -> list[Message]:
    """The conversation with its tools and tool calls written into the message contents."""
    out = []
    for index, message in enumerate(messages):
        if message.tool_calls:
            if message.role != "assistant":
                raise TokenizerError(f"chat message {index}: only an assistant calls tools")
            if len(message.tool_calls) != 1:
                raise TokenizerError(
                    f"chat message {index}: Llama 3 makes one tool call per turn, "
                    f"got {len(message.tool_calls)}"
                )
            message = replace(message, content=tool_call_text(message.tool_calls[0]))
        elif message.role in TOOL_RESULT_ROLES:
            message = replace(message, content=_tojson(message.content))
        out.append(message)
    if tools:
        first = next((i for i, m in enumerate(out) if m.role != "system"), None)
        if first is None or out[first].role != "user":
            raise TokenizerError(
                "tools go into the first user message: the conversation must start with one "
                "(after any system message)"
            )
        definitions = "".join(_tojson(tool, indent=4) + "\n\n" for tool in tools)
        user = out[first]
        out[first] = replace(
            user, content=LLAMA3_TOOL_INSTRUCTION + definitions + user.content.strip()
        )
    return out
