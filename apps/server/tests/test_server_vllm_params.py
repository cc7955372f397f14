"""vLLM's extra request fields that OpenAI-compatible clients send: `stream_options.
continuous_usage_stats`, checked against the server's own token accounting (one logprobs entry
per generated token) and its final usage chunk."""

from __future__ import annotations

import json
from typing import Any

import httpx
from server_test_support import RunningServer


def _stream_chunks(server: RunningServer, path: str, body: dict[str, Any]) -> list[Any]:
    """The JSON chunks of a streamed answer (without `[DONE]`)."""
    with httpx.stream("POST", server.url + path, json=body | {"stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        events = r.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    return [json.loads(e.removeprefix("data: ")) for e in events[:-2]]


def test_continuous_usage_counts_each_chunks_tokens(server: RunningServer) -> None:
    """Every chunk's completion_tokens is the number of tokens streamed so far (each has one
    logprobs entry: ignore_eos leaves no unshown stop token); the last usage is the final."""
    body = {
        "prompt": "The three primary colours are",
        "max_tokens": 12,
        "logprobs": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks = _stream_chunks(server, "/v1/completions", body)
    *text_chunks, final = chunks
    seen = 0
    prompt_tokens = final["usage"]["prompt_tokens"]
    for chunk in text_chunks:
        seen += len(chunk["choices"][0]["logprobs"]["tokens"])
        assert chunk["usage"] == {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": seen,
            "total_tokens": prompt_tokens + seen,
        }
    assert seen == 12 and final["choices"] == []
    assert final["usage"] == text_chunks[-1]["usage"]


def test_continuous_usage_in_chat_starts_at_zero_and_ends_at_the_total(
    server: RunningServer,
) -> None:
    body = {
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 10,
        "n": 2,
        "stream_options": {"continuous_usage_stats": True},
    }
    chunks = _stream_chunks(server, "/v1/chat/completions", body)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts[:2] == [0, 0]  # each choice's role chunk
    assert counts == sorted(counts) and 2 <= counts[-1] <= 20
    whole = {"completion_tokens": counts[-1], "prompt_tokens": chunks[0]["usage"]["prompt_tokens"]}
    assert all(c["choices"] for c in chunks)  # without include_usage: no usage-only chunk
    assert chunks[-1]["usage"]["total_tokens"] == sum(whole.values())


def test_continuous_usage_must_be_a_bool(server: RunningServer) -> None:
    body = {"prompt": "hi", "stream": True, "stream_options": {"continuous_usage_stats": "yes"}}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert "continuous_usage_stats" in response.json()["error"]["message"]
