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
from sv_server.logprobs import LogprobsWriter, Scored
from sv_server.reasoning import ReasoningStream, split_reasoning
from sv_server.request_parsing import GenerationRequest
from sv_server.responses_bodies import (
    Logprobs,
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


class MessageLogprobs:
    """The message's log-probabilities, if asked for (chat's entries: the Responses API's are
    the same), each given with the text that completes its token's own text, as chat's and
    completions' streams give theirs (`ScoredTokens` says how).

    Under a reasoning parser the message is the answer's text after its thinking: positions
    are counted in the whole answer's characters, the message starting after what the split
    put before it (the thinking with its tags, `begins_at`). The thinking's tokens' entries
    are dropped, as a reasoning item carries none (OpenAI's have no logprobs). A token is the
    message's when its own text ends inside the message's text: one that holds the end of
    `</think>` and the start of the message is the message's (its entry's text then begins
    with the tag's end), one that ends at the tag's end or before is the thinking's."""

    def __init__(self, generation: Generation, writer: LogprobsWriter) -> None:
        self._generation = generation
        self._writer = writer
        self._start = 0  # the answer's characters before the message's

    @classmethod
    def of(cls, generation: Generation) -> MessageLogprobs | None:
        return None if generation.logprobs is None else cls(generation, generation.logprobs)

    def begins_at(self, start: int) -> None:
        """The message starts at (no earlier than) the answer's `start`-th character: the
        entries not given yet of the tokens whose text ends there are dropped (at 0, none:
        a token of no text at the very start is the message's)."""
        if start:
            self._generation.take_scored(start)
        self._start = start

    def within(self, shown: int) -> Logprobs:
        """The entries not given yet of the tokens whose text ends within the message's first
        `shown` characters."""
        return self._render(self._generation.take_scored(self._start + shown))

    def rest(self) -> Logprobs:
        """Every entry not given yet: at the end of a message that ends the answer, those
        of tokens whose text a stop string cut, too (as the whole answer has them)."""
        return self._render(self._generation.take_scored())

    def _render(self, scored: list[Scored]) -> Logprobs:
        return self._writer.render(scored)["content"] if scored else []


def _usage(generation: Generation, prompt_tokens: int) -> dict[str, Any]:
    thinking = generation.reasoning
    return responses_usage(
        prompt_tokens,
        generation.cached_tokens,
        generation.completion_tokens,
        None if thinking is None else thinking.count,
    )


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
    message = MessageLogprobs.of(generation)
    logprobs = None
    if message is not None:
        # The message's text is the answer's last (the split's content); a message the split
        # left none of is no item, and the thinking's entries are dropped all the same.
        message.begins_at(len(texts[0]) - len(content or ""))
        # Before calls, the message's are its text's tokens (the calls' are no part of it).
        logprobs = message.within(len(content or "")) if calls else message.rest()
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
    message = MessageLogprobs.of(generation)
    pushed = 0  # the answer's characters so far
    begun = 0  # the message's characters the split gave so far (a tool call may hold some)
    shown = 0  # the message's characters shown so far
    thought = False  # whether the thinking was shown (a reasoning item)

    def pieces(reasoning: str, content: str, end: bool) -> Iterator[str]:
        nonlocal begun, shown, thought
        begun += len(content)
        if message is not None and split is not None:
            # What the split let out ends where its hold starts; the message's text so far
            # (if any) ends it: before it, the thinking with its tags, whose tokens' entries
            # are dropped (as chat's stream counts: answers.py's `shown`).
            message.begins_at(pushed - len(split.held) - begun)
        if reasoning:
            thought = True
            yield from events.text("reasoning", reasoning)
        deltas = calls.push(content) if calls is not None and content else []
        if calls is None and content:
            deltas = [{"content": content}]
        if end and calls is not None:
            deltas += calls.finish()
        for delta in deltas:
            if "content" in delta:
                shown += len(delta["content"])
                logprobs = message.within(shown) if message is not None else None
                yield from events.text("message", delta["content"], logprobs)
        found = calls.calls if calls is not None and end else ()
        # (no message after a shown thinking: as whole, the answer has no message item)
        if end and message is not None and not found and (shown or not thought):
            rest = message.rest()  # (a cut token's, say: on a delta of no text, as whole)
            if rest:
                yield from events.text("message", "", rest)
        for call in found:
            yield from events.function_call(call)

    try:
        async for text in generation.texts():
            pushed += len(text)
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
