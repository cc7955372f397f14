"""/dashboard: the engine live in a browser: the page pool, the queue and the running requests,
tokens/s, time to first token and inter-token latency.

    GET  /dashboard          the page (HTML, CSS and JS inline; it holds no data, so it is open)
    GET  /dashboard/session  {"key_required": bool, "authorized": bool}
    POST /dashboard/session  with `Authorization: Bearer KEY`: sets the session cookie
    GET  /dashboard/events   server-sent events, one JSON frame every FRAME_INTERVAL_S

The frames carry the engine thread's snapshot (the counters /metrics exports, plus the pool
picture the engine thread builds while someone watches) and the latency figures of `Metrics`.

With `--api-key`, the events need the key, but a browser's EventSource cannot send an
Authorization header. So the page asks for the key once (a form, or `/dashboard#key=KEY`, a
fragment the browser never sends anywhere), POSTs it in the header to /dashboard/session, and
gets an HttpOnly, SameSite=Strict cookie scoped to /dashboard. The cookie's value is an HMAC
of a per-process random nonce under the key: it does not reveal the key, and it stops working
when the server restarts. The key itself never goes into a URL (and so into no log or history).
Scripts may send `Authorization: Bearer KEY` to /dashboard/events directly.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from sv_trace.report import page

from sv_server.errors import ServerError
from sv_server.metrics import Histogram
from sv_server.state import ServerState

FRAME_INTERVAL_S = 0.5
COOKIE = "sv_dashboard"
COOKIE_PATH = "/dashboard"


class DashboardAuth:
    """The dashboard's key check: a bearer header, or the session cookie it hands out."""

    def __init__(self, api_key: str | None) -> None:
        self._key = None if api_key is None else api_key.encode("utf-8")
        nonce = secrets.token_bytes(16)
        self.cookie_value = (
            "" if self._key is None else hmac.new(self._key, nonce, hashlib.sha256).hexdigest()
        )

    @property
    def key_required(self) -> bool:
        return self._key is not None

    def bearer_ok(self, request: Request) -> bool:
        if self._key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode("utf-8"), self._key
        )

    def authorized(self, request: Request) -> bool:
        if self._key is None or self.bearer_ok(request):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode("utf-8"), self.cookie_value.encode("utf-8"))


def dashboard_routes(state: ServerState, api_key: str | None) -> list[Route]:
    auth = DashboardAuth(api_key)
    html = page(
        f"sv dashboard: {state.model_name}",
        ("common.css", "dashboard.css"),
        ("pool.js", "dashboard.js"),
        "dashboard.html",
    )

    async def dashboard(_request: Request) -> Response:
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    async def session(request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(
                {"key_required": auth.key_required, "authorized": auth.authorized(request)}
            )
        if not auth.bearer_ok(request):
            state.metrics.rejected["unauthorized"] += 1
            return JSONResponse(
                {"authorized": False, "error": "incorrect API key"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        response = JSONResponse({"authorized": True})
        if auth.key_required:
            response.set_cookie(
                COOKIE, auth.cookie_value, path=COOKIE_PATH, httponly=True, samesite="strict"
            )
        return response

    async def events(request: Request) -> Response:
        if not auth.authorized(request):
            state.metrics.rejected["unauthorized"] += 1
            error = ServerError(
                "the dashboard needs the API key: open /dashboard and give it there",
                status=401,
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            return JSONResponse(error.body(), status_code=401, headers=error.headers)
        return StreamingResponse(
            _frames(state),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return [
        Route("/dashboard", dashboard, methods=["GET"]),
        Route("/dashboard/session", session, methods=["GET", "POST"]),
        Route("/dashboard/events", events, methods=["GET"]),
    ]


async def _frames(state: ServerState) -> AsyncIterator[str]:
    """One frame now and one every FRAME_INTERVAL_S, until the client goes (Starlette then
    cancels this generator) or the server stops."""
    loop = state.loop
    loop.watchers += 1
    rate = _Rates(state)
    try:
        if loop.snapshot.view is None:
            loop.refresh()  # an idle engine thread takes a snapshot with the view now
            await asyncio.sleep(0.05)
        while not state.closing.is_set():
            yield f"data: {json.dumps(_frame(state, rate), separators=(',', ':'))}\n\n"
            await asyncio.sleep(FRAME_INTERVAL_S)
    finally:
        loop.watchers -= 1


class _Rates:
    """Per-frame rates: tokens/s, and the mean TTFT and inter-token latency since the last
    frame (the histograms' sums and counts, as a Prometheus rate() would take them)."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        metrics = state.metrics
        self._at = time.perf_counter()
        self._tokens = metrics.generation_tokens
        self._ttft = (metrics.ttft.sum, metrics.ttft.count)
        self._itl = (metrics.itl.sum, metrics.itl.count)

    def take(self) -> dict[str, float | None]:
        metrics = self._state.metrics
        now = time.perf_counter()
        tokens = metrics.generation_tokens
        elapsed = max(now - self._at, 1e-9)
        out = {
            "at_s": now,  # the server's clock: differences between frames are intervals
            "tokens_per_s": (tokens - self._tokens) / elapsed,
            "ttft_recent_ms": _mean_ms(metrics.ttft, self._ttft),
            "itl_recent_ms": _mean_ms(metrics.itl, self._itl),
        }
        self._at, self._tokens = now, tokens
        self._ttft = (metrics.ttft.sum, metrics.ttft.count)
        self._itl = (metrics.itl.sum, metrics.itl.count)
        return out


def _mean_ms(histogram: Histogram, before: tuple[float, int]) -> float | None:
    count = histogram.count - before[1]
    return None if count == 0 else (histogram.sum - before[0]) / count * 1e3


def _overall_ms(histogram: Histogram) -> float | None:
    return None if histogram.count == 0 else histogram.sum / histogram.count * 1e3


def _frame(state: ServerState, rates: _Rates) -> dict[str, Any]:
    snapshot, waiting = state.loop.observed()
    metrics = state.metrics
    stats = snapshot.stats
    return {
        "model": state.model_name,
        "waiting": waiting,
        "running": snapshot.running,
        "steps": None if stats is None else stats.steps,
        "preemptions": None if stats is None else stats.preemptions,
        "admission_waits": None if stats is None else stats.admission_waits,
        "generation_tokens": metrics.generation_tokens,
        "ttft_ms": _overall_ms(metrics.ttft),
        "itl_ms": _overall_ms(metrics.itl),
        "finished": dict(metrics.finished),
        **rates.take(),
        "view": snapshot.view,
    }
