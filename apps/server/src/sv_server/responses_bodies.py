"""The Responses API's shapes out: the response object (`response_object`), its output items,
and a streamed answer's events (`OutputEvents`), in the order OpenAI sends them:

    response.created, response.in_progress,
    per output item: response.output_item.added,
        reasoning or text: response.content_part.added, its deltas
            (response.reasoning_text.delta / response.output_text.delta), their .done,
            response.content_part.done
        a function call: response.function_call_arguments.delta and .done
    response.output_item.done, ..., then response.completed (or response.incomplete)

Every event is `event: <type>` and `data: <JSON with that type and its sequence_number>`; no
`data: [DONE]` ends the stream (the Responses API sends none).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from sv_tokenizer import ToolCall

from sv_server.response_bodies import event_json

Status = Literal["in_progress", "completed", "incomplete"]


def new_item_id(prefix: str) -> str:
    """An id of OpenAI's form: `resp_...` for a response, `msg_`, `rs_`, `fc_` for its items."""
    return f"{prefix}_{uuid.uuid4().hex}"


def responses_usage(
    input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int | None
) -> dict[str, Any]:
    """OpenAI's usage of a response: `cached_tokens` of the input were served from the
    prefix cache (nothing is written to a cache a client pays for: no cache_write_tokens)."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens or 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    settings: Mapping[str, Any],
    response_id: str,
    created_at: int,
    model: str,
    status: Status,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response: `settings` are the request's, as the answer repeats them
    (responses_parsing.py); "incomplete" always means the output budget ran out here."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": int(time.time()) if status == "completed" else None,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": model,
        "output": output,
        "usage": usage,
        "previous_response_id": None,
        "reasoning": None,
        "service_tier": "default",
        "store": False,  # whatever the request said: nothing is kept to retrieve later
        "top_logprobs": None,
        "truncation": "disabled",  # (the request's, in `settings`)
        **settings,
    }


def reasoning_item(item_id: str, text: str | None, status: Status) -> dict[str, Any]:
    """The model's thinking (under a reasoning parser), as its raw text: it has no summary."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


# One output token's log-probability and its top alternatives: chat's entry (logprobs.py).
Logprobs = list[dict[str, Any]]


def text_part(text: str, logprobs: Logprobs | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(
    item_id: str, text: str | None, status: Status, logprobs: Logprobs | None = None
) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [] if text is None else [text_part(text, logprobs)],
    }


def function_call_item(item_id: str, call: ToolCall, status: Status) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if status == "completed" else "",
        "status": status,
    }


def output_items(
    reasoning: str | None,
    text: str | None,
    calls: Sequence[ToolCall],
    status: Status,
    logprobs: Logprobs | None = None,
) -> list[dict[str, Any]]:
    """A whole answer's output: its thinking, its text (with its tokens' `logprobs`, if
    asked for), its tool calls, each if it has one. `status` is the last item's: an earlier
    one ended (the thinking, before the text)."""
    if reasoning is None and text is None and not calls:
        text = ""  # (an answer of nothing is an empty message, as OpenAI gives it)
    items = []
    if reasoning is not None:
        ended = text is not None or bool(calls)
        items.append(reasoning_item(new_item_id("rs"), reasoning, "completed" if ended else status))
    if text is not None:
        ended = bool(calls)
        items.append(
            message_item(new_item_id("msg"), text, "completed" if ended else status, logprobs)
        )
    items += [function_call_item(new_item_id("fc"), call, "completed") for call in calls]
    return items


class OutputEvents:
    """The events of one streamed answer: each item is opened by its first piece of text and
    closed when another kind of item begins or the answer ends; `output` gathers the closed
    items, which the last event's response carries."""

    def __init__(self) -> None:
        self.output: list[dict[str, Any]] = []
        self._sequence = 0
        self._open: str | None = None  # "reasoning" or "message": the item being written
        self._id = ""
        self._text = ""
        self._logprobs: Logprobs = []  # the message's tokens', if asked for

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {event_json(body)}\n\n"

    def text(
        self, kind: Literal["reasoning", "message"], delta: str, logprobs: Logprobs | None = None
    ) -> Iterator[str]:
        """A piece of the thinking ("reasoning") or of the answer's text ("message", with the
        log-probabilities of the tokens it is the first to show, if asked for)."""
        yield from self._begin(kind)
        self._text += delta
        self._logprobs += logprobs or []
        where = self._where()
        if kind == "reasoning":
            yield self.event("response.reasoning_text.delta", **where, delta=delta)
        else:
            yield self.event(
                "response.output_text.delta", **where, delta=delta, logprobs=logprobs or []
            )

    def _begin(self, kind: Literal["reasoning", "message"]) -> Iterator[str]:
        if self._open == kind:
            return
        yield from self.close("completed")
        self._open, self._id = kind, new_item_id("rs" if kind == "reasoning" else "msg")
        self._text, self._logprobs = "", []
        item = reasoning_item if kind == "reasoning" else message_item
        yield self._item_event("added", item(self._id, None, "in_progress"))
        yield self._part_event("added", "")

    def at_least_a_message(self) -> Iterator[str]:
        """An answer with no output at all (EOS first) is one empty message, as whole."""
        if not self.output and self._open is None:
            yield from self._begin("message")

    def function_call(self, call: ToolCall) -> Iterator[str]:
        """A whole tool call (held back until the answer ended, as chat's stream holds it)."""
        yield from self.close("completed")
        item_id = new_item_id("fc")
        yield self._item_event("added", function_call_item(item_id, call, "in_progress"))
        where = {"item_id": item_id, "output_index": len(self.output)}
        yield self.event("response.function_call_arguments.delta", **where, delta=call.arguments)
        yield self.event("response.function_call_arguments.done", **where, arguments=call.arguments)
        item = function_call_item(item_id, call, "completed")
        yield self._item_event("done", item)
        self.output.append(item)

    def close(self, status: Status) -> Iterator[str]:
        """End the item being written, if any, with `status`."""
        if self._open is None:
            return
        where, text = self._where(), self._text
        if self._open == "reasoning":
            yield self.event("response.reasoning_text.done", **where, text=text)
            item = reasoning_item(self._id, text, status)
        else:
            logprobs = self._logprobs
            yield self.event("response.output_text.done", **where, text=text, logprobs=logprobs)
            item = message_item(self._id, text, status, logprobs)
        yield self._part_event("done", text)
        yield self._item_event("done", item)
        self.output.append(item)
        self._open = None

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._id, "output_index": len(self.output), "content_index": 0}

    def _part_event(self, stage: str, text: str) -> str:
        part = (
            {"type": "reasoning_text", "text": text}
            if self._open == "reasoning"
            else text_part(text, self._logprobs if stage == "done" else None)
        )
        return self.event(f"response.content_part.{stage}", **self._where(), part=part)

    def _item_event(self, stage: str, item: dict[str, Any]) -> str:
        return self.event(f"response.output_item.{stage}", output_index=len(self.output), item=item)
