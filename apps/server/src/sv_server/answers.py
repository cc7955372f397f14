"""Answer delivery: the tokens of a generation's accepted requests, as text, to the client.

`Generation` turns one engine request's deliveries into text, with stop strings applied.
`collect` waits for every choice and answers with one JSON body; `stream` sends them as
server-sent events in OpenAI's chunk schema, inside an `EventStream`. Either way a client that
hangs up, or a failure, cancels every engine request of the answer (`close_all`), and a
reasoning parser's thinking and a tool call's text come apart from the content here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from sv_engine import StreamEvent, TokenLogprob

from sv_server import tools
from sv_server.engine_loop import Delivery, EngineLoop, Failed, RequestHandle, Token
from sv_server.errors import ServerError
from sv_server.logprobs import LogprobsWriter, PromptLogprobsWriter, Scored, ScoredTokens
from sv_server.reasoning import ReasoningStream, ReasoningTokens, split_reasoning
from sv_server.request_parsing import GenerationRequest
from sv_server.response_bodies import (
    ChunkEncoder,
    chunk_body,
    event_json,
    response_body,
    usage,
    usage_chunk_body,
)


class Generation:
    """The tokens of one accepted request, as text, with stop strings applied.

    Ends at the engine's finish ("stop"/"length"; a stop string's is "stop" too: the engine
    loop matches them, engine_loop.py). `close()` cancels it if it is still running (client
    gone).
    `echo`: text that comes first (the prompt, for completions' echo). With `logprobs`, the
    scored tokens gather as they come, until `take_logprobs` renders them (a stream's, once
    the text that completes theirs is shown). With `reasoning` (chat under a reasoning
    parser), its thinking tokens are counted. `echo_only` (echo with `max_tokens: 0`): the
    token the engine generates is no part of the answer (no text, no log-probabilities, not
    counted in its usage), which ends with "length". With `prompt_logprobs` (vLLM's field),
    the prompt's scores are kept for `prompt_logprobs_body`.
    """

    def __init__(
        self,
        loop: EngineLoop,
        handle: RequestHandle,
        *,
        echo: str = "",
        echo_lengths: Sequence[int] = (),
        logprobs: LogprobsWriter | None = None,
        reasoning: ReasoningTokens | None = None,
        echo_only: bool = False,
        prompt_logprobs: PromptLogprobsWriter | None = None,
    ) -> None:
        self._loop = loop
        self.handle = handle
        self._echo = echo
        self._echo_only = echo_only
        # With echo and logprobs (else none): the characters of `echo` each prompt token adds
        self._echo_lengths = echo_lengths
        self._prompt_logprobs = prompt_logprobs
        self._prompt_scores: list[TokenLogprob | None] | None = None
        self.completion_tokens = 0
        self.cached_tokens = 0  # of the prompt, served from the prefix cache (once finished)
        self.finish_reason: str | None = None
        self.logprobs = logprobs
        self.reasoning = reasoning
        # With logprobs: the scored tokens, given as their text is shown
        self._scored = None if logprobs is None else logprobs.scored_tokens()

    def take_logprobs(self, shown: int | None = None) -> dict[str, Any] | None:
        """The log-probabilities of the tokens `take_scored` takes, rendered."""
        if self.logprobs is None:
            return None
        return self.logprobs.render(self.take_scored(shown))

    def prompt_logprobs_body(self) -> list[dict[str, dict[str, Any]] | None] | None:
        """vLLM's `prompt_logprobs` of the prompt, once the answer has ended (None: not asked)."""
        if self._prompt_logprobs is None or self._prompt_scores is None:
            return None
        return self._prompt_logprobs.render(self._prompt_scores)

    def take_scored(self, shown: int | None = None) -> list[Scored]:
        """The scored tokens not taken yet (by either take), not rendered. With `shown`, those
        whose own text ends within the answer's first `shown` characters (`ScoredTokens`): a
        stream gives each token's with the text that completes its own. None: all, those of
        tokens whose text a stop string cut too, as the whole answer has them."""
        return [] if self._scored is None else self._scored.take(shown)

    async def texts(self) -> AsyncIterator[str]:
        """The answer's text, piece by piece. Tokens that queued up while the client was being
        served come out as one piece: under load, fewer and larger chunks, not a backlog."""
        deliveries = self.handle.deliveries
        while self.finish_reason is None:
            pieces = [self._consume(await deliveries.get())]
            while self.finish_reason is None and not deliveries.empty():
                pieces.append(self._consume(deliveries.get_nowait()))
            if self.finish_reason is not None and self.reasoning is not None:
                self.reasoning.finish()  # (before the last text's chunk counts it)
            text = "".join(pieces)
            if self._echo:
                text, self._echo = self._echo + text, ""
            if text:
                yield text

    def _consume(self, delivery: Delivery) -> str:
        """Account for one delivery; returns the text it makes safe to show."""
        if isinstance(delivery, Failed):
            self.close()
            raise delivery.error()
        if not isinstance(delivery, Token):
            return ""  # Accepted/Rejected only come first
        event = delivery.event
        if self._echo_only:  # (its prompt's scores come on the event of the dropped token)
            event = replace(event, token_id=None, text="", logprob=None)
        if event.prompt_logprobs is not None and self._prompt_logprobs is not None:
            self._prompt_scores = event.prompt_logprobs
        if event.token_id is not None:
            self.completion_tokens += 1
            if self.reasoning is not None and event.finished != "stop":  # (a stop token: no text)
                self.reasoning.push(event.text)
        if self._scored is not None:
            self._score(self._scored, event, delivery.own_chars)
        text = event.text
        if event.completion is not None:
            self.cached_tokens = event.completion.num_cached_tokens
        if event.finished is not None:
            # (/metrics counted its finish already: it is no request the server refused)
            if event.finished == "error" and event.completion is not None:
                # Its grammar failed (past the lexer's limits): what it wrote so far is not
                # output that meets the constraint, so it is no answer.
                self.close()
                raise ServerError(str(event.completion.error), counted=True)
            if event.finished not in ("stop", "length"):
                self.close()
                raise ServerError(
                    f"the request ended unexpectedly ({event.finished})",
                    status=500,
                    type="server_error",
                    counted=True,
                )
            self.finish_reason = "length" if self._echo_only else event.finished
        return text

    def _score(self, scored: ScoredTokens, event: StreamEvent, own_chars: int | None) -> None:
        if event.prompt_logprobs is not None and self._echo_lengths:  # echo: the prompt's first
            scored.extend(
                zip(self.handle.prompt_ids, event.prompt_logprobs, self._echo_lengths, strict=True)
            )
        # A stop token's text is not shown: nor is its log-probability.
        if event.token_id is not None and event.logprob is not None and event.finished != "stop":
            chars = len(event.text) if own_chars is None else own_chars
            scored.append((event.token_id, event.logprob, chars))

    def close(self) -> None:
        if self.finish_reason is None:
            self.finish_reason = "cancelled"
            self._loop.cancel(self.handle)


def close_all(generations: list[Generation]) -> None:
    for generation in generations:
        generation.close()


async def collect(
    request: Request,
    req: GenerationRequest,
    model: str,
    generations: list[Generation],
    prompt_tokens: int,
    response_id: str,
) -> Response:
    """A non-streamed answer (of id `response_id`); a client that hangs up meanwhile cancels
    every request of it. With a reasoning parser, each choice's text is split on its own."""
    texts = await whole_texts(request, generations)
    if texts is None:
        return Response(status_code=499)  # nobody is listening; for the access log
    contents: list[str | None] = list(texts)
    reasoning = None
    counts = _reasoning_tokens(generations)
    if counts is not None:
        splits = [
            split_reasoning(text, count.opens_in_thinking)
            for text, count in zip(texts, counts, strict=True)
        ]
        reasoning = [r for r, _ in splits]
        contents = [c for _, c in splits]
    body = response_body(
        req.kind,
        response_id,
        model,
        [(text, g.finish_reason or "") for text, g in zip(contents, generations, strict=True)],
        prompt_tokens,
        sum(g.completion_tokens for g in generations),
        logprobs=[g.take_logprobs() for g in generations] if req.logprobs is not None else None,
        prompt_logprobs=(
            [g.prompt_logprobs_body() for g in generations]
            if req.prompt_logprobs is not None
            else None
        ),
        reasoning=reasoning,
        reasoning_tokens=None if counts is None else sum(c.count for c in counts),
    )
    if req.tools is not None:
        tools.apply_to_response(body, req.tools)
    return JSONResponse(body)


async def whole_texts(request: Request, generations: list[Generation]) -> list[str] | None:
    """Each generation's whole text, once all have ended; None when the client hung up
    first. Either way every request of the answer is over (cancelled if it was running)."""

    async def all_texts() -> list[str]:
        async def text_of(generation: Generation) -> str:
            return "".join([text async for text in generation.texts()])

        tasks = [asyncio.ensure_future(text_of(g)) for g in generations]
        try:
            return await asyncio.gather(*tasks)
        finally:  # one failed: the others stop waiting too
            for task in tasks:
                task.cancel()

    answer = asyncio.ensure_future(all_texts())
    hangup = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({answer, hangup}, return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():
            answer.cancel()
            return None
        return answer.result()
    finally:
        hangup.cancel()
        close_all(generations)


def _reasoning_tokens(generations: list[Generation]) -> list[ReasoningTokens] | None:
    """Each choice's thinking count, under a reasoning parser (chat); else None."""
    counts = [g.reasoning for g in generations if g.reasoning is not None]
    return counts or None


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else event_json(payload)
    return f"data: {data}\n\n"


async def _pieces(generations: list[Generation]) -> AsyncIterator[tuple[int, str | None]]:
    """(choice index, text) as each generation's text comes, interleaved, and (index, None)
    when that generation has finished. A failure in one raises here."""
    if len(generations) == 1:  # the common case, without a task per piece
        async for text in generations[0].texts():
            yield 0, text
        yield 0, None
        return
    streams = [g.texts() for g in generations]
    pending = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):
                index = pending.pop(task)
                try:
                    text = task.result()
                except StopAsyncIteration:
                    yield index, None
                    continue
                pending[asyncio.ensure_future(anext(streams[index]))] = index
                yield index, text
    finally:
        for task in pending:
            task.cancel()


async def stream(
    req: GenerationRequest,
    model: str,
    generations: list[Generation],
    prompt_tokens: int,
    response_id: str,
) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk schema, ending with `data: [DONE]`. Each choice's
    chunks carry its index (for chat, its first one the role); a choice's last chunk carries
    its finish_reason. With a reasoning parser, each choice's thinking comes as
    `delta.reasoning_content` and only the rest goes on as content (to the tool-call parser).
    With `continuous_usage`, every chunk carries the usage so far of its own choice, as vLLM's
    does (its prompt's tokens and that choice's), while `include_usage`'s last chunk counts all;
    with `include_usage` alone, every other chunk carries `"usage": null`, as OpenAI's do."""
    created, kind = int(time.time()), req.kind
    counts = _reasoning_tokens(generations)

    def usage_so_far() -> dict[str, Any]:
        return usage(
            prompt_tokens,
            sum(g.completion_tokens for g in generations),
            None if counts is None else sum(c.count for c in counts),
        )

    def chunk(body: dict[str, Any]) -> str:
        if req.continuous_usage:
            index = body["choices"][0]["index"]  # (a chunk is one choice's)
            generation = generations[index]
            body["usage"] = usage(
                len(generation.handle.prompt_ids),  # its prompt's (of several, completions)
                generation.completion_tokens,
                None if counts is None else counts[index].count,
            )
        elif req.include_usage:
            body["usage"] = None
        return _sse(body)

    if kind == "chat":
        for index in range(len(generations)):
            yield chunk(chunk_body(kind, response_id, model, created, "", index=index, first=True))
    encoders = [
        ChunkEncoder(kind, response_id, model, created, index, null_usage=req.include_usage)
        for index in range(len(generations))
    ]
    # Chat with tools: each choice's text that may be a tool call is held back and sent as
    # its deltas, with the held tokens' logprobs on the first of them.
    calls = None
    if req.tools is not None and req.tools.parses:
        calls = [tools.ToolCallStream(req.tools) for _ in generations]
    splits = None
    if counts is not None:
        splits = [ReasoningStream(count.opens_in_thinking) for count in counts]
    # Each choice's characters of text so far: a chunk carries the logprobs of the tokens whose
    # text it completes (`Generation.take_scored`), so it is told where in the text it ends.
    pushed = [0] * len(generations)

    def content_events(index: int, text: str | None, shown: int) -> Iterator[str]:
        """The events of a piece of choice `index`'s content (None: the choice has ended),
        which ends at the choice's `shown`-th character of text (before a tool call's hold)."""
        generation = generations[index]
        if calls is not None:
            split = calls[index]
            deltas = split.push(text) if text is not None else split.finish()
            # (calls found at the end: the held tokens' logprobs all go on their first delta)
            upto = None if split.called else shown - len(split.held)
            for i, delta in enumerate(deltas):
                yield chunk(
                    tools.delta_chunk(
                        response_id,
                        model,
                        created,
                        delta,
                        index=index,
                        logprobs=generation.take_logprobs(upto) if i == 0 else None,
                    )
                )
            if text is not None:
                return
        elif text is not None:
            if generation.logprobs is None and not req.continuous_usage:
                yield encoders[index].text_event(text)
                return
            logprobs = generation.take_logprobs(shown)
            yield chunk(
                chunk_body(kind, response_id, model, created, text, index=index, logprobs=logprobs)
            )
            return
        # The rest, on the last chunk: those of tokens whose text a stop string cut, say (the
        # whole answer has them too).
        logprobs = generation.take_logprobs()
        last = None if kind == "chat" else ""
        reason = generation.finish_reason
        if calls is not None:
            reason = calls[index].finish_reason(reason)
        yield chunk(
            chunk_body(
                kind, response_id, model, created, last, reason, index=index, logprobs=logprobs
            )
        )

    try:
        async for index, text in _pieces(generations):
            if text is not None:
                pushed[index] += len(text)
            if splits is None:
                for event in content_events(index, text, pushed[index]):
                    yield event
                continue
            split = splits[index]
            reasoning, content = split.push(text) if text is not None else split.finish()
            # The content ends where the split's hold starts; the thinking before the content
            # (with the tag between them).
            shown = pushed[index] - len(split.held)
            if reasoning:
                logprobs = generations[index].take_logprobs(shown - len(content))
                yield chunk(
                    chunk_body(
                        kind,
                        response_id,
                        model,
                        created,
                        None,
                        index=index,
                        logprobs=logprobs,
                        reasoning=reasoning,
                    )
                )
            if content:
                for event in content_events(index, content, shown):
                    yield event
            if text is None:
                for event in content_events(index, None, shown):
                    yield event
    except ServerError as e:  # the status line is gone already: the error goes in the stream
        close_all(generations)
        yield _sse(e.body())
        yield _sse("[DONE]")
        return
    if req.include_usage:
        yield _sse(usage_chunk_body(kind, response_id, model, created, usage_so_far()))
    yield _sse("[DONE]")


class EventStream(StreamingResponse):
    """A text/event-stream response that calls `on_close` however it ends: finished, client
    disconnected (Starlette cancels the stream) or failed. That is what cancels the request."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
