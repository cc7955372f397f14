"""Untrusted traffic against a real server: the API key, Content-Type, body size, JSON limits,
slow clients, the connection bound, and a /health that answers while a huge prompt is
tokenized. Every refusal is a 4xx in OpenAI's error shape within 1 s, and the server is idle
and healthy afterwards. Raw sockets where a client library would not misbehave enough."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from server_test_support import RunningServer, openai_error

KEY = "sv-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON_TYPE = {"Content-Type": "application/json"}
READ_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 6
MAX_BODY = 256 * 1024
REFUSAL_S = 1.0  # the bound for every 4xx


@pytest.fixture(scope="module")
def guarded(make_server: Any) -> Iterator[RunningServer]:
    """A server with every limit set low enough to reach quickly."""
    server = make_server(
        api_key=KEY,
        read_timeout_s=READ_TIMEOUT_S,
        max_connections=MAX_CONNECTIONS,
        max_request_bytes=MAX_BODY,
    )
    yield server
    server.stop()


def _timed_post(url: str, **kw: Any) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = httpx.post(url, timeout=30, **kw)
    return response, time.perf_counter() - start


def _address(server: RunningServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _read_until_closed(sock: socket.socket, wait_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed it
    (raises if it is still open after `wait_s`)."""
    start = time.perf_counter()
    sock.settimeout(wait_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.perf_counter() - start


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _json_of(raw: bytes) -> dict[str, Any]:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])  # type: ignore[no-any-return]


def _headers(path: str, extra: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    ).encode()


# --- the API key ---------------------------------------------------------------------------


def test_api_key_guards_every_v1_route_and_tokenize(guarded: RunningServer) -> None:
    before = guarded.metrics()
    refusals = [
        ("GET", "/v1/models", {}),
        ("GET", f"/v1/models/{guarded.model_name}", {}),
        ("POST", "/v1/completions", {"Authorization": "Bearer wrong"}),
        ("POST", "/v1/chat/completions", {"Authorization": f"Bearer {KEY}x"}),
        ("POST", "/v1/responses", {}),
        ("POST", "/v1/completions", {"Authorization": f"Basic {KEY}"}),
        ("POST", "/v1/completions", {"Authorization": KEY}),
        ("GET", "/v1/nothing", {}),  # no route: still 401, nothing under /v1 is told apart
        ("GET", "/v1/completions", {}),  # wrong method: 401 too
        ("POST", "/tokenize", {}),  # vLLM's routes at the root: they expose the model too
        ("POST", "/detokenize", {"Authorization": "Bearer wrong"}),
        ("GET", "/tokenize/", {}),
    ]
    body = {"prompt": "hi", "max_tokens": 2}
    for method, path, headers in refusals:
        start = time.perf_counter()
        response = httpx.request(method, guarded.url + path, json=body, headers=headers)
        assert time.perf_counter() - start < REFUSAL_S
        error = openai_error(response, 401)
        assert error["code"] == "invalid_api_key", (method, path, headers)
        assert response.headers["www-authenticate"] == "Bearer"
    after = guarded.metrics()
    refused = 'sv_requests_rejected_total{reason="unauthorized"}'
    assert after[refused] - before[refused] == len(refusals)
    assert after["sv_generation_tokens_total"] == before["sv_generation_tokens_total"]


def test_the_official_client_with_and_without_the_key(guarded: RunningServer) -> None:
    wrong = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.completions.create(model=guarded.model_name, prompt="hi", max_tokens=2)
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    right = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0, timeout=60)
    answer = right.completions.create(model=guarded.model_name, prompt="hi", max_tokens=2)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1
    assert [m.id for m in right.models.list().data] == [guarded.model_name]


def test_health_metrics_and_version_need_no_key(guarded: RunningServer) -> None:
    assert httpx.get(f"{guarded.url}/health").status_code == 200
    assert httpx.get(f"{guarded.url}/version").json()["version"]
    tokenized = httpx.post(f"{guarded.url}/tokenize", json={"prompt": "hi"}, headers=AUTH)
    assert tokenized.status_code == 200 and tokenized.json()["count"] >= 1
    metrics = httpx.get(f"{guarded.url}/metrics")
    assert metrics.status_code == 200 and "sv_kv_cache_pages_free" in metrics.text


