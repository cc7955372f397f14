"""A bounded load test: 64 concurrent streaming clients against one server, some hanging up
early. Every request must complete or be cleanly refused (429 + error JSON), and afterwards
no page is held and nothing runs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

CLIENTS = 64
MAX_TOKENS = 6
MAX_QUEUE = 40  # fewer than CLIENTS: a burst may be refused in part, and must be refused cleanly


async def _one_client(http: httpx.AsyncClient, i: int) -> tuple[str, Any]:
    """('done', usage) | ('hung_up', chunks seen) | ('refused', error)."""
    hang_up = i % 4 == 3
    if i % 2:
        path, body = "/v1/completions", {"prompt": f"Request {i}: the numbers from 1 to 10 are"}
    else:
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": f"Request {i}: say something."}]}
    body |= {
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.stream("POST", path, json=body) as response:
        if response.status_code == 429:
            error = json.loads(await response.aread())["error"]
            assert response.headers["retry-after"] and error["code"] == "queue_full"
            return "refused", error
        assert response.status_code == 200, await response.aread()
        chunks: list[Any] = []
        async for line in response.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            if line == "data: [DONE]":
                return "done", chunks[-1]["usage"]
            chunks.append(json.loads(line.removeprefix("data: ")))
            assert "error" not in chunks[-1]
            if hang_up and len(chunks) == 2:
                return "hung_up", len(chunks)  # leaving the block closes the connection
    raise AssertionError(f"client {i}: the stream ended without [DONE]")


async def _run_clients(url: str) -> list[tuple[str, Any]]:
    limits = httpx.Limits(max_connections=CLIENTS + 8)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        return await asyncio.gather(*(_one_client(http, i) for i in range(CLIENTS)))


@pytest.mark.slow
def test_concurrent_streaming_clients(make_server: Any) -> None:
    server = make_server(max_queue=MAX_QUEUE)
    try:
        before = server.wait_idle()
        outcomes = asyncio.run(_run_clients(server.url))
        done = [usage for kind, usage in outcomes if kind == "done"]
        hung_up = [n for kind, n in outcomes if kind == "hung_up"]
        refused = [e for kind, e in outcomes if kind == "refused"]
        assert len(done) + len(hung_up) + len(refused) == CLIENTS
        assert len(done) >= CLIENTS // 4, outcomes
        assert all(u["completion_tokens"] == MAX_TOKENS for u in done)

        after = server.wait_idle()
        assert after["sv_kv_cache_pages_used"] == 0
        assert after["sv_kv_cache_pages_free"] == after["sv_kv_cache_pages_capacity"]
        assert after["sv_requests_running"] == 0 and after["sv_requests_waiting"] == 0

        def delta(name: str) -> float:
            return after[name] - before[name]

        accepted = CLIENTS - len(refused)
        length = delta('sv_requests_finished_total{finish_reason="length"}')
        cancelled = delta('sv_requests_finished_total{finish_reason="cancelled"}')
        assert length + cancelled == accepted
        assert length >= len(done) and cancelled <= len(hung_up)
        assert delta('sv_requests_rejected_total{reason="queue_full"}') == len(refused)
        assert delta("sv_time_to_first_token_seconds_count") == accepted
    finally:
        server.stop()
