"""A conversation as the chat formats take it: its turns (`Message`), an assistant's tool calls
(`ToolCall`) and the tool definitions a request offers (`Tools`), each checked once, here."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import TokenizerError


@dataclass(frozen=True)
class ToolCall:
    """A function call an assistant made: its name and its arguments as JSON object text (as
    OpenAI sends them), and the id a later tool message answers."""

    name: str
    arguments: str
    id: str | None = None
    # The arguments' JSON decoded, once: the object a template is handed (`arguments | tojson`).
    decoded_arguments: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Checked here, as a Message's fields are, not as a TypeError inside a format later.
        for field_name, value in (("name", self.name), ("arguments", self.arguments)):
            if not isinstance(value, str):
                raise TokenizerError(f"a tool call's {field_name} must be a str, got {value!r}")
        if self.id is not None and not isinstance(self.id, str):
            raise TokenizerError(f"a tool call's id must be a str or None, got {self.id!r}")
        try:
            decoded = json.loads(self.arguments)
        except (TypeError, ValueError, RecursionError):
            raise TokenizerError(
                f"tool call {self.name!r}: arguments {str(self.arguments)[:40]!r} are not JSON"
            ) from None
        object.__setattr__(self, "decoded_arguments", decoded)


Tools = Sequence[Mapping[str, Any]]  # OpenAI's tool definitions: {"type": "function", ...}


def check_tools(value: object) -> None:
    """`tools` as given: None, or a list (or tuple) of tool definitions, each a JSON object;
    else a TokenizerError naming the argument, not an AttributeError inside a format."""
    if value is None:
        return
    if not isinstance(value, list | tuple) or not all(isinstance(t, Mapping) for t in value):
        raise TokenizerError(
            f"tools must be a list of tool definitions (JSON objects), got {repr(value)[:80]}",
            argument="tools",
        )


@dataclass(frozen=True)
class Message:
    """One turn. `name` (OpenAI's optional participant name) reaches a model folder's own chat
    template as the message's `name` field, for templates that use it; the built-in formats
    have no place for it and leave it out. So does `reasoning_content`, an assistant turn's
    thinking as a reasoning parser gave it apart from `content` (Qwen3's template reads it;
    templates keep only the latest turn's thinking, if any)."""

    role: str  # "system", "user", "assistant" (Llama 3 also "ipython"/"tool": a tool's result)
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls (content then usually "")
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None

    def __post_init__(self) -> None:
        # Checked here, once, rather than failing inside a format or a template later (a
        # content of None, OpenAI's for a turn that only calls tools, is "" here).
        for field_name in ("role", "content"):
            value = getattr(self, field_name)
            if not isinstance(value, str):
                raise TokenizerError(f"a chat message's {field_name} must be a str, got {value!r}")
        for field_name in ("name", "tool_call_id", "reasoning_content"):
            value = getattr(self, field_name)
            if value is not None and not isinstance(value, str):
                raise TokenizerError(
                    f"a chat message's {field_name} must be a str or None, got {value!r}"
                )
        calls = self.tool_calls
        if not isinstance(calls, tuple | list) or not all(isinstance(c, ToolCall) for c in calls):
            raise TokenizerError(
                f"a chat message's tool_calls must be a tuple of ToolCall, got {calls!r}"
            )
        object.__setattr__(self, "tool_calls", tuple(calls))  # a list, as OpenAI's, is kept too
