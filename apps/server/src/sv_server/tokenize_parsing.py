"""Request bodies of vLLM's /tokenize and /detokenize, checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sv_tokenizer import Message

from sv_server.chat_messages import (
    CHAT_OPTION_FIELDS,
    ChatOptions,
    parse_chat_options,
    parse_message,
)
from sv_server.errors import bad_request
from sv_server.fields import is_int, optional_bool, optional_str, shown_value
from sv_server.tools import parse_tools


@dataclass(frozen=True)
class TokenizeRequest:
    """A /tokenize body: a text (`prompt`, raw as /v1/completions takes it) or a conversation
    (`messages`, in the chat format, with a chat request's template options and `tools`, which
    the format renders as a chat request's). add_special_tokens: BOS first where the model's
    tokenizer adds one (vLLM's default: true for a text, false for a conversation, whose chat
    format has its own)."""

    model: str | None
    prompt: str | None
    messages: list[Message] | None
    add_special_tokens: bool
    chat_options: ChatOptions | None = None
    tools: list[dict[str, Any]] | None = None


def parse_tokenize_request(body: Any) -> TokenizeRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    chat = "messages" in body
    allowed = {"model", "add_special_tokens"} | (
        {"messages", "tools", *CHAT_OPTION_FIELDS} if chat else {"prompt"}
    )
    for key in body:
        if key not in allowed:
            raise bad_request(f"unknown field {shown_value(key)}", param=key)
    model = optional_str(body, "model")
    add_special = optional_bool(body, "add_special_tokens")
    if chat:
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty list", param="messages")
        tools = parse_tools({"tools": body.get("tools")})  # (vLLM's takes no tool_choice)
        return TokenizeRequest(
            model=model,
            prompt=None,
            messages=[parse_message(m, i) for i, m in enumerate(messages)],
            add_special_tokens=bool(add_special),
            chat_options=parse_chat_options(body),
            tools=tools.tools if tools is not None else None,
        )
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad_request("'prompt' (a string) or 'messages' is required", param="prompt")
    return TokenizeRequest(
        model=model, prompt=prompt, messages=None, add_special_tokens=add_special is not False
    )


def parse_detokenize_request(body: Any) -> tuple[str | None, list[int]]:
    """A /detokenize body: `tokens`, a list of token ids; returns (model, tokens)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for key in body:
        if key not in ("model", "tokens"):
            raise bad_request(f"unknown field {shown_value(key)}", param=key)
    model = optional_str(body, "model")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(is_int(t) for t in tokens):
        raise bad_request(
            f"'tokens' must be a list of token ids, got {shown_value(tokens)}", param="tokens"
        )
    return model, tokens
