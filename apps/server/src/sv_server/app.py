"""The HTTP side: a Starlette app whose handlers turn OpenAI requests into engine requests.

    POST /v1/completions        raw text or token ids (not chat-formatted)
    POST /v1/chat/completions   messages, formatted with the model's chat format
    GET  /v1/models, /v1/models/{id}, /health, /metrics
    GET  /dashboard (and its /dashboard/session and /dashboard/events; see dashboard.py)
    POST /tokenize, /detokenize  vLLM's: a text or conversation -> ids, and ids -> text
    GET  /version

A generation request goes: check the API key (401, auth.py) -> check the Content-Type (415)
-> read the body within its size and time limits (413, 408; body.py) -> on the tokenizer
thread: decode the JSON and check it (400), check the model name (404), tokenize, check it
fits the context (400; prompts.py) -> check the queue (429) and that the server is not
stopping (503) -> submit to the EngineLoop -> wait for Accepted/Rejected -> stream or collect
the tokens.

Thread rule: the engine thread owns the Engine. The handlers use its tokenizer only to encode,
and only on the one tokenizer thread (`ServerState.tokenizer_thread`, state.py): so the
tokenizer's piece cache is never written from two threads at once, and a multi-MiB prompt is
encoded while the event loop goes on serving /health and the other streams. The engine thread
only decodes, which reads immutable tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from sv_engine import Engine, StreamEvent
from sv_tokenizer import TokenizerError

from sv_server import tools
from sv_server.auth import ApiKeyMiddleware
from sv_server.body import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_READ_TIMEOUT_S,
    check_content_type,
    decode_json,
    read_body,
)
from sv_server.dashboard import dashboard_routes
from sv_server.engine_loop import Delivery, EngineLoop, Failed, Rejected, RequestHandle, Token
from sv_server.errors import ServerError, bad_request
from sv_server.logprobs import LogprobsWriter, Scored
from sv_server.metrics import CONTENT_TYPE, Metrics
from sv_server.prompts import (
    Parser,
    check_model,
    client_message,
    echo_text,
    encode_chat,
    prepare,
    sampling_params,
)
from sv_server.protocol import (
    ChunkEncoder,
    GenerationRequest,
    chunk_body,
    event_json,
    new_id,
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
    response_body,
    usage,
    usage_chunk_body,
)
from sv_server.reasoning import (
    ReasoningStream,
    ReasoningTokens,
    parser_for,
    split_reasoning,
)
from sv_server.state import ServerState
from sv_server.stops import StopStringMatcher

log = logging.getLogger("sv_server")

DEFAULT_MAX_QUEUE = 512
RETRY_AFTER_S = 1
DRAIN_POLL_S = 0.05  # how often a draining shutdown looks whether requests are still in flight


def create_app(
    engine: Engine,
    *,
    model_name: str,
    max_queue: int = DEFAULT_MAX_QUEUE,
    add_bos: bool = False,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    reasoning_parser: str | None = None,
    trust_request_chat_template: bool = False,
) -> Starlette:
    """The server for one engine. The engine thread starts and stops with the app's lifespan,
    so an app is served once. `add_bos`: put the BOS token before /v1/completions text prompts
    (see `sv_server.cli.wants_bos`). `api_key`: required as a bearer token on /v1/*.
    `max_request_bytes` and `read_timeout_s` bound a request body's size and arrival time.
    `reasoning_parser`: split chat answers into thinking and content (see reasoning.py);
    a ValueError naming --reasoning-parser when the model's tokenizer has no think tags.
    `trust_request_chat_template`: render a chat request's own `chat_template` (else a 400):
    a template runs the client's code on the server, sandboxed but unbounded in time, so it is
    the operator's choice, as vLLM's --trust-request-chat-template."""
    if max_queue < 1:
        raise ValueError(f"max_queue must be at least 1, got {max_queue}")
    if max_request_bytes < 1 or not read_timeout_s > 0:
        raise ValueError("max_request_bytes and read_timeout_s must be positive")
    reasoning = (
        parser_for(reasoning_parser, engine.tokenizer) if reasoning_parser is not None else None
    )
    metrics = Metrics()
    state = ServerState(
        loop=EngineLoop(engine, observer=metrics.observe),
        metrics=metrics,
        model_name=model_name,
        max_queue=max_queue,
        add_bos=add_bos,
        created=int(time.time()),
        max_request_bytes=max_request_bytes,
        read_timeout_s=read_timeout_s,
        reasoning=reasoning,
        trust_request_chat_template=trust_request_chat_template,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state.loop.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.to_thread(state.loop.stop)
            state.tokenizer_thread.shutdown(cancel_futures=True)

    def count_unauthorized() -> None:
        metrics.rejected["unauthorized"] += 1

    middleware = (
        [Middleware(ApiKeyMiddleware, api_key=api_key, on_refusal=count_unauthorized)]
        if api_key is not None
        else []
    )

    def handler(
        fn: Callable[[Request, ServerState], Any],
    ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            return await fn(request, state)  # type: ignore[no-any-return]

        return endpoint

    app = Starlette(
        routes=[
            Route("/v1/completions", handler(_completions), methods=["POST"]),
            Route("/v1/chat/completions", handler(_chat_completions), methods=["POST"]),
            Route("/v1/models", handler(_models), methods=["GET"]),
            Route("/v1/models/{model_id:path}", handler(_model), methods=["GET"]),
            Route("/tokenize", handler(_tokenize), methods=["POST"]),
            Route("/detokenize", handler(_detokenize), methods=["POST"]),
            Route("/version", handler(_version), methods=["GET"]),
            Route("/health", handler(_health), methods=["GET"]),
            Route("/metrics", handler(_metrics), methods=["GET"]),
            *dashboard_routes(state, api_key),
        ],
        exception_handlers={
            ServerError: _server_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        middleware=middleware,
        lifespan=lifespan,
    )
    app.state.server = state
    return app


async def shut_down(
    app: Starlette, drain_s: float, stop_draining: Callable[[], bool] = lambda: False
) -> None:
    """Stop the app's generations (before uvicorn's own shutdown): new ones get 503; those in
    flight may finish for up to `drain_s` seconds, or until `stop_draining()` (a second
    Ctrl-C); then, once the engine's current step is over, every one still running ends (a
    stream with an error event and `data: [DONE]`, a whole answer with a 503), and the engine
    thread stops, which frees every KV page."""
    state: ServerState = app.state.server
    state.closing.set()
    deadline = time.monotonic() + drain_s
    while state.loop.in_flight and time.monotonic() < deadline and not stop_draining():
        await asyncio.sleep(DRAIN_POLL_S)
    # The engine thread ends the requests after its current step. That step may take minutes
    # (a long prompt on a CPU): wait for it however long, or the streams would be cut off and
    # its pages left held; a second Ctrl-C stops waiting.
    state.loop.request_stop()
    while state.loop.is_alive and not stop_draining():
        await asyncio.sleep(DRAIN_POLL_S)
    if not state.loop.is_alive:
        state.loop.stop()  # the thread has ended: only reaps it


# --- errors ---------------------------------------------------------------------------------


def _error_response(error: ServerError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServerError)
    state: ServerState = request.app.state.server
    reason = {429: "queue_full", 500: "engine_error", 503: "shutting_down"}.get(
        exc.status, "invalid"
    )
    state.metrics.rejected[reason] += 1
    return _error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "method_not_allowed"
    return _error_response(
        ServerError(
            f"{exc.detail}: {request.method} {request.url.path}",
            status=exc.status_code,
            code=kind,
            headers=dict(exc.headers or {}),
        )
    )


async def _internal_error(_request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    return _error_response(
        ServerError(f"internal error: {type(exc).__name__}", status=500, type="server_error")
    )


# --- small endpoints ------------------------------------------------------------------------


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "sv",
        "max_model_len": state.max_model_len,
    }


async def _models(_request: Request, state: ServerState) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def _model(request: Request, state: ServerState) -> Response:
    check_model(state, request.path_params["model_id"])
    return JSONResponse(_model_card(state))


async def _health(_request: Request, state: ServerState) -> Response:
    if not state.loop.is_alive:
        return JSONResponse({"status": "engine loop stopped"}, status_code=503)
    return JSONResponse({"status": "ok", "last_engine_error": state.loop.last_error})


async def _metrics(_request: Request, state: ServerState) -> Response:
    text = state.metrics.render(state.loop.snapshot)
    return PlainTextResponse(text, headers={"Content-Type": CONTENT_TYPE})


async def _version(_request: Request, _state: ServerState) -> Response:
    return JSONResponse({"version": importlib.metadata.version("sv-server")})


# --- vLLM's /tokenize and /detokenize: on the tokenizer thread, as generation requests ------


async def _tokenize(request: Request, state: ServerState) -> Response:
    raw = await _read(request, state)
    ids = await asyncio.get_running_loop().run_in_executor(
        state.tokenizer_thread, partial(_tokenize_body, state, raw)
    )
    return JSONResponse({"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids})


def _tokenize_body(state: ServerState, raw: bytes) -> list[int]:
    req = parse_tokenize_request(decode_json(raw))
    check_model(state, req.model)
    bos = state.tokenizer.bos_id
    ids = [bos] if req.add_special_tokens and state.add_bos and bos is not None else []
    if req.messages is None:
        return ids + state.tokenizer.encode(req.prompt or "")
    return ids + encode_chat(state, req.messages, req.chat_options)


async def _detokenize(request: Request, state: ServerState) -> Response:
    raw = await _read(request, state)
    text = await asyncio.get_running_loop().run_in_executor(
        state.tokenizer_thread, partial(_detokenize_body, state, raw)
    )
    return JSONResponse({"prompt": text})


def _detokenize_body(state: ServerState, raw: bytes) -> str:
    model, tokens = parse_detokenize_request(decode_json(raw))
    check_model(state, model)
    try:
        return state.tokenizer.decode(tokens)
    except TokenizerError as e:
        raise bad_request(f"'tokens': {client_message(state, e)}", param="tokens") from e


# --- generation -----------------------------------------------------------------------------


async def _completions(request: Request, state: ServerState) -> Response:
    return await _generate(request, state, parse_completion_request)


async def _chat_completions(request: Request, state: ServerState) -> Response:
    return await _generate(request, state, parse_chat_request)


async def _read(request: Request, state: ServerState) -> bytes:
    """The request's body; or a 503 as soon as the server starts shutting down, rather than
    wait for the rest of a body that is slow to come (shutdown would wait for it, then cut the
    request off with a bare 500)."""
    check_content_type(request)
    reading = asyncio.ensure_future(
        read_body(request, state.max_request_bytes, state.read_timeout_s)
    )
    closing = asyncio.ensure_future(state.closing.wait())
    try:
        done, _ = await asyncio.wait({reading, closing}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        closing.cancel()
        reading.cancel()  # (a no-op once it is done)
    if reading not in done:
        raise _shutting_down(headers={"Connection": "close"})  # the body was not all read
    return reading.result()


async def _generate(request: Request, state: ServerState, parse: Parser) -> Response:
    raw = await _read(request, state)
    req, prompts, turns = await asyncio.get_running_loop().run_in_executor(
        state.tokenizer_thread, partial(prepare, state, raw, parse)
    )
    thinking = state.reasoning if req.kind == "chat" else None  # completions: the raw text
    params = sampling_params(state, req, prompts, turns, thinking)
    _check_open(state)
    if state.loop.queue_depth >= state.max_queue:
        raise ServerError(
            f"the server's queue is full ({state.max_queue} requests waiting); retry later",
            status=429,
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    # One engine request per choice of each prompt (choice index = prompt * n + choice, as
    # OpenAI numbers them): they batch in the engine, a prompt's choices share its pages, and
    # any failure ends them all.
    generations = [
        _Generation(
            state.loop,
            RequestHandle(ids, choice),
            StopStringMatcher(req.stop, include_stop=req.include_stop_str_in_output),
            echo=echo_text(state, req, i, ids),
            logprobs=None if req.logprobs is None else LogprobsWriter(req.kind, state.tokenizer),
            reasoning=None if thinking is None else ReasoningTokens(thinking, opened),
        )
        for i, (ids, turn, p) in enumerate(zip(prompts, turns, params, strict=True))
        # (looked up once per prompt: its choices share its ids)
        for opened in [thinking is not None and thinking.opens_in_thinking(turn)]
        for choice in p.choices()
    ]
    for generation in generations:
        state.loop.submit(generation.handle)
    try:
        for index, generation in enumerate(generations):
            first = await generation.handle.deliveries.get()
            if isinstance(first, Rejected):
                where = "" if len(prompts) == 1 else f"prompt[{index // req.n}]: "
                raise bad_request(where + first.message, code="rejected")
            if isinstance(first, Failed):
                raise first.error()
    except BaseException:  # refused, failed, or the handler was cancelled: end every one
        _close_all(generations)
        raise
    prompt_tokens = sum(map(len, prompts))  # once per prompt, however many choices
    state.metrics.prompt_tokens += prompt_tokens
    if req.stream:
        return _EventStream(
            _stream(req, state.model_name, generations, prompt_tokens),
            on_close=partial(_close_all, generations),
        )
    return await _collect(request, req, state.model_name, generations, prompt_tokens)


def _close_all(generations: list[_Generation]) -> None:
    for generation in generations:
        generation.close()


def _check_open(state: ServerState) -> None:
    # No await between this check and the submit: once `closing` is set, nothing new reaches
    # the engine thread, so its stop ends every request there is.
    if state.closing.is_set():
        raise _shutting_down()


def _shutting_down(headers: dict[str, str] | None = None) -> ServerError:
    return ServerError(
        "the server is shutting down",
        status=503,
        type="server_error",
        code="shutting_down",
        headers=headers,
    )


class _Generation:
    """The tokens of one accepted request, as text, with stop strings applied.

    Ends at the engine's finish ("stop"/"length") or at a stop string, which cancels the
    request in the engine at once. `close()` cancels it if it is still running (client gone).
    `echo`: text that comes first (the prompt, for completions' echo). With `logprobs`, the
    scored tokens gather as they come, until `take_logprobs` renders them. With `reasoning`
    (chat under a reasoning parser), its thinking tokens are counted.
    """

    def __init__(
        self,
        loop: EngineLoop,
        handle: RequestHandle,
        matcher: StopStringMatcher,
        *,
        echo: str = "",
        logprobs: LogprobsWriter | None = None,
        reasoning: ReasoningTokens | None = None,
    ) -> None:
        self._loop = loop
        self.handle = handle
        self._matcher = matcher
        self._echo = echo
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.logprobs = logprobs
        self.reasoning = reasoning
        self._scored: list[Scored] = []

    def take_logprobs(self) -> dict[str, Any] | None:
        """The log-probabilities of the tokens consumed since the last call, rendered."""
        if self.logprobs is None:
            return None
        scored, self._scored = self._scored, []
        return self.logprobs.render(scored)

    async def texts(self) -> AsyncIterator[str]:
        """The answer's text, piece by piece. Tokens that queued up while the client was being
        served come out as one piece: under load, fewer and larger chunks, not a backlog."""
        deliveries = self.handle.deliveries
        while self.finish_reason is None:
            pieces = [self._consume(await deliveries.get())]
            while self.finish_reason is None and not deliveries.empty():
                pieces.append(self._consume(deliveries.get_nowait()))
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
        if event.token_id is not None:
            self.completion_tokens += 1
            if self.reasoning is not None and event.finished != "stop":  # (a stop token: no text)
                self.reasoning.push(event.token_id)
        if self.logprobs is not None:
            self._score(event)
        text = self._matcher.push(event.text)
        if self._matcher.stopped:
            self.finish_reason = "stop"
            self._loop.cancel(self.handle)  # frees its pages before the next step
        elif event.finished is not None:
            if event.finished not in ("stop", "length"):
                self.close()
                raise ServerError(
                    f"the request ended unexpectedly ({event.finished})",
                    status=500,
                    type="server_error",
                )
            text += self._matcher.flush()
            self.finish_reason = event.finished
        return text

    def _score(self, event: StreamEvent) -> None:
        if event.prompt_logprobs is not None:  # echo: the prompt's tokens come first
            self._scored.extend(zip(self.handle.prompt_ids, event.prompt_logprobs, strict=True))
        # A stop token's text is not shown: nor is its log-probability.
        if event.token_id is not None and event.logprob is not None and event.finished != "stop":
            self._scored.append((event.token_id, event.logprob))

    def close(self) -> None:
        if self.finish_reason is None:
            self.finish_reason = "cancelled"
            self._loop.cancel(self.handle)


async def _collect(
    request: Request,
    req: GenerationRequest,
    model: str,
    generations: list[_Generation],
    prompt_tokens: int,
) -> Response:
    """A non-streamed answer; a client that hangs up meanwhile cancels every request of it.
    With a reasoning parser, each choice's text is split on its own."""

    async def collect() -> list[str]:
        async def text_of(generation: _Generation) -> str:
            return "".join([text async for text in generation.texts()])

        tasks = [asyncio.ensure_future(text_of(g)) for g in generations]
        try:
            return await asyncio.gather(*tasks)
        finally:  # one failed: the others stop waiting too
            for task in tasks:
                task.cancel()

    answer = asyncio.ensure_future(collect())
    hangup = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({answer, hangup}, return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():
            answer.cancel()
            return Response(status_code=499)  # nobody is listening; for the access log
        texts = answer.result()
    finally:
        hangup.cancel()
        _close_all(generations)
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
        new_id(req.kind),
        model,
        [(text, g.finish_reason or "") for text, g in zip(contents, generations, strict=True)],
        prompt_tokens,
        sum(g.completion_tokens for g in generations),
        logprobs=[g.take_logprobs() for g in generations] if req.logprobs is not None else None,
        reasoning=reasoning,
        reasoning_tokens=None if counts is None else sum(c.count for c in counts),
    )
    if req.tools is not None:
        tools.apply_to_response(body, req.tools)
    return JSONResponse(body)


def _reasoning_tokens(generations: list[_Generation]) -> list[ReasoningTokens] | None:
    """Each choice's thinking count, under a reasoning parser (chat); else None."""
    counts = [g.reasoning for g in generations if g.reasoning is not None]
    return counts or None


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else event_json(payload)
    return f"data: {data}\n\n"


async def _pieces(generations: list[_Generation]) -> AsyncIterator[tuple[int, str | None]]:
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


async def _stream(
    req: GenerationRequest,
    model: str,
    generations: list[_Generation],
    prompt_tokens: int,
) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk schema, ending with `data: [DONE]`. Each choice's
    chunks carry its index (for chat, its first one the role); a choice's last chunk carries
    its finish_reason. With a reasoning parser, each choice's thinking comes as
    `delta.reasoning_content` and only the rest goes on as content (to the tool-call parser).
    With `continuous_usage`, every chunk carries the usage so far (vLLM's)."""
    response_id, created, kind = new_id(req.kind), int(time.time()), req.kind
    counts = _reasoning_tokens(generations)

    def usage_so_far() -> dict[str, Any]:
        return usage(
            prompt_tokens,
            sum(g.completion_tokens for g in generations),
            None if counts is None else sum(c.count for c in counts),
        )

    def chunk(body: dict[str, Any]) -> str:
        if req.continuous_usage:
            body["usage"] = usage_so_far()
        return _sse(body)

    if kind == "chat":
        for index in range(len(generations)):
            yield chunk(chunk_body(kind, response_id, model, created, "", index=index, first=True))
    encoders = [
        ChunkEncoder(kind, response_id, model, created, index) for index in range(len(generations))
    ]
    # Chat with tools: each choice's text that may be a tool call is held back and sent as
    # its deltas, with the held tokens' logprobs on the first of them.
    calls = None
    if req.tools is not None and req.tools.parses:
        calls = [tools.ToolCallStream(req.tools) for _ in generations]
    splits = None
    if counts is not None:
        splits = [ReasoningStream(count.opens_in_thinking) for count in counts]

    def content_events(index: int, text: str | None) -> Iterator[str]:
        """The events of a piece of choice `index`'s content (None: the choice has ended)."""
        generation = generations[index]
        logprobs = None
        if calls is not None:
            deltas = calls[index].push(text) if text is not None else calls[index].finish()
            for i, delta in enumerate(deltas):
                yield chunk(
                    tools.delta_chunk(
                        response_id,
                        model,
                        created,
                        delta,
                        index=index,
                        logprobs=generation.take_logprobs() if i == 0 else None,
                    )
                )
            if text is not None:
                return
            logprobs = generation.take_logprobs()
        elif text is not None and generation.logprobs is None and not req.continuous_usage:
            yield encoders[index].text_event(text)
            return
        else:
            logprobs = generation.take_logprobs()
            if text is not None:
                yield chunk(
                    chunk_body(
                        kind, response_id, model, created, text, index=index, logprobs=logprobs
                    )
                )
                return
        last = None if kind == "chat" else ""
        reason = generation.finish_reason
        if calls is not None and calls[index].called:
            reason = "tool_calls"
        yield chunk(
            chunk_body(
                kind, response_id, model, created, last, reason, index=index, logprobs=logprobs
            )
        )

    try:
        async for index, text in _pieces(generations):
            if splits is None:
                for event in content_events(index, text):
                    yield event
                continue
            split = splits[index]
            reasoning, content = split.push(text) if text is not None else split.finish()
            if reasoning:
                logprobs = generations[index].take_logprobs()
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
                for event in content_events(index, content):
                    yield event
            if text is None:
                for event in content_events(index, None):
                    yield event
    except ServerError as e:  # the status line is gone already: the error goes in the stream
        _close_all(generations)
        yield _sse(e.body())
        yield _sse("[DONE]")
        return
    if req.include_usage:
        yield _sse(usage_chunk_body(kind, response_id, model, created, usage_so_far()))
    yield _sse("[DONE]")


class _EventStream(StreamingResponse):
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
