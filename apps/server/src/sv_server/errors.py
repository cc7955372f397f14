"""The one exception type of sv-server, and OpenAI's error body.

Every refusal the server sends is `{"error": {"message", "type", "param", "code"}}`, the shape
OpenAI's API (and so its client libraries) expects, with a status that says whose fault it is.
"""

from __future__ import annotations

from typing import Any


class ServerError(Exception):
    """A request the server refuses: the message names what was wrong and what was expected.

    status: the HTTP status (400 bad request, 404 unknown model or route, 429 queue full, ...).
    type:   OpenAI's error type ("invalid_request_error", "rate_limit_error", "server_error").
    param:  the request field at fault, when one is.
    code:   a short machine-readable reason ("context_length_exceeded", "model_not_found", ...).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",  # OpenAI's name for it
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        counted: bool = False,
    ) -> None:
        super().__init__(message)
        # Already in /metrics (a request that ran and then failed: its finish is "abort"), so
        # not counted again as one the server refused.
        self.counted = counted
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ServerError:
    return ServerError(message, status=400, param=param, code=code)