# --- Content-Type --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",  # what a cross-site <form> or fetch() can send without a preflight
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        None,
    ],
)
def test_a_body_not_declared_json_is_415(guarded: RunningServer, content_type: str | None) -> None:
    headers = dict(AUTH) | ({"Content-Type": content_type} if content_type else {})
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    paths = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize", "/detokenize")
    for path in paths:
        response, took = _timed_post(guarded.url + path, content=body, headers=headers)
        assert took < REFUSAL_S
        assert openai_error(response, 415)["code"] == "unsupported_media_type"


def test_a_compressed_body_is_415_naming_its_encoding(guarded: RunningServer) -> None:
    """gzip is not taken: the refusal says so, not that the bytes are not UTF-8 JSON."""
    body = gzip.compress(json.dumps({"prompt": "hi", "max_tokens": 2}).encode())
    headers = AUTH | {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    response = httpx.post(f"{guarded.url}/v1/completions", content=body, headers=headers)
    error = openai_error(response, 415)
    assert error["code"] == "unsupported_media_type" and "gzip" in error["message"]
    assert response.headers["accept-encoding"] == "identity"


def test_json_with_a_charset_is_fine(guarded: RunningServer) -> None:
    headers = AUTH | {"Content-Type": "Application/JSON; charset=utf-8"}
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    response = httpx.post(f"{guarded.url}/v1/completions", content=body, headers=headers)
    assert response.status_code == 200, response.text


# --- body size -----------------------------------------------------------------------------


def test_a_declared_oversized_body_is_413_before_it_is_sent(guarded: RunningServer) -> None:
    """50 MB announced, 1 KiB sent: the answer comes at once and the connection closes."""
    with socket.create_connection(_address(guarded)) as sock:
        sock.sendall(_headers("/v1/completions", "Content-Length: 50000000\r\n") + b"x" * 1024)
        raw, took = _read_until_closed(sock, wait_s=5)
    assert took < REFUSAL_S
    assert _status(raw) == 413
    error = _json_of(raw)["error"]
    assert error["code"] == "request_too_large" and "50000000" in error["message"]


def test_a_chunked_body_is_counted_and_cut_off_at_the_limit(guarded: RunningServer) -> None:
    chunk = b"[" * 16384
    with socket.create_connection(_address(guarded)) as sock:
        sock.sendall(_headers("/v1/completions", "Transfer-Encoding: chunked\r\n"))
        sock.settimeout(0.05)
        sent, raw = 0, b""
        while not raw and sent < 16 * MAX_BODY:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
                raw = sock.recv(65536)
            except TimeoutError:
                pass
            except ConnectionError:
                break  # closed after the answer: read what came
        more, _ = _read_until_closed(sock, wait_s=5)
    raw += more
    assert _status(raw) == 413, raw[:200]
    assert sent <= MAX_BODY + 4 * len(chunk)  # refused as the limit was crossed


def test_an_oversized_body_from_httpx_is_413(guarded: RunningServer) -> None:
    body = json.dumps({"prompt": "x" * MAX_BODY}).encode()
    for path in ("/v1/completions", "/tokenize"):
        response, took = _timed_post(guarded.url + path, content=body, headers=AUTH | JSON_TYPE)
        assert took < REFUSAL_S
        assert openai_error(response, 413)["code"] == "request_too_large"


# --- JSON limits ---------------------------------------------------------------------------

DEEP = 10_000
ODD_JSON = [
    # (body, what the message must say)
    (b"[" * DEEP + b"]" * DEEP, "nested deeper"),
    (b'{"a":' * DEEP + b"1" + b"}" * DEEP, "nested deeper"),
    (b'{"prompt": "hi", "stop": ' + b"[" * 40 + b"]" * 40 + b"}", "nested deeper"),
    (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "too large"),
    (b'{"prompt": [' + b"1" * 5000 + b"]}", "too large"),
    (b'{"prompt": "hi", "seed": ' + b"9" * 4000 + b"}", "'seed' must be between"),
    (b'{"prompt": "hi", "temperature": 1e999}', "'temperature' must be a number"),
    (b'{"prompt": "hi", "top_p": -1e999}', "'top_p' must be a number"),
    (b'{"prompt": "hi", "max_tokens": 1e400}', "'max_tokens' must be an integer"),
    (b'{"prompt": "hi", "temperature": NaN}', "NaN is not a JSON number"),
    (b'{"prompt": "hi", "temperature": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"prompt": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'{"\\udfff": 1, "prompt": "hi"}', "lone UTF-16 surrogate"),
    (b'{"prompt": "hi", "n": ' + b"7" * 4000 + b"}", "'n' must be between 1 and 128"),
    (b'{"prompt": "\xff\xfe"}', "not UTF-8"),
    (b'{"prompt": "hi"', "not valid JSON"),
]


@pytest.mark.parametrize(("body", "says"), ODD_JSON, ids=range(len(ODD_JSON)))
def test_odd_json_is_400_never_500(guarded: RunningServer, body: bytes, says: str) -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses"):
        response, took = _timed_post(guarded.url + path, content=body, headers=AUTH | JSON_TYPE)
        assert took < REFUSAL_S, f"{took:.2f} s"
        error = openai_error(response, 400)
        if path == "/v1/completions":  # (chat names its own missing field first, for some)
            assert says in error["message"], error
        assert len(error["message"]) < 500  # a huge value is not echoed back whole


DEEP_TEXT = "[" * 2000 + "]" * 2000
BIG_NUMBER_TEXT = '{"a": ' + "1" * 5000 + "}"


def _assistant_call(arguments: str) -> dict[str, Any]:
    function = {"name": "f", "arguments": arguments}
    return {
        "role": "assistant",
        "tool_calls": [{"id": "c", "type": "function", "function": function}],
    }


def _responses_call(arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": "c", "name": "f", "arguments": arguments}


CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
JSON_IN_TEXT = [
    # (path, body, the param named, what the message must say): JSON given as a string
    ("/v1/chat/completions", CHAT | {"guided_json": DEEP_TEXT}, "guided_json", "nested deeper"),
    ("/v1/chat/completions", CHAT | {"guided_json": BIG_NUMBER_TEXT}, "guided_json", "too large"),
    ("/v1/chat/completions", CHAT | {"guided_json": '{"a": NaN}'}, "guided_json", "NaN"),
    *(
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}, _assistant_call(text)]},
            "messages[1]",
            says,
        )
        for text, says in ((DEEP_TEXT, "nested deeper"), (BIG_NUMBER_TEXT, "too large"))
    ),
    *(
        ("/v1/responses", {"input": [_responses_call(text)]}, "input", says)
        for text, says in ((DEEP_TEXT, "nested deeper"), (BIG_NUMBER_TEXT, "too large"))
    ),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"9" * 5000: 1}}, "logit_bias", "token ids"),
]


