"""A /v1/responses answer: the one generation of a chat-shaped request (app.py's `_generate`),
delivered by answers.py's machinery (its `Generation`, stop strings, cancellation on hangup),
with a reasoning parser's thinking and a tool call taken apart as for chat, and written in the
Responses API's shapes (responses_bodies.py): whole, or as its stream of events."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from sv_tokenizer import ToolCall

from sv_server.answers import Generation, close_all, whole_texts
from sv_server.errors import ServerError
from sv_server.reasoning import ReasoningStream, split_reasoning
from sv_server.request_parsing import GenerationRequest
from sv_server.responses_bodies import (
    OutputEvents,
    Status,
    new_item_id,
    output_items,
    response_object,
    responses_usage,
)
from sv_server.tools import ToolCallStream


def _status(generation: Generation) -> Status:
    # "length": the output budget (max_output_tokens, or the context's room) ran out.
    return "incomplete" if generation.finish_reason == "length" else "completed"


def _logprobs(generation: Generation) -> list[dict[str, Any]] | None:
    """The log-probabilities of the tokens since the last call, if asked for (chat's entries:
    the Responses API's are the same)."""
    rendered = generation.take_logprobs()
    return None if rendered is None else rendered["content"]


def _usage(generation: Generation, prompt_tokens: int) -> dict[str, Any]:
    thinking = generation.reasoning
    return responses_usage(
        prompt_tokens, generation.completion_tokens, None if thinking is None else thinking.count
    )


def _within(entries: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """The first entries whose tokens' bytes add up to at most `size`."""
    kept, total = [], 0
    for entry in entries:
        total += len(entry["bytes"])
        if total > size:
            break
        kept.append(entry)
    return kept


async def collect_response(
    request: Request,
    req: GenerationRequest,
    model: str,
    generation: Generation,
    prompt_tokens: int,
) -> Response:
    """The whole response; a client that hangs up meanwhile cancels the request."""
    texts = await whole_texts(request, [generation])
    if texts is None:
        return Response(status_code=499)  # nobody is listening; for the access log
    reasoning: str | None = None
    content: str | None = texts[0]
    if generation.reasoning is not None:
        reasoning, content = split_reasoning(texts[0], generation.reasoning.opens_in_thinking)
    calls: tuple[ToolCall, ...] = ()
    answer = req.tools.parse(content) if req.tools is not None and content is not None else None
    if answer is not None:
        content, calls = answer.content, answer.calls
    status = _status(generation)
    logprobs = _logprobs(generation)
    if calls and logprobs is not None:
        # The message's are its text's tokens, those before the calls (as the stream gives
        # them when each token comes on its own).
        logprobs = _within(logprobs, len((content or "").encode()))
    body = response_object(
        req.settings or {},
        new_item_id("resp"),
        int(time.time()),
        model,
        status,
        output_items(reasoning, content, calls, status, logprobs),
        _usage(generation, prompt_tokens),
    )
    return JSONResponse(body)


async def stream_response(
    req: GenerationRequest, model: str, generation: Generation, prompt_tokens: int
) -> AsyncIterator[str]:
    """The response's events: created and in progress, each output item's as its text comes
    (text that may be a tool call is held back until the end, as chat's stream holds it),
    then completed or incomplete with the whole response. A failure on the way ends the
    stream with an `error` event, the status line being gone already."""
    events = OutputEvents()
    response_id, created = new_item_id("resp"), int(time.time())

    def response(status: Status, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        output = events.output if status != "in_progress" else []
        return response_object(
            req.settings or {}, response_id, created, model, status, output, usage
        )

    yield events.event("response.created", response=response("in_progress"))
    yield events.event("response.in_progress", response=response("in_progress"))
    split = None
    if generation.reasoning is not None:
        split = ReasoningStream(generation.reasoning.opens_in_thinking)
    calls = ToolCallStream(req.tools) if req.tools is not None and req.tools.parses else None

    def pieces(reasoning: str, content: str, end: bool) -> Iterator[str]:
        if reasoning:
            yield from events.text("reasoning", reasoning)
        deltas = calls.push(content) if calls is not None and content else []
        if calls is None and content:
            deltas = [{"content": content}]
        if end and calls is not None:
            deltas += calls.finish()
        for delta in deltas:
            if "content" in delta:  # (its tokens' logprobs: those not shown yet)
                yield from events.text("message", delta["content"], _logprobs(generation))
        for call in calls.calls if calls is not None and end else ():
            yield from events.function_call(call)

    try:
        async for text in generation.texts():
            reasoning, content = split.push(text) if split is not None else ("", text)
            for event in pieces(reasoning, content, end=False):
                yield event
        reasoning, content = split.finish() if split is not None else ("", "")
        for event in pieces(reasoning, content, end=True):
            yield event
    except ServerError as e:
        close_all([generation])
        yield events.event("error", code=e.code, message=e.message, param=e.param)
        return
    status = _status(generation)
    for event in events.at_least_a_message():
        yield event
    for event in events.close(status):
        yield event
    kind = "response.completed" if status == "completed" else "response.incomplete"
    yield events.event(kind, response=response(status, _usage(generation, prompt_tokens)))
