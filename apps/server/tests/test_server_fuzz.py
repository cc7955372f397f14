"""Property-based fuzzing of request bodies against a real server: whatever JSON (or not-JSON)
arrives at an endpoint that takes a body, the answer is a 200 or a 4xx in OpenAI's error shape, within a
bounded time; never a 500, never a hang. The server has a 64-token context, so that bodies
the server accepts generate only a few tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response
from server_test_support import RunningServer

ANSWER_S = 60.0  # generous for a 2-core CI machine; a hang is what this catches
EXAMPLES = 30

STRINGS = st.text(max_size=12) | st.sampled_from(["\ud800", "a\udfffb", "<|im_end|>", "\x00"])
NUMBERS = (
    st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, 1, -1, 2, 0.5, 1e308, 5e-324, 2**63, 2**64, 10**30])
)
SCALARS = st.none() | st.booleans() | NUMBERS | STRINGS
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STRINGS, inner, max_size=4),
    max_leaves=10,
)
# Values a client could well send, field by field (max_tokens small: bodies that pass generate).
VALID = {
    "max_tokens": st.integers(1, 4),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 100) | st.just(10**30),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "stop": st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=4),
    "stream": st.booleans(),
    "ignore_eos": st.booleans(),
    "user": st.text(max_size=5),
    "model": st.just("smollm2-test"),
    "presence_penalty": st.just(0),
    "logprobs": st.none() | st.just(False),
    "stop_token_ids": st.lists(st.integers(0, 50_000), max_size=3),
    "include_stop_str_in_output": st.booleans(),
    "truncate_prompt_tokens": st.integers(1, 80) | st.just(-1),
    "allowed_token_ids": st.lists(st.integers(0, 50_000), min_size=1, max_size=4),
}
# An endpoint's own (vLLM's prompt_logprobs; completions' echo, and max_tokens 0 beside it).
PROMPT_LOGPROBS = st.none() | st.integers(0, 3)
COMPLETION_VALID = VALID | {
    "max_tokens": st.integers(0, 4),
    "echo": st.booleans(),
    "logprobs": st.none() | st.just(False) | st.integers(0, 3),
    "prompt_logprobs": PROMPT_LOGPROBS,
}
CHAT_VALID = VALID | {"prompt_logprobs": PROMPT_LOGPROBS}
FIELDS = st.sampled_from([*VALID, "max_completion_tokens", "n", "stream_options", "echo",
                          "best_of", "suffix", "logit_bias", "top_logprobs", "tools",
                          "tool_choice", "response_format", "guided_json", "guided_regex",
                          "guided_choice", "guided_grammar", "structured_outputs",
                          "chat_template_kwargs",
                          "add_generation_prompt", "continue_final_message",
                          "prompt_logprobs"])  # fmt: skip
ODD_FIELD = st.dictionaries(FIELDS, JSON, min_size=1, max_size=1)


def _sensible(
    valid: dict[str, st.SearchStrategy[Any]], **first: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """Bodies made of `first` and `valid` values of some other fields; streams ask for usage
    (at the end, and maybe in every chunk)."""
    optional = {k: v for k, v in valid.items() if k != "max_tokens"}
    fields = st.fixed_dictionaries(first | {"max_tokens": valid["max_tokens"]}, optional=optional)
    usage = st.fixed_dictionaries(
        {"include_usage": st.just(True)}, optional={"continuous_usage_stats": st.booleans()}
    )
    return fields.flatmap(
        lambda b: usage.map(lambda u: b | {"stream_options": u}) if b.get("stream") else st.just(b)
    )


def _bodies(
    valid: dict[str, st.SearchStrategy[Any]], **first: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """A third well-formed, a third with one odd field, a third anything."""
    sensible = _sensible(valid, **first)
    one_odd = st.builds(lambda body, odd: body | odd, sensible, ODD_FIELD)
    return sensible | one_odd | JSON


MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(max_size=30)}
)
PROMPT = st.text(min_size=1, max_size=30) | st.lists(st.integers(0, 49_151), min_size=1, max_size=8)
COMPLETION_BODIES = _bodies(
    COMPLETION_VALID, prompt=PROMPT | st.lists(PROMPT, min_size=1, max_size=3)
)
TOKENIZE_BODIES = (
    st.fixed_dictionaries(
        {"prompt": st.text(max_size=30)},
        optional={"add_special_tokens": st.booleans(), "model": st.just("smollm2-test")},
    )
    | st.fixed_dictionaries(
        {"messages": st.lists(MESSAGE, min_size=1, max_size=3)},
        optional={
            "add_generation_prompt": st.booleans(),
            "continue_final_message": st.booleans(),
            "chat_template_kwargs": st.just({}) | JSON,
            "add_special_tokens": st.booleans(),
        },
    )
    | ODD_FIELD.map(lambda odd: {"prompt": "x"} | odd)
    | JSON
)
TOKENIZER_ANSWERS = ({"count", "max_model_len", "tokens"}, {"prompt"})
DETOKENIZE_BODIES = (
    st.fixed_dictionaries({"tokens": st.lists(st.integers(-2, 60_000), max_size=8)}) | JSON
)
CHAT_BODIES = _bodies(CHAT_VALID, messages=st.lists(MESSAGE, min_size=1, max_size=3))

# /v1/responses: its own fields (max_output_tokens for max_tokens) and input items, well-formed
# or nearly (a bad call's arguments, an image part, an unknown type).
TEXT_PART = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["input_text", "output_text", "input_image"]),
        "text": st.text(max_size=20),
    }
)
INPUT_ITEM = (
    MESSAGE
    | st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "developer"]),
            "content": st.lists(TEXT_PART, max_size=2),
        },
        optional={"type": st.just("message"), "id": st.text(max_size=5)},
    )
    | st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.text(max_size=5),
            "name": st.text(max_size=8),
            "arguments": st.sampled_from(["{}", '{"a": 1}', "[]", "x"]),
        }
    )
    | st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": st.text(max_size=5)},
        optional={"output": STRINGS | st.lists(TEXT_PART, max_size=2)},
    )
    | st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference", "x"])})
)
RESPONSES_VALID = {
    k: v for k, v in VALID.items() if k not in ("max_tokens", "logprobs", "truncate_prompt_tokens")
} | {
    "instructions": st.text(max_size=20),
    "store": st.booleans(),
    "metadata": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    "text": st.sampled_from(
        [{"format": {"type": "text"}}, {"format": {"type": "json_object"}}, {}, None]
    ),
    "tool_choice": st.sampled_from(["auto", "none"]),
    "truncation": st.just("disabled"),
    "include": st.sampled_from([[], ["message.output_text.logprobs"]]),
    "top_logprobs": st.integers(0, 3),
}
RESPONSES_FIELDS = st.sampled_from([*RESPONSES_VALID, "input", "tools", "tool_choice",
                                    "reasoning", "include", "truncation", "previous_response_id",
                                    "background", "top_logprobs", "stream_options", "prompt",
                                    "service_tier", "max_output_tokens", "conversation"])  # fmt: skip
RESPONSES_SENSIBLE = st.fixed_dictionaries(
    {
        "input": st.text(min_size=1, max_size=30) | st.lists(INPUT_ITEM, min_size=1, max_size=4),
        "max_output_tokens": st.integers(1, 4),
    },
    optional=RESPONSES_VALID,
)
RESPONSES_BODIES = (
    RESPONSES_SENSIBLE
    | st.builds(
        lambda body, odd: body | odd,
        RESPONSES_SENSIBLE,
        st.dictionaries(RESPONSES_FIELDS, JSON, min_size=1, max_size=1),
    )
    | JSON
)


@pytest.fixture(scope="module")
def small(make_server: Any) -> Iterator[RunningServer]:
    server = make_server(max_model_len=64)
    yield server
    server.stop()


def _answered(response: httpx.Response, body: Any) -> bool:
    """True for a 200; a 4xx must carry an OpenAI error body (False); anything else fails."""
    status = response.status_code
    event(f"status {status}")
    assert status == 200 or 400 <= status < 500, (status, response.text[:300], body)
    if status != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        return False
    return True


def _check_answer(response: httpx.Response, body: Any) -> None:
    if not _answered(response, body):
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line for line in response.text.split("\n") if line]
        assert events[-1] == "data: [DONE]", events[-3:]
        for line in events[:-1]:
            assert "error" not in json.loads(line.removeprefix("data: ")), line
    else:
        answer = response.json()
        assert answer.get("choices") or set(answer) in TOKENIZER_ANSWERS, answer
        _check_new_fields(answer, body)


def _check_new_fields(answer: dict[str, Any], body: dict[str, Any]) -> None:
    """An echo of max_tokens 0 generated nothing; prompt_logprobs, where asked for, open with
    the first prompt token's null and score every other one."""
    if body.get("max_tokens") == 0:  # (taken only with echo)
        event("echo without generation answered")
        assert answer["usage"]["completion_tokens"] == 0, answer
        assert {c["finish_reason"] for c in answer["choices"]} == {"length"}, answer
    if body.get("prompt_logprobs") is not None:
        event("prompt_logprobs answered")
        if answer["object"] == "chat.completion":  # once, beside the choices
            scores = [answer["prompt_logprobs"]]
        else:
            scores = [c["prompt_logprobs"] for c in answer["choices"]]
        for score in scores:
            assert score[0] is None and all(score[1:]), score
            assert all(len(position) <= body["prompt_logprobs"] + 1 for position in score[1:])


