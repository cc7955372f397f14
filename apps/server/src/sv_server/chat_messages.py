"""A chat request's conversation and template options, checked: OpenAI's messages (with the
fields its client sends back when a reply goes into the history whole) and vLLM's fields that
steer the chat template. Used by /v1/chat/completions and vLLM's /tokenize alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sv_tokenizer import Message, ToolCall

from sv_server.body import JsonTextError, json_value
from sv_server.errors import bad_request
from sv_server.fields import bool_field, checked_field, optional_bool, optional_str, shown_value


@dataclass(frozen=True)
class ChatOptions:
    """vLLM's chat fields that steer the chat template, checked for type here and for meaning
    by the chat format (sv_tokenizer's encode_dialog takes them as they are).

    add_generation_prompt: None = true, unless continue_final_message.
    continue_final_message: leave the last (assistant) message open, for the model to go on.
    chat_template_kwargs: extra variables for the chat template.
    chat_template: a jinja template used instead of the model's (vLLM's; the server takes it
                   only when started with --trust-request-chat-template).
    """

    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    chat_template: str | None = None


CHAT_OPTION_FIELDS = frozenset(
    {"add_generation_prompt", "continue_final_message", "chat_template_kwargs", "chat_template"}
)


# A text part's keys beside type and text that ask for nothing this server lacks: Anthropic's
# prompt-caching mark, which clients and proxies (LiteLLM) add to OpenAI requests; this server
# caches every prompt's pages by prefix without being asked.
_IGNORED_PART_KEYS = frozenset({"cache_control"})


def parse_chat_options(body: Mapping[str, Any]) -> ChatOptions:
    generation = optional_bool(body, "add_generation_prompt")
    kwargs = checked_field(body, "chat_template_kwargs", lambda v: isinstance(v, dict), "an object")
    return ChatOptions(
        add_generation_prompt=generation,
        continue_final_message=bool_field(body, "continue_final_message"),
        chat_template_kwargs=kwargs or {},
        chat_template=optional_str(body, "chat_template"),
    )


# OpenAI's message roles ("developer": its newer name for "system", which the models here know).
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


# Fields of OpenAI's assistant reply that its client sends back as they are when a reply is
# put into the history whole (`message.model_dump()`): accepted empty, as they then say nothing.
_EMPTY_REPLY_FIELDS = frozenset({"refusal", "annotations", "audio", "function_call"})
# The client's own parse of `content`, on the replies of its `.parse()` and `.stream()`
# helpers (the reply object itself is sent back so): it repeats `content`, so it is ignored.
_DERIVED_REPLY_FIELDS = frozenset({"parsed"})


def parse_message(item: Any, index: int) -> Message:
    """`messages[index]`: {role, content, name?} with an assistant's `tool_calls` and thinking,
    or a tool's `tool_call_id`; content is a string or a list of text parts."""
    param = f"messages[{index}]"
    if not isinstance(item, dict):
        raise bad_request(f"{param} must be an object with 'role' and 'content'", param)
    known = {"role", "content", "name", "tool_calls", "tool_call_id", *REASONING_FIELDS}
    unknown = set(item) - known
    unknown -= _DERIVED_REPLY_FIELDS
    for key in sorted(unknown):
        if key not in _EMPTY_REPLY_FIELDS:
            raise bad_request(f"unknown field {shown_value(f'{param}.{key}')}", param)
        if item[key] not in (None, []):
            raise bad_request(
                f"{param}.{key} is not supported by this server (got {shown_value(item[key])})",
                param,
            )
    role, content, name = item.get("role"), item.get("content"), item.get("name")
    calls = _tool_calls(item.get("tool_calls"), role, param)
    call_id = item.get("tool_call_id")
    if call_id is not None and (role != "tool" or not isinstance(call_id, str)):
        raise bad_request(f"{param}.tool_call_id must be a string, on a 'tool' message", param)
    reasoning = _reasoning(item, role, param)
    if (calls or reasoning is not None) and content is None:
        content = ""  # an assistant turn that only called a tool, or only thought
    if role not in CHAT_ROLES:
        raise bad_request(
            f"{param}.role must be one of {', '.join(CHAT_ROLES)}, got {shown_value(role)}", param
        )
    if role == "developer":  # OpenAI's newer name for the system message
        role = "system"
    if name is not None and not isinstance(name, str):
        raise bad_request(f"{param}.name must be a string, got {shown_value(name)}", param)
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
                and set(part) - _IGNORED_PART_KEYS == {"type", "text"}
            ):
                raise bad_request(
                    f"{param}.content parts must be {{'type': 'text', 'text': str}}", param
                )
            texts.append(part["text"])
        content = "\n".join(texts)  # (as vLLM joins a text model's parts)
    if not isinstance(content, str):
        raise bad_request(f"{param}.content must be a string or a list of text parts", param)
    return Message(role, content, name, calls, call_id, reasoning)


# An assistant message's thinking, as a reasoning parser gave it: vLLM's newer name for it
# first (`reasoning`, which vLLM reads from the history), then the older one, which this
# server's replies carry beside it and Qwen3's template reads.
REASONING_FIELDS = ("reasoning", "reasoning_content")


def _reasoning(item: Mapping[str, Any], role: Any, param: str) -> str | None:
    """An assistant message's thinking, under either name (the openai client sends a reply
    back whole, with both as this server gave them); both given, they must agree."""
    given = {}
    for key in REASONING_FIELDS:
        value = item.get(key)
        if value is None:
            continue
        if role != "assistant" or not isinstance(value, str):
            raise bad_request(f"{param}.{key} must be a string, on an 'assistant' message", param)
        given[key] = value
    if len(set(given.values())) > 1:
        raise bad_request(
            f"{param}.reasoning and {param}.reasoning_content differ (two names for the same "
            "thinking): give one, or the same text in both",
            param,
        )
    return next(iter(given.values()), None)


def _tool_calls(value: Any, role: Any, param: str) -> tuple[ToolCall, ...]:
    """An assistant message's `tool_calls`, as OpenAI sends them back in the history."""
    if value is None:
        return ()
    if role != "assistant" or not isinstance(value, list):
        raise bad_request(f"{param}.tool_calls must be a list, on an 'assistant' message", param)
    calls = []
    for call in value:
        function = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(function, dict)
            and call.get("type", "function") == "function"
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str)
            and (call.get("id") is None or isinstance(call["id"], str))
        ):
            raise bad_request(
                f"{param}.tool_calls entries must be {{'id', 'type': 'function', "
                "'function': {'name': str, 'arguments': str}}",
                param,
            )
        try:
            arguments = json_value(function["arguments"])
        except JsonTextError as e:
            raise bad_request(
                f"{param}.tool_calls: the arguments of {function['name']!r} must be a JSON "
                f"object's text; this text {e}",
                param,
            ) from None
        if not isinstance(arguments, dict):
            raise bad_request(
                f"{param}.tool_calls: the arguments of {function['name']!r} must be a JSON "
                "object's text",
                param,
            )
        calls.append(ToolCall(function["name"], function["arguments"], call.get("id")))
    return tuple(calls)
