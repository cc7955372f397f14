"""The client's `X-Request-Id` header on the generation routes, as vLLM reads it by default: a
completion's or chat answer's `id` is made of it (`cmpl-<id>`, `chatcmpl-<id>`; vLLM's
`_base_request_id`), or, without the header, of the body's `request_id` (vLLM's field on
completions and chat, which the header overrides there too); a Responses answer keeps its own.
The answer also carries the header back, as vLLM's `--enable-request-id-headers` does (only
the client's own: no id is made up for a request that sent none).

A value is at most MAX_REQUEST_ID_CHARS visible ASCII characters: else the request is a 400
naming the header (an id lands in logs and in a response header, where a control character or
a megabyte has no place); an empty one counts as none. Two requests may send the same id: it
names their answers only, the engine numbers its requests itself, so they cannot meet there.
"""

from __future__ import annotations

import re

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sv_server.errors import ServerError, bad_request
from sv_server.fields import shown_value

HEADER = "X-Request-Id"
MAX_REQUEST_ID_CHARS = 256
_VALID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID_CHARS}}}")


def client_request_id(headers: Headers) -> str | None:
    """The request's X-Request-Id; None when it sent none (or an empty one); a 400 naming the
    header for one that is too long, not visible ASCII, or sent twice over."""
    values = [v for v in headers.getlist(HEADER) if v]
    if not values:
        return None
    if len(set(values)) > 1:
        raise bad_request(f"the {HEADER} header is given {len(values)} times: give one", HEADER)
    return _checked(values[0], f"the {HEADER} header", HEADER)


def body_request_id(value: object) -> str | None:
    """The body's `request_id` (vLLM's), checked as the header is; None when absent or null."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"'request_id' must be a string, got {shown_value(value)}", "request_id")
    return _checked(value, "'request_id'", "request_id")


def _checked(value: str, what: str, param: str) -> str:
    if _VALID.fullmatch(value) is None:
        raise bad_request(
            f"{what} must be 1 to {MAX_REQUEST_ID_CHARS} visible ASCII characters "
            f"(no spaces or control characters), got {shown_value(value)}",
            param,
        )
    return value


class RequestIdEcho:
    """Puts a valid X-Request-Id of the request on its answer's headers (on `paths`), whatever
    the answer: one streamed or whole, or a refusal."""

    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app = app
        self._paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self._paths:
            await self.app(scope, receive, send)
            return
        try:
            request_id = client_request_id(Headers(scope=scope))
        except ServerError:  # (the handler refuses it; it is not repeated)
            request_id = None
        if request_id is None:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