def _post(
    server: RunningServer, path: str, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    content = json.dumps(body).encode()  # ensure_ascii: lone surrogates travel as \\udXXX
    headers = {"Content-Type": "application/json", **(headers or {})}
    response = httpx.post(server.url + path, content=content, headers=headers, timeout=ANSWER_S)
    _check_answer(response, body)
    return response


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(body=COMPLETION_BODIES)
def test_fuzzed_completion_bodies(small: RunningServer, body: Any) -> None:
    _post(small, "/v1/completions", body)


@FUZZ
@given(
    request_id=st.text(max_size=300)
    | st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1),
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
)
def test_fuzzed_request_id_headers(small: RunningServer, request_id: str, path: str) -> None:
    """Whatever X-Request-Id holds (what an HTTP client sends of it: latin-1, no control
    character but tab), the answer is named by it and carries it back, or is a 400 naming the
    header."""
    value = "".join(
        c
        for c in request_id.encode("utf-8").decode("latin-1")
        if c == "\t" or not (c < " " or c == "\x7f")
    )
    body: dict[str, Any] = {"max_tokens": 1, "temperature": 0}
    body |= (
        {"prompt": "Hi"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "Hi"}]}
    )
    content = json.dumps(body).encode()
    headers = [(b"Content-Type", b"application/json"), (b"X-Request-Id", value.encode("latin-1"))]
    response = httpx.post(small.url + path, content=content, headers=headers, timeout=ANSWER_S)
    value = value.strip(" \t")  # (HTTP drops a value's surrounding whitespace)
    if not _answered(response, body):
        assert response.json()["error"]["param"] == "X-Request-Id", response.text
        return
    prefix = "cmpl-" if path == "/v1/completions" else "chatcmpl-"
    if value:
        assert response.json()["id"] == prefix + value
        assert response.headers["X-Request-Id"] == value
    else:
        assert "X-Request-Id" not in response.headers


