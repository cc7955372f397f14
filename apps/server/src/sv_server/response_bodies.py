"""Response bodies in OpenAI's schema: a whole answer (`response_body`), a streamed answer's
chunks (`chunk_body`, `ChunkEncoder` for the many text chunks, `usage_chunk_body`) and the JSON
of one server-sent event (`event_json`). answers.py fills them in as a generation's text comes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sv_server.chat_messages import REASONING_FIELDS
from sv_server.request_parsing import Kind


def new_id(kind: Kind, base: str | None = None) -> str:
    """A completion's or chat answer's id: of the client's X-Request-Id `base` if it sent one
    (vLLM's), else of a random one."""
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + (base or uuid.uuid4().hex)


def usage(
    prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None
) -> dict[str, Any]:
    """OpenAI's usage; `reasoning_tokens` (chat under a reasoning parser, the thinking's share
    of completion_tokens) as `completion_tokens_details`, left out when None."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


def response_body(
    kind: Kind,
    response_id: str,
    model: str,
    choices: Sequence[tuple[str | None, str]],
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: Sequence[dict[str, Any] | None] | None = None,
    reasoning: Sequence[str | None] | None = None,
    reasoning_tokens: int | None = None,
    prompt_logprobs: Sequence[list[Any] | None] | None = None,
) -> dict[str, Any]:
    """The whole (non-streamed) answer: `choices` are (text, finish_reason), in index order
    (chat's text None: no content); the token counts are their sums; `logprobs`: each
    choice's, if asked for; `reasoning`: chat with a reasoning parser, each choice's
    `reasoning` and `reasoning_content` (None: it did not think), and `reasoning_tokens`
    their count; `prompt_logprobs` (vLLM's), each choice's prompt's, if asked for: on each
    completions choice, and once on a chat answer (its one prompt), where vLLM puts them."""
    bodies = []
    for index, (text, finish_reason) in enumerate(choices):
        choice: dict[str, Any] = {
            "index": index,
            "logprobs": logprobs[index] if logprobs else None,
            "finish_reason": finish_reason,
        }
        if kind == "completion":
            choice["text"] = text
            if prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs[index]
        else:
            choice["message"] = {"role": "assistant", "content": text}
            if reasoning is not None:
                choice["message"].update(dict.fromkeys(REASONING_FIELDS, reasoning[index]))
        bodies.append(choice)
    body: dict[str, Any] = {
        "id": response_id,
        "object": "text_completion" if kind == "completion" else "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": bodies,
        "usage": usage(prompt_tokens, completion_tokens, reasoning_tokens),
    }
    if kind != "completion" and prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs[0]
    return body


def chunk_body(
    kind: Kind,
    response_id: str,
    model: str,
    created: int,
    text: str | None,
    finish_reason: str | None = None,
    *,
    index: int = 0,
    first: bool = False,
    logprobs: dict[str, Any] | None = None,
    reasoning: str | None = None,
) -> dict[str, Any]:
    """One streamed chunk, of choice `index`. For chat, the first chunk carries the role, the
    last an empty delta. `logprobs`: those of the chunk's tokens. `reasoning`: chat, a piece
    of the thinking (`delta.reasoning` and `delta.reasoning_content`)."""
    choice: dict[str, Any] = {
        "index": index,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }
    if kind == "completion":
        choice["text"] = text or ""
    else:
        delta: dict[str, str] = {"role": "assistant"} if first else {}
        if reasoning is not None:
            delta.update(dict.fromkeys(REASONING_FIELDS, reasoning))
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    return {
        "id": response_id,
        "object": "text_completion" if kind == "completion" else "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


# Line breaks to Python's str.splitlines() that JSON leaves as they are: many SSE readers split
# a stream with it (httpx's iter_lines() does), which would cut an event whose text holds one.
_UNSPLIT_LINE_BREAKS = ("\u0085", "\u2028", "\u2029")


def event_json(value: Any) -> str:
    """`value` as the JSON of one server-sent event: UTF-8 as is, except the line breaks that
    only some readers split at, escaped (the same JSON value), so every reader sees one line."""
    text = json.dumps(value, ensure_ascii=False)
    for char in _UNSPLIT_LINE_BREAKS:
        if char in text:
            text = text.replace(char, f"\\u{ord(char):04x}")
    return text


class ChunkEncoder:
    """The text chunks of one choice of a stream as server-sent events, fast.

    Every text chunk of a response differs from the others only in its text, so the JSON
    around the text is rendered once and each chunk costs one json.dumps of a short string (a
    busy server sends thousands of chunks a second from one event loop).
    """

    _MARKER = "\x00text\x00"

    def __init__(
        self,
        kind: Kind,
        response_id: str,
        model: str,
        created: int,
        index: int = 0,
        *,
        null_usage: bool = False,
    ) -> None:
        body = chunk_body(kind, response_id, model, created, self._MARKER, index=index)
        if null_usage:  # stream_options.include_usage: OpenAI's chunks carry "usage": null
            body["usage"] = None
        template = json.dumps(body)
        self._head, self._tail = template.split(json.dumps(self._MARKER))

    def text_event(self, text: str) -> str:
        return f"data: {self._head}{event_json(text)}{self._tail}\n\n"


def usage_chunk_body(
    kind: Kind, response_id: str, model: str, created: int, usage_body: dict[str, Any]
) -> dict[str, Any]:
    """The extra last chunk of `stream_options.include_usage`: no choices, only the usage."""
    return {
        "id": response_id,
        "object": "text_completion" if kind == "completion" else "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_body,
    }
