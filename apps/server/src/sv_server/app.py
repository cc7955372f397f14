"""The HTTP side: a Starlette app whose handlers turn OpenAI requests into engine requests.

    POST /v1/completions        raw text or token ids (not chat-formatted)
    POST /v1/chat/completions   messages, formatted with the model's chat format
    POST /v1/responses          OpenAI's Responses API: a chat in its shapes (responses_*.py)
    GET, DELETE /v1/responses/{id}, POST .../{id}/cancel, GET .../{id}/input_items
                                a stored response's: nothing is stored, so OpenAI's 404
    GET  /v1/models, /v1/models/{id}, /health, /metrics
    GET  /dashboard (and its /dashboard/session and /dashboard/events; see dashboard.py)
    POST /tokenize, /detokenize  vLLM's: a text or conversation -> ids, and ids -> text
    GET  /version

A generation request goes: check the API key (401, auth.py) -> check its X-Request-Id, which
names the answer (400, request_ids.py) -> check the Content-Type (415)
-> read the body within its size and time limits (413, 408; body.py) -> on the tokenizer
thread: decode the JSON and check it (400), check the model name (404), tokenize, check it
fits the context (400; prompts.py) -> check the queue (429) and that the server is not
stopping (503) -> submit to the EngineLoop -> wait for Accepted/Rejected -> stream or collect
the tokens (answers.py).

Thread rule: the engine thread owns the Engine. The handlers use its tokenizer only to encode,
and only on the tokenizer threads (`ServerState.tokenizer_threads`, state.py): so a multi-MiB
prompt is encoded while the event loop goes on serving /health and the other streams, and
while the other tokenizer threads prepare the requests that came after it. The tokenizer's
piece cache and chat-template cache take concurrent writers (each write one dict operation).
The engine thread only decodes, which reads immutable tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from sv_engine import Engine
from sv_tokenizer import TokenizerError

from sv_server.answers import EventStream, Generation, close_all, collect, stream
from sv_server.auth import ApiKeyMiddleware
from sv_server.body import (
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_READ_TIMEOUT_S,
    check_content_type,
    decode_json,
    read_body,
)
from sv_server.dashboard import dashboard_routes
from sv_server.engine_loop import EngineLoop, Failed, Rejected, RequestHandle
from sv_server.errors import ServerError, bad_request
from sv_server.logprobs import LogprobsWriter, PromptLogprobsWriter
from sv_server.metrics import CONTENT_TYPE, Metrics
from sv_server.prompts import (
    Parser,
    check_model,
    client_message,
    echo_lengths,
    echo_text,
    encode_chat,
    prepare,
    sampling_params,
)
from sv_server.reasoning import ReasoningTokens, parser_for
from sv_server.request_ids import RequestIdEcho, client_request_id
from sv_server.request_parsing import (
    GenerationRequest,
    parse_chat_request,
    parse_completion_request,
)
from sv_server.response_bodies import new_id
from sv_server.responses_answers import collect_response, stream_response
from sv_server.responses_parsing import parse_responses_request
from sv_server.state import ServerState
from sv_server.stops import StopStringMatcher
from sv_server.tokenize_parsing import parse_detokenize_request, parse_tokenize_request
from sv_server.tool_parsers import ToolCallParser, default_parser

log = logging.getLogger("sv_server")

DEFAULT_MAX_QUEUE = 512
RETRY_AFTER_S = 1
DRAIN_POLL_S = 0.05  # how often a draining shutdown looks whether requests are still in flight


# The routes that generate: their refusals are what sv_requests_rejected_total counts.
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})


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
    tool_call_parser: ToolCallParser | None = None,
) -> Starlette:
    """The server for one engine. The engine thread starts and stops with the app's lifespan,
    so an app is served once. `add_bos`: put the BOS token before /v1/completions text prompts
    (see `sv_server.cli.wants_bos`). `api_key`: required as a bearer token on /v1/*.
    `max_request_bytes` and `read_timeout_s` bound a request body's size and arrival time.
    `reasoning_parser`: split chat answers into thinking and content (see reasoning.py);
    a ValueError naming --reasoning-parser when the model's tokenizer has no think tags.
    `trust_request_chat_template`: render a chat request's own `chat_template` (else a 400):
    a template runs the client's code on the server, sandboxed but unbounded in time, so it is
    the operator's choice, as vLLM's --trust-request-chat-template. `tool_call_parser`: the
    format tool calls are read (and constrained) in, by default the tokenizer's
    (tool_parsers.py)."""
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
        tool_call_parser=tool_call_parser or default_parser(engine.tokenizer),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state.loop.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.to_thread(state.loop.stop)
            state.tokenizer_threads.shutdown(cancel_futures=True)

    def count_unauthorized() -> None:
        metrics.rejected["unauthorized"] += 1

    middleware = [Middleware(RequestIdEcho, paths=GENERATION_PATHS)]
    if api_key is not None:
        middleware.append(
            Middleware(ApiKeyMiddleware, api_key=api_key, on_refusal=count_unauthorized)
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
            Route("/v1/responses", handler(_responses), methods=["POST"]),
            Route(
                "/v1/responses/{response_id}", handler(_stored_response), methods=["GET", "DELETE"]
            ),
            # (a path its other methods share: OpenAI's POST /v1/responses/input_tokens, say)
            Route("/v1/responses/{response_id}", _unknown_route, methods=["POST", "PUT", "PATCH"]),
            Route(
                "/v1/responses/{response_id}/cancel", handler(_stored_response), methods=["POST"]
            ),
            Route(
                "/v1/responses/{response_id}/input_items",
                handler(_stored_response),
                methods=["GET"],
            ),
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
    stream with an error event, and `data: [DONE]` but on /v1/responses; a whole answer with
    a 503), and the engine thread stops, which frees every KV page."""
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
    if request.url.path in GENERATION_PATHS and not exc.counted:  # (sv_requests_rejected_total)
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
        # Starlette raises the error on after this answer, and uvicorn then closes the
        # connection: say so, so that a client does not send its next request into it.
        ServerError(
            f"internal error: {type(exc).__name__}",
            status=500,
            type="server_error",
            headers={"Connection": "close"},
        )
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
    text = state.metrics.render(*state.loop.observed())
    return PlainTextResponse(text, headers={"Content-Type": CONTENT_TYPE})


async def _version(_request: Request, _state: ServerState) -> Response:
    return JSONResponse({"version": importlib.metadata.version("sv-server")})


# --- vLLM's /tokenize and /detokenize: on the tokenizer threads, as generation requests ------


async def _tokenize(request: Request, state: ServerState) -> Response:
    raw = await _read(request, state)
    ids = await asyncio.get_running_loop().run_in_executor(
        state.tokenizer_threads, partial(_tokenize_body, state, raw)
    )
    return JSONResponse({"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids})


def _tokenize_body(state: ServerState, raw: bytes) -> list[int]:
    req = parse_tokenize_request(decode_json(raw))
    check_model(state, req.model)
    bos = state.tokenizer.bos_id
    ids = [bos] if req.add_special_tokens and state.add_bos and bos is not None else []
    if req.messages is None:
        return ids + state.tokenizer.encode(req.prompt or "")
    return ids + encode_chat(state, req.messages, req.chat_options, req.tools)


async def _detokenize(request: Request, state: ServerState) -> Response:
    raw = await _read(request, state)
    text = await asyncio.get_running_loop().run_in_executor(
        state.tokenizer_threads, partial(_detokenize_body, state, raw)
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
    return await _generate(
        request, state, partial(parse_chat_request, tool_call_parser=state.tool_call_parser)
    )


async def _responses(request: Request, state: ServerState) -> Response:
    return await _generate(
        request, state, partial(parse_responses_request, tool_call_parser=state.tool_call_parser)
    )


async def _stored_response(request: Request, _state: ServerState) -> Response:
    """OpenAI's calls on a stored response (retrieve, delete, cancel, list its input items):
    this server stores none (each answer says `store: false`), so every id is one it does not
    have, answered as OpenAI and vLLM answer one: a 404 naming it, `param` "response_id"."""
    response_id = request.path_params["response_id"]
    raise ServerError(
        f"Response with id '{response_id}' not found.", status=404, param="response_id"
    )


async def _unknown_route(_request: Request) -> Response:
    """A route's 404 for a path that a route of other methods matches: not a 405, as the path
    is not this server's (_http_error words it)."""
    raise HTTPException(404)


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
    arrived_at = time.perf_counter()  # (TTFT and latency count the body's reading too)
    base_id = client_request_id(request.headers)  # (before the body: a bad one is a 400 now)
    raw = await _read(request, state)
    req, prompts, turns = await asyncio.get_running_loop().run_in_executor(
        state.tokenizer_threads, partial(prepare, state, raw, parse)
    )
    # completions: the raw text; chat and responses: the thinking apart
    thinking = state.reasoning if req.kind != "completion" else None
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
        Generation(
            state.loop,
            RequestHandle(
                ids,
                choice,
                continuation=req.continues_text,
                arrived_at=arrived_at,
                stops=None
                if req.echo_only  # (no text of its own to stop)
                else StopStringMatcher(
                    req.stop,
                    include_stop=req.include_stop_str_in_output,
                    min_tokens=req.min_tokens,
                ),
            ),
            echo=echo,
            echo_lengths=echo_lengths(state, req, i, ids, echo),
            logprobs=None
            if req.logprobs is None
            else LogprobsWriter(req.kind, state.tokenizer, req.logprobs),
            reasoning=None if thinking is None else ReasoningTokens(opened),
            echo_only=req.echo_only,
            prompt_logprobs=None
            if req.prompt_logprobs is None
            else PromptLogprobsWriter(state.tokenizer, req.prompt_logprobs),
        )
        for i, (ids, turn, p) in enumerate(zip(prompts, turns, params, strict=True))
        # (looked up once per prompt: its choices share its ids)
        for opened in [thinking is not None and thinking.opens_in_thinking(turn)]
        for echo in [echo_text(state, req, i, ids)]
        for choice in p.choices()
    ]
    for generation in generations:
        state.loop.submit(generation.handle)
    try:
        for index, generation in enumerate(generations):
            first = await generation.handle.deliveries.get()
            if isinstance(first, Rejected):
                where = "" if len(prompts) == 1 else f"prompt[{index // req.n}]: "
                raise bad_request(where + first.message, first.param, code="rejected")
            if isinstance(first, Failed):
                raise first.error()
    except BaseException:  # refused, failed, or the handler was cancelled: end every one
        close_all(generations)
        raise
    prompt_tokens = sum(map(len, prompts))  # once per prompt, however many choices
    state.metrics.prompt_tokens += prompt_tokens
    if req.kind == "responses":
        return await _answer_response(request, req, state, generations[0], prompt_tokens)
    response_id = new_id(req.kind, base_id or req.request_id)  # (the header first, as vLLM)
    if req.stream:
        return EventStream(
            stream(req, state.model_name, generations, prompt_tokens, response_id),
            on_close=partial(close_all, generations),
        )
    return await collect(request, req, state.model_name, generations, prompt_tokens, response_id)


async def _answer_response(
    request: Request,
    req: GenerationRequest,
    state: ServerState,
    generation: Generation,
    prompt_tokens: int,
) -> Response:
    """The one generation of a /v1/responses request (it has no `n`), in that API's shapes."""
    if req.stream:
        return EventStream(
            stream_response(req, state.model_name, generation, prompt_tokens),
            on_close=partial(close_all, [generation]),
        )
    return await collect_response(request, req, state.model_name, generation, prompt_tokens)


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