@FUZZ
@given(body=TOKENIZE_BODIES)
def test_fuzzed_tokenize_bodies(small: RunningServer, body: Any) -> None:
    _post(small, "/tokenize", body)


@FUZZ
@given(body=DETOKENIZE_BODIES)
def test_fuzzed_detokenize_bodies(small: RunningServer, body: Any) -> None:
    _post(small, "/detokenize", body)


@FUZZ
@given(body=CHAT_BODIES)
def test_fuzzed_chat_bodies(small: RunningServer, body: Any) -> None:
    _post(small, "/v1/chat/completions", body)


@FUZZ
@given(body=RESPONSES_BODIES)
def test_fuzzed_responses_bodies(small: RunningServer, body: Any) -> None:
    content = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    response = httpx.post(
        small.url + "/v1/responses", content=content, headers=headers, timeout=ANSWER_S
    )
    if not _answered(response, body):
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        blocks = response.text.strip().split("\n\n")
        for block in blocks:
            kind, data = block.split("\n")
            assert json.loads(data.removeprefix("data: "))["type"] == kind.removeprefix("event: ")
        assert blocks[-1].startswith(("event: response.completed", "event: response.incomplete"))
    else:
        Response.model_validate(response.json())


@FUZZ
@given(
    raw=st.binary(max_size=64),
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/responses"]),
)
def test_fuzzed_bytes(small: RunningServer, raw: bytes, path: str) -> None:
    headers = {"Content-Type": "application/json"}
    response = httpx.post(small.url + path, content=raw, headers=headers, timeout=ANSWER_S)
    _check_answer(response, raw)


def test_after_the_fuzzing_every_page_is_free(small: RunningServer) -> None:
    m = small.wait_idle()
    assert m["sv_kv_cache_pages_free"] == m["sv_kv_cache_pages_capacity"]
    assert m["sv_engine_step_failures_total"] == 0
    assert httpx.get(f"{small.url}/health").json()["status"] == "ok"
