"""`--api-key`: every path under /v1, and /tokenize and /detokenize (they expose the model's
vocabulary), need `Authorization: Bearer KEY`; /health, /metrics and /version stay open (load
balancers and Prometheus scrape them without credentials).

An ASGI middleware rather than a check in each handler, so that nothing under /v1 answers an
unauthenticated client differently (not even an unknown route's 404 or a wrong method's 405).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from sv_server.errors import ServerError

PROTECTED_PREFIX = "/v1"
PROTECTED_PATHS = frozenset({"/tokenize", "/detokenize"})


class ApiKeyMiddleware:
    """401 in OpenAI's error shape unless the request carries the key; `on_refusal` counts it."""

    def __init__(self, app: ASGIApp, api_key: str, on_refusal: Callable[[], None]) -> None:
        if not api_key:
            raise ValueError("the API key must not be empty")
        self.app = app
        self._key = api_key.encode("utf-8")
        self._on_refusal = on_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _is_protected(scope["path"]):
            problem = self._problem(dict(scope["headers"]).get(b"authorization"))
            if problem is not None:
                self._on_refusal()
                error = ServerError(problem, status=401, code="invalid_api_key", headers=_CHALLENGE)
                response = JSONResponse(error.body(), status_code=401, headers=error.headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _problem(self, header: bytes | None) -> str | None:
        """What is wrong with the Authorization header, or None when it carries the key."""
        if header is None:
            return "this server needs an API key: send 'Authorization: Bearer KEY'"
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return "the Authorization header must be 'Bearer KEY'"
        # compare_digest takes as long for every wrong key of a length: no timing oracle
        if not hmac.compare_digest(token.strip(), self._key):
            return "incorrect API key"
        return None


_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _is_protected(path: str) -> bool:
    return (
        path == PROTECTED_PREFIX
        or path.startswith(PROTECTED_PREFIX + "/")
        or path.rstrip("/") in PROTECTED_PATHS
    )
