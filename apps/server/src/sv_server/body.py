"""A request body, from the wire to a checked JSON value: every way it can be wrong is a 4xx.

    Content-Type not application/json        415
    Content-Encoding other than identity     415
    Content-Length or the bytes sent > limit  413, before the rest is read
    body not complete within the read timeout 408
    not JSON, nested too deep, a number too big to convert, NaN/Infinity, a lone surrogate  400

`read_body` runs on the event loop (it only awaits the socket); `decode_json` is CPU work
(a multi-MiB body takes tens of milliseconds) and is meant for a tokenizer thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request

from sv_server.errors import ServerError, bad_request

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""4 MiB: a whole 128k-token context as token ids (~1 MiB of JSON) or as text, with room."""

DEFAULT_READ_TIMEOUT_S = 30.0
MAX_JSON_DEPTH = 32
"""The deepest body OpenAI's schema needs is 5 (body -> messages -> message -> content ->
part); 32 leaves room for extensions and keeps every later walk over the value shallow."""

_JSON_MEDIA_TYPE = "application/json"
_CLOSE = {"Connection": "close"}  # the rest of the body is not read: the connection is spent


def check_content_type(request: Request) -> None:
    """415 unless the body is declared as JSON (parameters such as charset are fine).

    This is also what keeps web pages from driving a local server: a browser sends a
    cross-site POST without a CORS preflight only for text/plain, form and multipart bodies,
    and this server answers none of them. An application/json POST from another origin needs
    a preflight, which this server never approves (it sends no CORS headers)."""
    declared = request.headers.get("content-type")
    media_type = (declared or "").split(";", 1)[0].strip().lower()
    if media_type != _JSON_MEDIA_TYPE:
        shown = "no Content-Type" if declared is None else f"Content-Type {declared!r}"
        raise ServerError(
            f"the request body must be JSON (Content-Type: application/json), got {shown}",
            status=415,
            code="unsupported_media_type",
        )
    # A compressed body would otherwise be read as JSON text and refused as "not UTF-8".
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise ServerError(
            f"the request body must not be compressed, got Content-Encoding {encoding!r}",
            status=415,
            code="unsupported_media_type",
            headers={"Accept-Encoding": "identity"},  # RFC 7694: the codings accepted
        )


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body, refused (413) as soon as it is known to exceed `max_bytes`: from
    Content-Length before reading anything, else while counting a chunked body's bytes. A
    client that has not sent it all within `timeout_s` gets a 408."""
    declared = _content_length(request)
    if declared is not None and declared > max_bytes:
        raise _too_large(f"Content-Length is {declared} bytes", max_bytes)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_at_most(request, max_bytes)
    except TimeoutError:
        raise ServerError(
            f"the request body did not arrive within {timeout_s:g} s",
            status=408,
            code="request_timeout",
            headers=_CLOSE,
        ) from None


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not value.isascii() or not value.isdigit():
        raise bad_request(f"Content-Length must be a number of bytes, got {value!r}")
    return int(value)


async def _read_at_most(request: Request, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(f"the body exceeds {max_bytes} bytes", max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise bad_request("the client hung up before sending the whole body") from None
    return b"".join(chunks)


def _too_large(what: str, max_bytes: int) -> ServerError:
    return ServerError(
        f"the request body is too large: {what}; this server takes at most {max_bytes} bytes "
        "(--max-request-bytes)",
        status=413,
        code="request_too_large",
        headers=_CLOSE,
    )


def decode_json(raw: bytes) -> Any:
    """The body's JSON value, or a 400 that says what is wrong with it."""
    try:
        return json_value(raw)
    except JsonTextError as e:
        raise bad_request(f"the request body {e}") from None


class JsonTextError(ValueError):
    """What is wrong with a JSON text, worded to follow the name of what held it."""


def json_value(text: bytes | str) -> Any:
    """The JSON value of `text`, with the body's limits: no deeper than `MAX_JSON_DEPTH`, no
    number past Python's int-string conversion limit (4300 digits), no NaN or Infinity, no
    lone surrogate. Else a `JsonTextError` whose message completes "the request body ..." or
    "this text ...": also for JSON given as a string inside a body (a schema, a tool call's
    arguments), which the body's own checks never parsed."""
    value, _ = _checked(lambda: (json.loads(text, parse_constant=_refuse_constant), 0))
    return value


def json_value_at(text: str, start: int) -> tuple[Any, int]:
    """The JSON value that begins at `text[start]` (no whitespace before it), with the same
    limits as `json_value`, and the index just past it: a value inside other text."""
    return _checked(lambda: _DECODER.raw_decode(text, start))


def _checked(decode: Callable[[], tuple[Any, int]]) -> tuple[Any, int]:
    """What `decode` returns (a value and the index after it), its errors as
    `JsonTextError`, the value checked."""
    try:
        value, end = decode()
    except JsonTextError:
        raise
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as e:
        raise JsonTextError(f"is not valid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise JsonTextError(f"is not UTF-8: {e.reason} at byte {e.start}") from None
    except ValueError as e:  # an integer beyond Python's int-string conversion limit
        raise JsonTextError(f"has a number that is too large: {e}") from None
    _check_value(value)
    return value, end


def _refuse_constant(name: str) -> Any:
    raise JsonTextError(f"is not valid JSON: {name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _too_deep() -> JsonTextError:
    return JsonTextError(f"is nested deeper than {MAX_JSON_DEPTH} levels")


def _check_value(value: Any) -> None:
    """Depth and strings of a decoded value, walked without recursion: a lone surrogate
    (`"\\ud800"` is valid JSON) cannot be encoded as UTF-8 for the tokenizer or a reply."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_string(item)
        elif isinstance(item, list | dict):
            if depth > MAX_JSON_DEPTH:
                raise _too_deep()
            if isinstance(item, dict):
                for key in item:
                    _check_string(key)
                item = item.values()
            stack.extend(
                (child, depth + 1) for child in item if isinstance(child, str | list | dict)
            )


def _check_string(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise JsonTextError(
                f"has a lone UTF-16 surrogate (\\u{ord(text[e.start]):04x}): not a character"
            ) from None
