"""uvicorn, set up for untrusted clients: a bound on connections, a deadline for request
headers, and a shutdown that ends every request in flight properly.

What uvicorn 0.54 gives and what is added here:

- `limit_concurrency` bounds connections (and requests) at once: past it, a request gets a
  plain-text 503. `_ConnectionBound` applies the same bound in front of the app instead, so
  the 503 is in OpenAI's error shape, with Retry-After, as the queue's 429 is.
- Idle kept-alive connections are closed after `timeout_keep_alive`. But a connection that
  never finishes its request headers has no timer at all (one byte every few seconds keeps it
  open for ever): `_HeaderDeadlineProtocol` closes it after the read timeout. The body has its
  own deadline, in the app (body.py: 408).
- On SIGINT/SIGTERM uvicorn stops accepting, then waits for requests to finish and cancels
  them after a timeout: a cut stream, with no error event and no `[DONE]`. `GracefulServer`
  first ends the requests itself (`sv_server.app.shut_down`: drain, then an error event and
  `[DONE]` in each stream, 503 for whole answers), so uvicorn only has finished ones to wait for.
  A second Ctrl-C (uvicorn's `force_exit`) ends the drain at once.
- The access log goes to standard output, as uvicorn's does; when that stops taking writes
  (`sv serve | head -1`: the reader is gone), `AccessLogHandler` ends the log with one warning
  rather than print a "Logging error" traceback for every request after.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import socket
import sys
from typing import Any

import uvicorn
import uvicorn.config
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from sv_server.app import RETRY_AFTER_S, shut_down
from sv_server.errors import ServerError

log = logging.getLogger("sv_server")

DEFAULT_MAX_CONNECTIONS = 1024
GRACEFUL_SHUTDOWN_S = 5  # for uvicorn, after the app has ended its requests: ample


class _HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus: a request's headers must be complete within
    `header_timeout_s` of the connection opening (or of the previous response), else the
    connection is closed. Set `header_timeout_s` on a subclass (`_protocol_with_deadline`)."""

    header_timeout_s: float

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def on_response_complete(self) -> None:
        self._await_headers()  # before the super call, which may start a pipelined request
        super().on_response_complete()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived
            self._stop_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        self._stop_waiting()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _stop_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection whose request headers took too long")
            self.transport.close()


def _protocol_with_deadline(timeout_s: float) -> type[_HeaderDeadlineProtocol]:
    return type(
        "HeaderDeadlineProtocol", (_HeaderDeadlineProtocol,), {"header_timeout_s": timeout_s}
    )


class _ConnectionBound:
    """The app behind uvicorn's bound on connections and requests at once (`limit_concurrency`,
    left unset), answered as the API answers: a request that finds more than `limit`
    connections open, or more than `limit` requests in flight (its own counted in both),
    gets a 503 in OpenAI's error shape with Retry-After, and its connection is closed."""

    def __init__(self, app: Starlette, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.server_state: ServerState | None = None  # the server's, once it is made

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.server_state
        if (
            scope["type"] == "http"
            and state is not None
            and max(len(state.connections), len(state.tasks)) > self.limit
        ):
            log.warning("refused a request: more than %d connections open", self.limit)
            self.app.state.server.metrics.rejected["too_many_connections"] += 1
            error = ServerError(
                f"the server has more than its {self.limit} connections open (--max-connections); "
                "retry later",
                status=503,
                type="server_error",
                code="too_many_connections",
                headers={"Retry-After": str(RETRY_AFTER_S), "Connection": "close"},
            )
            response = JSONResponse(error.body(), status_code=503, headers=error.headers)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class AccessLogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """uvicorn's access log handler (a stream handler on standard output) that stops at the
    first write that fails, saying so once (on the server's log, to stderr); requests go on."""

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is not None:  # (None: the log has stopped)
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):  # a bug in a record: logging's own report
            super().handleError(record)
            return
        self.stream = None
        # The interpreter's flush of standard output at exit would fail the same way (a
        # BrokenPipeError "ignored" on stderr): what is left of it goes nowhere instead.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        log.warning(
            "the access log stops here: standard output takes no more writes (%s)",
            error.strerror or error,
        )


def _log_config() -> dict[str, Any]:
    """uvicorn's logging setup, its access log written by `AccessLogHandler`."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["handlers"]["access"]["class"] = f"{__name__}.{AccessLogHandler.__name__}"
    return config


class GracefulServer(uvicorn.Server):
    """uvicorn's server, whose shutdown first stops accepting and ends the app's requests."""

    def __init__(self, config: uvicorn.Config, app: Starlette, drain_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._drain_s = drain_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections during the drain
        await shut_down(self._app, self._drain_s, stop_draining=lambda: self.force_exit)
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the app's lifespan shutdown when forced; left pending, it is
            # cancelled at exit with a traceback. Ours is quick: the engine has stopped.
            await self.lifespan.shutdown()


def build_server(
    app: Starlette,
    *,
    host: str,
    port: int,
    log_level: str,
    read_timeout_s: float,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    drain_s: float = 0.0,
) -> GracefulServer:
    """The uvicorn server `sv serve` runs (and the tests run): h11 with the header deadline,
    at most `max_connections` connections, requests drained for `drain_s` at shutdown."""
    bound = _ConnectionBound(app, max_connections)
    config = uvicorn.Config(
        bound,
        host=host,
        port=port,
        log_level=log_level,
        log_config=_log_config(),
        http=_protocol_with_deadline(read_timeout_s),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    server = GracefulServer(config, app, drain_s)
    bound.server_state = server.server_state
    return server
