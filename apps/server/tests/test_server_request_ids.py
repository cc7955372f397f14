"""The X-Request-Id header: the answer's id is made of it (vLLM's `cmpl-<id>`, `chatcmpl-<id>`;
a Responses answer keeps its own `resp_` id, as vLLM's), and it comes back as a header of the
answer; a value that is too long or not visible ASCII is a 400 naming the header. Two requests
with the same id are two requests to the engine: cancelling one leaves the other alone."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from server_test_support import RunningServer, openai_error
from starlette.datastructures import Headers
from sv_server.errors import ServerError
from sv_server.request_ids import HEADER, MAX_REQUEST_ID_CHARS, client_request_id

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"prompt": "Hi", "max_tokens": 2},
    "/v1/chat/completions": CHAT,
    "/v1/responses": {"input": "Hi", "max_output_tokens": 2},
}

# The routes whose answer's id an X-Request-Id (or the body's request_id) names, and its prefix.
NAMED_ROUTES = [
    ("/v1/completions", BODIES["/v1/completions"], "cmpl-"),
    ("/v1/chat/completions", CHAT, "chatcmpl-"),
]


def _post(server: RunningServer, path: str, body: dict[str, Any], **headers: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=headers or None, timeout=120)


def _stream_lines(server: RunningServer, path: str, body: dict[str, Any], request_id: str) -> Any:
    return httpx.stream(
        "POST",
        f"{server.url}{path}",
        json={**body, "stream": True},
        headers={HEADER: request_id},
        timeout=120,
    )


@pytest.mark.parametrize(("path", "body", "prefix"), NAMED_ROUTES)
def test_the_answer_is_named_by_the_header(
    server: RunningServer, path: str, body: dict[str, Any], prefix: str
) -> None:
    request_id = "job-7/step:3_" + "x" * 40
    whole = _post(server, path, body, **{HEADER: request_id})
    assert whole.status_code == 200, whole.text
    assert whole.json()["id"] == prefix + request_id
    assert whole.headers[HEADER] == request_id
    with _stream_lines(server, path, body, request_id) as response:
        assert response.headers[HEADER] == request_id
        chunks = [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]
    assert chunks and {c["id"] for c in chunks} == {prefix + request_id}
    # Without the header: an id of its own each time, and no header back.
    plain = [_post(server, path, body) for _ in range(2)]
    assert all(HEADER not in r.headers for r in plain)
    ids = [r.json()["id"] for r in plain]
    assert ids[0] != ids[1] and all(i.startswith(prefix) and len(i) > len(prefix) for i in ids)


@pytest.mark.parametrize(("path", "body", "prefix"), NAMED_ROUTES)
def test_the_bodys_request_id_names_the_answer_unless_the_header_does(
    server: RunningServer, path: str, body: dict[str, Any], prefix: str
) -> None:
    """vLLM's `request_id` field (it was a 400, an unknown field): the answer's id without the
    header, which wins over it as in vLLM; checked as the header is."""
    named = _post(server, path, {**body, "request_id": "from-body"})
    assert named.status_code == 200, named.text
    assert named.json()["id"] == prefix + "from-body" and HEADER not in named.headers
    both = _post(server, path, {**body, "request_id": "from-body"}, **{HEADER: "from-header"})
    assert both.json()["id"] == prefix + "from-header"
    for bad in ("two words", 7, "a" * (MAX_REQUEST_ID_CHARS + 1)):
        error = openai_error(_post(server, path, {**body, "request_id": bad}), 400)
        assert error["param"] == "request_id"


def test_a_response_keeps_its_own_id_and_echoes_the_header(server: RunningServer) -> None:
    response = _post(
        server, "/v1/responses", {"input": "Hi", "max_output_tokens": 2}, **{HEADER: "r-1"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["id"].startswith("resp_") and "r-1" not in response.json()["id"]
    assert response.headers[HEADER] == "r-1"


def test_a_refusal_carries_the_header_back(server: RunningServer) -> None:
    response = _post(
        server, "/v1/completions", {"prompt": "Hi", "max_tokens": -1}, **{HEADER: "e-1"}
    )
    assert openai_error(response, 400)["param"] == "max_tokens"
    assert response.headers[HEADER] == "e-1"


@pytest.mark.parametrize(
    "value",
    [
        "a" * (MAX_REQUEST_ID_CHARS + 1),
        "two words",
        "tab\there",
        b"caf\xe9",  # (not ASCII: a header's bytes read as latin-1)
        b"bell\x07",
    ],
    ids=["too-long", "space", "tab", "latin-1", "control"],
)
@pytest.mark.parametrize("path", list(BODIES))
def test_a_bad_header_is_a_400_naming_it(server: RunningServer, value: Any, path: str) -> None:
    body = BODIES[path]
    before = server.metrics()['sv_requests_rejected_total{reason="invalid"}']
    response = httpx.post(f"{server.url}{path}", json=body, headers=[(HEADER, value)], timeout=60)
    error = openai_error(response, 400)
    assert error["param"] == HEADER and HEADER in error["message"]
    assert HEADER not in response.headers  # (nothing is sent back of a value refused)
    after = server.metrics()['sv_requests_rejected_total{reason="invalid"}']
    assert after == before + 1


def test_the_header_twice_over(server: RunningServer) -> None:
    two = [(HEADER, "a"), (HEADER, "b")]
    response = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "Hi"}, headers=two, timeout=60
    )
    assert openai_error(response, 400)["param"] == HEADER
    same = [(HEADER, "a"), (HEADER, "a")]
    response = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, headers=same
    )
    assert response.status_code == 200 and response.json()["id"] == "cmpl-a"


def test_two_requests_of_one_id_stay_two(server: RunningServer) -> None:
    """Two streams under one id, at once: the engine numbers its requests itself, so the one
    whose client hangs up is cancelled and the other goes on to the answer it gives alone
    (the oracle: the same request without the header)."""
    body = {
        "prompt": "Once upon a time, in a land far away,",
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    }
    alone = _post(server, "/v1/completions", body).json()["choices"][0]["text"]
    before = server.wait_idle()
    texts: list[str] = []
    started = threading.Event()

    def hang_up_early() -> None:
        with _stream_lines(server, "/v1/completions", body, "same") as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    started.set()
                    return  # closes the connection: the request is cancelled

    quitter = threading.Thread(target=hang_up_early)
    quitter.start()
    with _stream_lines(server, "/v1/completions", body, "same") as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line.removeprefix("data: "))
                assert chunk["id"] == "cmpl-same"
                texts.append(chunk["choices"][0]["text"])
    quitter.join(60)
    assert started.is_set()
    assert "".join(texts) == alone
    cancelled, _ = server.after_hang_up(before)
    assert cancelled == 1


@given(value=st.text(max_size=MAX_REQUEST_ID_CHARS + 8))
def test_any_header_value_is_taken_or_refused_naming_the_header(value: str) -> None:
    """Whatever a header holds (as latin-1 text, as Starlette reads one): a valid id is taken as
    it is; anything else is a 400 naming the header, never another error; empty is none."""
    latin = value.encode("utf-8").decode("latin-1")  # (what the bytes of a header read as)
    headers = Headers(raw=[(b"x-request-id", latin.encode("latin-1"))])
    visible = all("\x21" <= c <= "\x7e" for c in latin)
    try:
        got = client_request_id(headers)
    except ServerError as e:
        assert e.status == 400 and e.param == HEADER
        assert latin and not (visible and len(latin) <= MAX_REQUEST_ID_CHARS)
        return
    assert got == (latin or None)
    assert not latin or (visible and len(latin) <= MAX_REQUEST_ID_CHARS)