@pytest.mark.parametrize(("path", "body", "param", "says"), JSON_IN_TEXT)
def test_json_inside_a_string_has_the_bodys_limits(
    guarded: RunningServer, path: str, body: dict[str, Any], param: str, says: str
) -> None:
    """A schema or a tool call's arguments given as JSON text is parsed after the body's own
    checks: deep, huge or NaN there is a 400 naming the field too, and the connection stays
    open for the next request (a 500 would close it)."""
    with httpx.Client(headers=AUTH, timeout=30) as client:
        response = client.post(guarded.url + path, json=body)
        error = openai_error(response, 400)
        assert error["param"] == param and says in error["message"], error
        assert len(error["message"]) < 500
        assert client.get(f"{guarded.url}/health").status_code == 200
        assert client.get(f"{guarded.url}/health").status_code == 200


def test_a_top_k_beyond_any_integer_type_is_harmless(guarded: RunningServer) -> None:
    before = guarded.metrics()
    body = {"prompt": "hi", "max_tokens": 2, "top_k": 10**30, "temperature": 1.0}
    response = httpx.post(f"{guarded.url}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    after = guarded.metrics()
    assert after["sv_engine_step_failures_total"] == before["sv_engine_step_failures_total"]


# --- slow clients and the connection bound -----------------------------------------------------


def test_a_body_that_never_comes_is_408(guarded: RunningServer) -> None:
    with socket.create_connection(_address(guarded)) as sock:
        sock.sendall(_headers("/v1/completions", "Content-Length: 100\r\n") + b'{"pro')
        raw, took = _read_until_closed(sock, wait_s=READ_TIMEOUT_S + 5)
    # The server's clock starts when the headers arrive, a moment before this client's: allow
    # that moment (CI once measured 0.996 s for a 1 s timeout), not an early answer.
    assert 0.9 * READ_TIMEOUT_S <= took < READ_TIMEOUT_S + REFUSAL_S
    assert _status(raw) == 408 and _json_of(raw)["error"]["code"] == "request_timeout"


def test_a_trickling_body_is_408_at_the_deadline(guarded: RunningServer) -> None:
    """One byte every 0.2 s keeps every per-read timer happy; the deadline is for the body."""
    with socket.create_connection(_address(guarded)) as sock:
        sock.sendall(_headers("/v1/completions", "Content-Length: 1000\r\n"))
        start = time.perf_counter()
        raw = b""
        sock.settimeout(0.2)
        while not raw and time.perf_counter() - start < READ_TIMEOUT_S + 5:
            sock.sendall(b" ")
            with contextlib.suppress(TimeoutError):
                raw = sock.recv(65536)
        took = time.perf_counter() - start
    assert _status(raw) == 408
    assert took < READ_TIMEOUT_S + REFUSAL_S


def test_headers_that_never_end_close_the_connection(guarded: RunningServer) -> None:
    with socket.create_connection(_address(guarded)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
        start = time.perf_counter()
        sock.settimeout(0.2)
        closed = False
        while not closed and time.perf_counter() - start < READ_TIMEOUT_S + 5:
            try:
                sock.sendall(b"X")  # trickled header bytes do not extend the deadline
                closed = sock.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionError:
                closed = True
        took = time.perf_counter() - start
    assert closed and took < READ_TIMEOUT_S + REFUSAL_S


def test_connections_past_the_bound_get_503_until_the_slow_ones_are_closed(
    guarded: RunningServer,
) -> None:
    address = _address(guarded)
    slow = [socket.create_connection(address) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in slow:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # and nothing more
        time.sleep(0.1)
        refused = httpx.get(f"{guarded.url}/health")
        error = openai_error(refused, 503)  # the API's error shape, as the queue's 429 has
        assert error["code"] == "too_many_connections" and error["type"] == "server_error"
        assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"
        for sock in slow:  # the header deadline frees their places
            _read_until_closed(sock, wait_s=READ_TIMEOUT_S + 5)
        assert httpx.get(f"{guarded.url}/health").status_code == 200
        # counted as a refusal, with its own reason (it was missing from the metric)
        metrics = guarded.metrics()
        assert metrics['sv_requests_rejected_total{reason="too_many_connections"}'] >= 1
    finally:
        for sock in slow:
            sock.close()


def test_time_to_first_token_counts_from_the_requests_arrival(server: RunningServer) -> None:
    """A body that takes a second to arrive: TTFT and latency include that second (they were
    stamped after the body was read and tokenized: 0.085 s for a 3.3 s answer)."""
    first = "sv_time_to_first_token_seconds_sum"
    latency = "sv_request_latency_seconds_sum"
    before = server.wait_idle()
    body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(_address(server)) as sock:
        sock.sendall(head + body[:5])
        time.sleep(1.0)
        sock.sendall(body[5:])
        answer, _ = _read_until_closed(sock, wait_s=60)
    assert answer.startswith(b"HTTP/1.1 200")
    after = server.wait_idle()
    assert after[first] - before[first] >= 1.0
    assert after[latency] - before[latency] >= 1.0


def test_refusals_counted_are_the_generation_routes(server: RunningServer) -> None:
    """sv_requests_rejected_total counts refused generation requests: a bad /detokenize or a
    lookup of an unknown model is no refused generation (they were counted as invalid)."""
    invalid = 'sv_requests_rejected_total{reason="invalid"}'
    before = server.metrics()[invalid]
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": [-1]}).status_code == 400
    assert httpx.get(f"{server.url}/v1/models/nope").status_code == 404
    assert server.metrics()[invalid] == before
    assert httpx.post(f"{server.url}/v1/completions", json={"prompt": 5}).status_code == 400
    assert server.metrics()[invalid] == before + 1


# --- tokenization off the event loop ---------------------------------------------------------


# The /health client runs in a process of its own: the test server runs in this one, and a
# client thread here would compete with the server for this process's GIL (a real client
# does not). It polls every 20 ms until its stdin closes, then prints the latencies.
POLLER = """
import json, socket, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
latencies = []
with socket.create_connection((host, port)) as sock:
    print("ready", flush=True)
    while not done.is_set():
        start = time.perf_counter()
        sock.sendall(b"GET /health HTTP/1.1\\r\\nHost: test\\r\\n\\r\\n")
        reply = b""
        while not reply.endswith(b"}"):
            reply += sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200"), reply
        latencies.append(time.perf_counter() - start)
        time.sleep(0.02)
print(json.dumps(latencies))
"""


def _while_polling_health(
    server: RunningServer, send: Any
) -> tuple[httpx.Response, float, list[float]]:
    """`send()`'s response and duration, and the /health latencies seen meanwhile."""
    poller = subprocess.Popen(
        [sys.executable, "-c", POLLER, *map(str, _address(server))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert poller.stdin is not None and poller.stdout is not None
    try:
        assert poller.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        start = time.perf_counter()
        response = send()
        took = time.perf_counter() - start
        out, _ = poller.communicate(timeout=30)
    finally:
        if poller.poll() is None:
            poller.kill()
    assert poller.returncode == 0
    return response, took, json.loads(out.splitlines()[-1])


def test_a_request_is_not_held_up_by_one_still_being_tokenized(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bodies are tokenized on several threads: while one prompt is still being encoded (here
    held on an event, as a multi-MiB one takes seconds), a request sent after it is prepared
    and answered. With one tokenizer thread it waited for the whole encode."""
    tokenizer = server.app.state.server.tokenizer
    encode = tokenizer.encode
    started, release = threading.Event(), threading.Event()

    def held_encode(text: str, **options: Any) -> list[int]:
        if "HOLD-ME" in text:
            started.set()
            release.wait(60)
        return encode(text, **options)  # type: ignore[no-any-return]

    monkeypatch.setattr(tokenizer, "encode", held_encode)
    url = f"{server.url}/v1/completions"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, url, json={"prompt": "HOLD-ME", "max_tokens": 1}, timeout=90)
        try:
            assert started.wait(30)
            quick = httpx.post(url, json={"prompt": "Hi", "max_tokens": 1}, timeout=20)
            assert quick.status_code == 200 and not held.done()
        finally:
            release.set()
        assert held.result().status_code == 200


def test_health_answers_while_a_maximum_size_chat_prompt_is_tokenized(
    server: RunningServer,
) -> None:
    """The default server (4 MiB bodies): a chat prompt of almost 4 MiB takes seconds to
    tokenize; /health must answer within 200 ms (the issue saw 6-16 s).

    The tokenizer threads still share the GIL, and the tokenizer's C-level loops over all of
    a text's pieces hold it for up to ~100 ms at this size: alone, the slowest /health is
    70-140 ms; with `make test -n 2` on an oversubscribed 2-core machine it was once 204 ms.
    So 9 in 10 answers must take under 200 ms, and every one under half the request's time,
    within 250-500 ms; tokenizing on the event loop (the bug) holds a /health for the whole
    encode, 1.4-3 s on a slow machine and about 0.4 s on a fast quiet one, which is why the
    bound moves with the request's time (a fixed 500 ms needed the request to take longer than
    that, and once it took 491 ms)."""
    from sv_server.body import DEFAULT_MAX_REQUEST_BYTES

    words = "hello world, how are you today? " * (DEFAULT_MAX_REQUEST_BYTES // 32)
    content = words[: DEFAULT_MAX_REQUEST_BYTES - 200]
    body = {"messages": [{"role": "user", "content": content}]}

    def send() -> httpx.Response:
        return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)

    response, took, latencies = _while_polling_health(server, send)
    assert openai_error(response, 400)["code"] == "context_length_exceeded"
    assert took > 0.35, "the prompt was not heavy enough to test anything"
    assert len(latencies) >= 5
    latencies.sort()
    shown = f"{len(latencies)} answers, slowest {[round(t * 1000) for t in latencies[-5:]]} ms"
    assert latencies[len(latencies) * 9 // 10] < 0.2, shown
    bound = min(0.5, max(0.25, took / 2))
    assert latencies[-1] < bound, f"{shown}; the request took {took:.2f} s"


def test_a_raw_text_prompt_that_cannot_fit_is_refused_before_tokenizing(
    server: RunningServer,
) -> None:
    """4 MiB of text has at least 4 MiB / (longest token) tokens: over the context, known at
    once. (Tokenizing it would take seconds.)"""
    from sv_server.body import DEFAULT_MAX_REQUEST_BYTES

    body = {"prompt": "a" * (DEFAULT_MAX_REQUEST_BYTES - 100)}
    response, took = _timed_post(f"{server.url}/v1/completions", json=body)
    assert took < REFUSAL_S
    error = openai_error(response, 400)
    assert error["code"] == "context_length_exceeded" and "at least" in error["message"]


def test_a_stream_goes_on_while_a_huge_prompt_is_tokenized(server: RunningServer) -> None:
    """A 4 MiB chat prompt takes ~2 s to tokenize, on its own thread: a stream running
    meanwhile keeps its pace (on a loaded 2-core machine a CPU token takes ~0.2-0.4 s
    anyway; tokenizing on the event loop stalled streams for the whole encode)."""
    from sv_server.body import DEFAULT_MAX_REQUEST_BYTES

    content = ("the quick brown fox " * (1 << 18))[: DEFAULT_MAX_REQUEST_BYTES - 200]
    huge = {"messages": [{"role": "user", "content": content}]}
    refused_at: list[float] = []

    def send_huge() -> None:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=huge, timeout=60)
        assert response.status_code == 400
        refused_at.append(time.perf_counter())

    sender = threading.Thread(target=send_huge)
    body = {"prompt": "1, 2, 3,", "max_tokens": 40, "ignore_eos": True, "stream": True}
    gaps: list[float] = []
    events: list[str] = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as stream:
        lines = filter(None, stream.iter_lines())
        next(lines)
        sender.start()
        last = time.perf_counter()
        for line in lines:
            now = time.perf_counter()
            gaps.append(now - last)
            events.append(line)
            last = now
    sender.join()
    assert events[-1] == "data: [DONE]"
    assert refused_at and refused_at[0] < last, "the huge prompt did not overlap the stream"
    assert max(gaps) < 1.0, f"the stream stalled for {max(gaps) * 1000:.0f} ms"


# --- afterwards -----------------------------------------------------------------------------


def test_after_all_that_the_server_is_healthy_and_every_page_is_free(
    guarded: RunningServer,
) -> None:
    m = guarded.wait_idle()
    assert m["sv_kv_cache_pages_free"] == m["sv_kv_cache_pages_capacity"] > 0
    assert m["sv_kv_cache_pages_used"] == 0 and m["sv_engine_step_failures_total"] == 0
    assert httpx.get(f"{guarded.url}/health").json()["status"] == "ok"
    ok = httpx.post(
        f"{guarded.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=AUTH
    )
    assert ok.status_code == 200
