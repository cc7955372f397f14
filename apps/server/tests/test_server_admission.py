"""What the admission policy means for a client (issue 15's first failure): a chat request
without max_tokens, as most clients send it, must not make short requests wait behind it.

Under the server's preemptive policy the long chat holds only the pages it uses, so a 2-token
completion sent while it streams is answered at once. Under the conservative policy the chat
reserves (nearly) the whole pool for its unbounded answer and the short request waits: the
same client sequence shows the difference, so the first test can fail."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from server_test_support import RunningServer, openai_error

LONG_CHAT = {
    "messages": [{"role": "user", "content": "Tell me a very long story about a dragon."}],
    "stream": True,
    "ignore_eos": True,  # the answer runs to the limit the server chose (no max_tokens given)
}
SHORT = {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}


def _short_request_while_a_long_chat_streams(
    server: RunningServer, timeout: float
) -> tuple[httpx.Response | None, float, int]:
    """Start the long chat, wait for its first tokens, then send the short request.
    Returns the short request's response (None if it timed out), its time, and how many
    chunks the chat had streamed by then. Closing the chat cancels it."""
    cancelled_before = cancelled(server)
    with (
        httpx.Client(base_url=server.url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=LONG_CHAT) as chat,
    ):
        assert chat.status_code == 200
        # One iterator, kept until the end: a discarded one closes the connection, which
        # cancels the chat (and would make this test pass for the wrong reason).
        lines = chat.iter_lines()
        chunks = 0
        while chunks < 3:
            chunks += next(lines).startswith("data: {")
        started = time.perf_counter()
        try:
            response: httpx.Response | None = http.post(
                "/v1/completions", json=SHORT, timeout=timeout
            )
        except httpx.ReadTimeout:
            response = None
        elapsed = time.perf_counter() - started
        # The chat still streams: it was not cancelled to make room. A short request that
        # timed out is cancelled itself when its connection closes, which the server counts a
        # moment later: wait for that one, then expect exactly it.
        assert any(next(lines).startswith("data: {") for _ in range(4))
        wanted = cancelled_before + (1 if response is None else 0)
        deadline = time.monotonic() + 10
        while cancelled(server) < wanted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cancelled(server) == wanted
        return response, elapsed, chunks


def cancelled(server: RunningServer) -> float:
    return server.metrics()['sv_requests_finished_total{finish_reason="cancelled"}']


def test_a_short_request_is_answered_while_a_chat_without_max_tokens_streams(
    server: RunningServer,
) -> None:
    response, elapsed, chunks = _short_request_while_a_long_chat_streams(server, timeout=10)
    assert chunks == 3
    assert response is not None and response.status_code == 200, response
    assert elapsed < 2.0, f"the 2-token request took {elapsed:.2f} s"
    body = response.json()
    assert body["usage"]["completion_tokens"] == 2
    assert body["choices"][0]["finish_reason"] == "length"
    metrics = server.wait_idle()
    assert metrics["sv_kv_cache_pages_used"] == 0
    assert metrics["sv_kv_cache_pages_free"] == metrics["sv_kv_cache_pages_capacity"]


def test_max_tokens_over_the_pool_is_a_400_naming_it(server: RunningServer) -> None:
    """An explicit max_tokens within the context but past what the pool could ever hold after
    the prompt: refused before queueing, naming max_tokens and the most that fits."""
    pool_tokens = int(server.metrics()["sv_kv_cache_pages_capacity"]) * 16
    with httpx.Client(base_url=server.url, timeout=60) as http:
        prompt = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        prompt_tokens = prompt.json()["count"]
        fit = pool_tokens + 1 - prompt_tokens  # the budget's pages: prompt + max_tokens - 1
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": fit + 1}
        error = openai_error(http.post("/v1/chat/completions", json=body), 400)
        assert error["param"] == "max_tokens" and error["code"] == "context_length_exceeded"
        assert f"holds at most {fit} new tokens" in error["message"]
        assert "request" not in error["message"]  # no engine request number
    assert server.wait_idle()["sv_kv_cache_pages_used"] == 0


def test_without_max_tokens_a_chat_gets_what_the_pool_can_hold(server: RunningServer) -> None:
    """The default for an omitted max_tokens is the context or the pool, whichever is
    smaller: never a budget the server itself would refuse."""
    metrics = server.metrics()
    pool_tokens = int(metrics["sv_kv_cache_pages_capacity"]) * 16
    with httpx.Client(base_url=server.url, timeout=60) as http:
        models = http.get("/v1/models").json()["data"][0]
        assert pool_tokens < models["max_model_len"], "this test needs a pool below the context"
        # Not run to the end (thousands of CPU tokens): a stream, cancelled after its first
        # event; a budget over the pool would be refused with a 400 instead.
        assert "max_tokens" not in LONG_CHAT
        with http.stream("POST", "/v1/chat/completions", json=LONG_CHAT) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert "error" not in json.loads(first.removeprefix("data: "))
    server.wait_idle()


def test_under_conservative_admission_the_short_request_waits(make_server: Any) -> None:
    conservative = make_server(admission="conservative")
    try:
        response, elapsed, _ = _short_request_while_a_long_chat_streams(conservative, timeout=3)
        assert response is None, f"answered in {elapsed:.2f} s: the chat reserved nothing?"
        metrics = conservative.wait_idle()
        assert metrics["sv_kv_cache_pages_used"] == 0
        assert metrics["sv_admission_waits_total"] > 0  # the short request's wait, exported
    finally:
        conservative.stop()


def test_speculating_server_streams_the_plain_text_and_counts_drafts(make_server: Any) -> None:
    from sv_scheduler import SpeculationConfig

    body = {
        "prompt": "Copy: the red fox and the blue bird sat on the old green fence.\nCopy: the red",
        "max_tokens": 16,
        "temperature": 0,
    }
    plain = make_server()
    try:
        want = httpx.post(f"{plain.url}/v1/completions", json=body, timeout=120).json()
    finally:
        plain.stop()
    speculating = make_server(speculation=SpeculationConfig())
    try:
        with httpx.stream(
            "POST", f"{speculating.url}/v1/completions", json={**body, "stream": True}, timeout=120
        ) as response:
            chunks = [
                json.loads(line.removeprefix("data: "))
                for line in response.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"
            ]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert text == want["choices"][0]["text"]
        m = speculating.wait_idle()
        assert 0 < m["sv_spec_accepted_tokens_total"] <= m["sv_spec_draft_tokens_total"]
        assert m["sv_spec_verifications_total"] > 0
        assert m["sv_kv_cache_pages_used"] == 0
    finally:
        speculating.stop()


def test_speculating_server_with_logprobs_penalties_and_a_schema(make_server: Any) -> None:
    """What clients send beside speculation: the same text and log-probabilities as a plain
    server, for a completion with logprobs and a penalty and a chat reply under a JSON schema."""
    from sv_scheduler import SpeculationConfig

    record = '{"name":"Ada","city":"London","year":1843}'
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "city": {"type": "string", "maxLength": 20},
            "year": {"type": "integer"},
        },
        "required": ["name", "city", "year"],
        "additionalProperties": False,
    }
    requests = [
        (
            "/v1/completions",
            {
                "prompt": "Copy: the red fox and the blue bird sat on the old fence.\nCopy: the red",
                "max_tokens": 16,
                "temperature": 0,
                "logprobs": 2,
                "frequency_penalty": 0.1,
            },
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": f"Copy this JSON exactly: {record}"}],
                "max_tokens": 40,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 2,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "record", "schema": schema},
                },
            },
        ),
    ]

    def answers(server: Any) -> tuple[list[dict[str, Any]], dict[str, float]]:
        try:
            choices = [
                httpx.post(f"{server.url}{path}", json=body, timeout=300).json()["choices"][0]
                for path, body in requests
            ]
            return choices, server.wait_idle()
        finally:
            server.stop()

    want, _ = answers(make_server())
    got, m = answers(make_server(speculation=SpeculationConfig()))
    assert m["sv_spec_accepted_tokens_total"] >= 5 and m["sv_kv_cache_pages_used"] == 0
    assert got[0]["text"] == want[0]["text"]
    assert got[1]["message"]["content"] == want[1]["message"]["content"]
    assert json.loads(got[1]["message"]["content"])["city"]
    tokens = got[0]["logprobs"]["tokens"], want[0]["logprobs"]["tokens"]
    assert tokens[0] == tokens[1]
    assert got[0]["logprobs"]["token_logprobs"] == pytest.approx(
        want[0]["logprobs"]["token_logprobs"], rel=1e-5, abs=1e-5
    )
    chat = [
        [(t["token"], t["logprob"]) for t in c["logprobs"]["content"]] for c in (got[1], want[1])
    ]
    assert [t for t, _ in chat[0]] == [t for t, _ in chat[1]]
    assert [v for _, v in chat[0]] == pytest.approx([v for _, v in chat[1]], rel=1e-5, abs=1e-5)
