"""The server through the official `openai` client (and raw httpx where the client can't go),
on the default model on the CPU. Greedy output is checked against an in-process engine."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
import sv_server.app
import tokenizers
from server_test_support import openai_error
from sv_engine import SamplingParams
from sv_tokenizer import Message

# `server` and `make_server` come from conftest.py: RunningServer objects (url, metrics(), ...).
RunningServer = Any

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(client: openai.OpenAI, server: RunningServer, text: str, **kw: Any) -> Any:
    return client.chat.completions.create(
        model=server.model_name, messages=[{"role": "user", "content": text}], **kw
    )


# --- models, health --------------------------------------------------------------------------


def test_models_health(client: openai.OpenAI, server: RunningServer) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [server.model_name]
    assert client.models.retrieve(server.model_name).id == server.model_name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


# --- greedy output against the engine itself -------------------------------------------------


@pytest.mark.parametrize("question", [QUESTION, "Name three primary colours."])
def test_greedy_chat_equals_engine_generate(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any, question: str
) -> None:
    expected = oracle_engine.generate(
        [[Message("user", question)]], SamplingParams(max_new_tokens=20)
    )[0]
    reply = _chat(client, server, question, max_tokens=20, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason  # "stop" / "length" map as they are
    assert reply.usage.prompt_tokens == len(expected.prompt_ids)
    assert reply.usage.completion_tokens == len(expected.output_ids)
    assert reply.usage.total_tokens == len(expected.prompt_ids) + len(expected.output_ids)


def test_a_reply_dumped_whole_goes_back_into_the_history(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """`messages.append(reply.choices[0].message.model_dump())`, a common idiom, sends back
    every field of the client's reply object, most of them null (refusal, annotations, audio,
    function_call): the next turn is the same as with the reply written as {role, content}."""
    first = _chat(client, server, QUESTION, max_tokens=8, temperature=0).choices[0].message
    dumped = first.model_dump()
    assert dumped["refusal"] is None and dumped["annotations"] is None  # what the client sends

    def next_turn(reply: dict[str, Any]) -> Any:
        return client.chat.completions.create(
            model=server.model_name,
            messages=[
                {"role": "user", "content": QUESTION},
                reply,  # type: ignore[list-item]
                {"role": "user", "content": "And of Spain?"},
            ],
            max_tokens=8,
            temperature=0,
        )

    plain = next_turn({"role": "assistant", "content": first.content})
    whole = next_turn(dumped)
    assert whole.choices[0].message.content == plain.choices[0].message.content
    assert whole.usage == plain.usage


# The client warns as it serializes its own reply (its `parsed` field is typed None there).
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_a_parsed_reply_object_goes_back_into_the_history(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """The reply of the client's `.parse()` helper carries `parsed`, the client's own parse of
    its content; appended to the history as it is, the next turn is the same as with the reply
    written as {role, content}."""

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)

    question = {"role": "user", "content": "Name a city, as JSON."}
    first = client.chat.completions.parse(
        model=server.model_name,
        messages=[question],  # type: ignore[list-item]
        response_format=City,
        max_tokens=32,
        temperature=0,
    )
    reply = first.choices[0].message
    assert reply.parsed is not None and reply.content is not None

    def next_turn(reply: Any) -> Any:
        return client.chat.completions.create(
            model=server.model_name,
            messages=[question, reply, {"role": "user", "content": "And another?"}],
            max_tokens=8,
            temperature=0,
        )

    plain = next_turn({"role": "assistant", "content": reply.content})
    whole = next_turn(reply)
    assert whole.choices[0].message.content == plain.choices[0].message.content
    assert whole.usage == plain.usage


def test_completion_is_raw_text_not_chat(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any, default_model: Path
) -> None:
    """A string prompt is the text as the model's HF tokenizer encodes it (no chat format)."""
    text = "The capital of France is"
    hf_ids = tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json")).encode(text).ids
    expected = oracle_engine.generate([hf_ids], SamplingParams(max_new_tokens=8))[0]
    reply = client.completions.create(
        model=server.model_name, prompt=text, max_tokens=8, temperature=0
    )
    assert reply.usage.prompt_tokens == len(hf_ids)
    assert reply.choices[0].text == expected.text
    assert reply.usage.completion_tokens == len(expected.output_ids)
    # the same prompt as token ids, and in OpenAI's one-element batch form
    by_ids = client.completions.create(
        model=server.model_name, prompt=hf_ids, max_tokens=8, temperature=0
    )
    batch = client.completions.create(
        model=server.model_name, prompt=[text], max_tokens=8, temperature=0
    )
    assert by_ids.choices[0].text == batch.choices[0].text == expected.text


def test_completion_default_max_tokens_is_16(client: openai.OpenAI, server: RunningServer) -> None:
    reply = client.completions.create(
        model=server.model_name,
        prompt="Once upon a time",
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert reply.usage.completion_tokens == 16
    assert reply.choices[0].finish_reason == "length"


# --- streaming -------------------------------------------------------------------------------


def test_chat_stream_concatenates_to_the_whole_answer(
    client: openai.OpenAI, server: RunningServer
) -> None:
    whole = _chat(client, server, QUESTION, max_tokens=24, temperature=0)
    chunks = list(
        _chat(
            client,
            server,
            QUESTION,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [whole.choices[0].finish_reason]
    # include_usage: one last chunk with no choices and the usage
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_concatenates_and_ends_with_done(server: RunningServer) -> None:
    body = {"prompt": "The three primary colours are", "max_tokens": 12, "temperature": 0}
    whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=120
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_include_usage_puts_a_null_usage_on_every_other_chunk(
    server: RunningServer, path: str
) -> None:
    """OpenAI's stream_options.include_usage: "All other chunks will also include a usage
    field, but with a null value" (clients read `chunk["usage"]` without a default)."""
    body: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "stream": True}
    body |= {"stream_options": {"include_usage": True}}
    if path == "/v1/completions":
        body["prompt"] = "The three primary colours are"
    else:
        body["messages"] = [{"role": "user", "content": QUESTION}]
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert len(chunks) >= 3  # (chat: the role; the text; the finish; then the usage)
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1]), chunks
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1


def test_a_stream_read_line_by_line_keeps_unicode_line_breaks_in_its_events(
    server: RunningServer,
) -> None:
    """U+0085, U+2028 and U+2029 are line breaks to str.splitlines() and so to httpx's
    iter_lines(), which many SSE readers use (these tests too), though JSON need not escape
    them: in a text (here the echoed prompt) they must not cut an event in two."""
    prompt = "one\u2028two\u2029three\u0085four"
    body = {"prompt": prompt, "max_tokens": 2, "echo": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as response:
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks).startswith(prompt)


# --- stop strings ----------------------------------------------------------------------------


def _greedy(client: openai.OpenAI, server: RunningServer, prompt: str, **kw: Any) -> Any:
    kw = {"max_tokens": 16, **kw}
    return client.completions.create(
        model=server.model_name, prompt=prompt, temperature=0, extra_body={"ignore_eos": True}, **kw
    )


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text(
    client: openai.OpenAI, server: RunningServer, stream: bool
) -> None:
    prompt = "Here is a list of fruits: apple, banana,"
    finished = 'sv_requests_finished_total{finish_reason="%s"}'
    before = server.wait_idle()
    full = _greedy(client, server, prompt)
    text = full.choices[0].text
    assert full.usage.completion_tokens == 16 and len(text) > 12
    # a stop string from the middle of the text: it likely straddles a token boundary
    middle = len(text) // 2
    stop = text[middle : middle + 3]
    expected = text[: text.find(stop)]
    never = "\u2603never\u2603"
    # nine stop strings, as lm-eval's code tasks send (more than OpenAI's 4; vLLM has no limit)
    stops = [f"{never}{i}" for i in range(8)] + [stop]
    if stream:
        chunks = list(_greedy(client, server, prompt, stop=stops, stream=True))
        got = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        reply = _greedy(client, server, prompt, stop=stops)
        got, reason = reply.choices[0].text, reply.choices[0].finish_reason
        assert 0 < reply.usage.completion_tokens < 16
    assert got == expected
    assert reason == "stop"
    # a stop string that never appears changes nothing
    assert _greedy(client, server, prompt, stop=never).choices[0].text == text
    # the stopped request was cancelled in the engine: its pages are free again; it counts
    # as finished by "stop" (vLLM's count), not as cancelled
    m = server.wait_idle()
    assert m["sv_kv_cache_pages_used"] == 0 and m["sv_requests_running"] == 0
    assert m[finished % "stop"] - before[finished % "stop"] == 1
    assert m[finished % "cancelled"] == before[finished % "cancelled"]


def test_a_stop_string_in_the_last_allowed_token_finishes_as_stop_everywhere(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """The token that completes a stop string is also the last max_tokens allows: the client
    and /metrics both say "stop" (vLLM's rule: a stop string found wins over the length), and
    /metrics counts exactly the tokens the client was given (stop strings are matched on the
    engine thread, which cancels the request before another token is generated)."""
    prompt = "Here is a list of fruits: apple, banana,"
    full = _greedy(client, server, prompt, logprobs=0)
    tokens = full.choices[0].logprobs.tokens
    found = None
    for k in range(6, len(tokens)):  # a stop string that first completes in token k
        before, upto = "".join(tokens[: k - 1]), "".join(tokens[:k])
        for size in (3, 2, 1):
            stop = upto[-size:]
            if len(upto) - size >= 0 and upto.find(stop) + size == len(upto) > len(before):
                found = (k, stop, upto[: len(upto) - size])
                break
        if found:
            break
    assert found is not None, tokens
    k, stop, expected = found
    finished = 'sv_requests_finished_total{finish_reason="%s"}'
    before_m = server.wait_idle()
    reply = _greedy(client, server, prompt, stop=[stop], max_tokens=k)
    assert reply.choices[0].text == expected and reply.choices[0].finish_reason == "stop"
    m = server.wait_idle()
    assert m[finished % "stop"] - before_m[finished % "stop"] == 1
    assert m[finished % "length"] == before_m[finished % "length"]
    assert reply.usage.completion_tokens == k
    gen = "sv_generation_tokens_total"
    assert m[gen] - before_m[gen] == k


# --- sampling --------------------------------------------------------------------------------


def test_seed_makes_sampling_reproducible(client: openai.OpenAI, server: RunningServer) -> None:
    def sample(seed: int) -> str:
        reply = _chat(
            client,
            server,
            "Write a short poem about the sea.",
            max_tokens=10,
            temperature=1.0,
            top_p=0.95,
            seed=seed,
            extra_body={"top_k": 50, "ignore_eos": True},
        )
        return reply.choices[0].message.content  # type: ignore[no-any-return]

    first = sample(1234)
    assert sample(1234) == first
    assert sample(4321) != first


# --- errors ----------------------------------------------------------------------------------


def test_client_errors_have_openai_shape(client: openai.OpenAI, server: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert not_found.value.status_code == 404 and not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as n0:
        _chat(client, server, "hi", max_tokens=2, n=0)
    assert n0.value.param == "n"


BAD_REQUESTS = [
    # (path, body, status, param, code)
    ("/v1/chat/completions", b"{not json", 400, None, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None, None),
    ("/v1/chat/completions", {"max_tokens": 2}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": []}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages", None),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0]", None),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": 5}]},
        400,
        "messages[0]",
        None,
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi", "x": 1}]},
        400,
        "messages[0]",
        None,
    ),
    ("/v1/completions", {"max_tokens": 2}, 400, "prompt", None),
    ("/v1/completions", {"prompt": ""}, 400, "prompt", None),
    ("/v1/completions", {"prompt": ["a", ""]}, 400, "prompt", None),
    ("/v1/completions", {"prompt": ["a", [10**9]]}, 400, "prompt", None),
    ("/v1/completions", {"prompt": [1, "x"]}, 400, "prompt", None),
    ("/v1/completions", {"prompt": [10**9]}, 400, "prompt", None),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature", None),
    ("/v1/completions", {"prompt": "hi", "temperature": 2.5}, 400, "temperature", None),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p", None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2.5}, 400, "max_tokens", None),
    (
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 10**6},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    ("/v1/completions", {"prompt": [1] * 9000}, 400, "prompt", "context_length_exceeded"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream", None),
    ("/v1/completions", {"prompt": "hi", "stop": 7}, 400, "stop", None),
    ("/v1/completions", {"prompt": "hi", "stop": [str(i) for i in range(65)]}, 400, "stop", None),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs", None),
    ("/v1/completions", {"prompt": "hi", "tools": []}, 400, "tools", None),
    ("/v1/completions", {"prompt": "hi", "seed": 2**64}, 400, "seed", None),
    (
        "/v1/completions",
        {"prompt": "hi", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
        None,
    ),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("/v1/nothing", {}, 404, None, "not_found"),
]


@pytest.mark.parametrize(("path", "body", "status", "param", "code"), BAD_REQUESTS)
def test_bad_requests_get_error_json(
    server: RunningServer, path: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    if isinstance(body, bytes):
        headers = {"Content-Type": "application/json"}
        response = httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=30)
    else:
        response = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    error = openai_error(response)
    assert error["param"] == param
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"


def test_wrong_method_is_405(server: RunningServer) -> None:
    response = httpx.get(f"{server.url}/v1/completions")
    assert response.status_code == 405
    assert openai_error(response)["code"] == "method_not_allowed"


def test_prompt_over_the_context_by_text(server: RunningServer) -> None:
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hello " * 9000}]},
        timeout=60,
    )
    assert response.status_code == 400
    error = openai_error(response)
    context = httpx.get(f"{server.url}/v1/models").json()["data"][0]["max_model_len"]
    assert (
        error["code"] == "context_length_exceeded" and f"context is {context}" in error["message"]
    )


# --- clients that go away --------------------------------------------------------------------


def test_disconnect_mid_stream_cancels_the_request(server: RunningServer) -> None:
    before = server.wait_idle()
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        seen = 0
        for line in lines:
            seen += line.startswith("data: ")
            if seen == 3:
                break  # leaving the block closes the connection mid-stream
    cancelled, generated = server.after_hang_up(before)
    assert cancelled == 1 and 3 <= generated < 400


def test_disconnect_while_waiting_for_a_whole_answer_cancels(server: RunningServer) -> None:
    before = server.wait_idle()
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=1.5)
    _, generated = server.after_hang_up(before)
    assert generated < 400


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_parse_and_count(client: openai.OpenAI, server: RunningServer) -> None:
    before = server.wait_idle()
    _chat(client, server, "Say hi.", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    _chat(client, server, "Say hi.", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    m = server.wait_idle()
    assert m["sv_generation_tokens_total"] - before["sv_generation_tokens_total"] == 10
    assert (
        m["sv_time_to_first_token_seconds_count"] - before["sv_time_to_first_token_seconds_count"]
        == 2
    )
    assert (
        m["sv_inter_token_latency_seconds_count"] - before["sv_inter_token_latency_seconds_count"]
        == 8
    )
    # the second request's prompt is the first's: its full pages come from the prefix cache
    assert m["sv_prefix_cache_hit_tokens_total"] > before["sv_prefix_cache_hit_tokens_total"]
    assert m["sv_kv_cache_pages_free"] == m["sv_kv_cache_pages_capacity"] > 0
    for name in ("sv_time_to_first_token_seconds", "sv_inter_token_latency_seconds"):
        buckets = sorted(
            (float(k.split('le="')[1].rstrip('"}')), v)
            for k, v in m.items()
            if k.startswith(f"{name}_bucket")
        )
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and buckets[-1][0] == float("inf")
        assert counts[-1] == m[f"{name}_count"]


def test_idle_engine_thread_does_not_spin(server: RunningServer) -> None:
    """No busy-waiting: while idle, no engine step runs and the process uses ~no CPU."""
    before = server.wait_idle()
    cpu = time.process_time()
    time.sleep(1.0)
    used = time.process_time() - cpu
    assert server.metrics()["sv_engine_steps_total"] == before["sv_engine_steps_total"]
    assert used < 0.25, f"{used:.2f} s of CPU in 1 s idle"


# --- a full queue ----------------------------------------------------------------------------


def test_full_queue_gets_429_with_retry_after(make_server: Any) -> None:
    """A pool of 11 pages and --max-queue 1: A holds the whole pool, B waits, C is refused.
    (Conservative admission, so that A's budget holds the pool from its first step: under the
    preemptive policy B would start beside it.)"""
    small = make_server(kv_cache_mib=8, max_queue=1, admission="conservative")
    prompt = list(range(1000, 1010))
    short = {"prompt": prompt, "max_tokens": 2}
    b_result: list[httpx.Response] = []

    def send_b() -> None:
        b_result.append(httpx.post(f"{small.url}/v1/completions", json=short, timeout=60))

    try:
        hog = {"prompt": prompt, "max_tokens": 160, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{small.url}/v1/completions", json=hog, timeout=60) as a:
            # (hold on to the iterator: dropping a half-read httpx stream closes the connection)
            a_lines = a.iter_lines()
            assert next(a_lines).startswith("data: ")  # A is running, holding every page
            b = threading.Thread(target=send_b)
            b.start()
            deadline = time.monotonic() + 30
            while small.metrics()["sv_requests_waiting"] != 1:
                assert time.monotonic() < deadline, "B never queued"
                time.sleep(0.05)
            c = httpx.post(f"{small.url}/v1/completions", json=short, timeout=60)
            assert c.status_code == 429
            assert c.headers["retry-after"] == "1"
            error = openai_error(c)
            assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
        # A's client is gone: A is cancelled, B gets the pool and finishes
        b.join(60)
        assert b_result and b_result[0].status_code == 200
        assert b_result[0].json()["usage"]["completion_tokens"] == 2
        m = small.wait_idle()
        assert m["sv_kv_cache_pages_used"] == 0
        assert m['sv_requests_rejected_total{reason="queue_full"}'] == 1
        assert m['sv_requests_finished_total{finish_reason="cancelled"}'] == 1
    finally:
        small.stop()


# --- an engine step that fails ----------------------------------------------------------------


def test_failed_engine_step_is_a_500_and_the_server_goes_on(server: RunningServer) -> None:
    engine = server.app.state.server.loop.engine
    real_step = engine.step

    def failing_step() -> Any:
        engine.step = real_step  # fail once
        raise RuntimeError("injected fault")

    server.wait_idle()
    engine.step = failing_step
    try:
        response = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60
        )
    finally:
        engine.step = real_step
    assert response.status_code == 500
    error = openai_error(response)
    assert error["type"] == "server_error" and "injected fault" in error["message"]
    m = server.wait_idle()
    assert m["sv_kv_cache_pages_used"] == 0 and m["sv_engine_step_failures_total"] >= 1
    ok = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60
    )
    assert ok.status_code == 200
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and "injected fault" in health["last_engine_error"]


@pytest.mark.parametrize("stream", [False, True])
def test_requests_a_failed_step_ends_are_counted_as_aborted(
    server: RunningServer, stream: bool
) -> None:
    """A request the engine had taken, ended by a failed step, was counted as refused
    (rejected, engine_error) when not streamed, and nowhere when streamed. Both now count once,
    as finished with reason "abort"; a refusal counts only what the engine never took."""
    engine = server.app.state.server.loop.engine
    real_step = engine.step

    def failing_step() -> Any:
        engine.step = real_step  # fail once
        raise RuntimeError("injected fault")

    before = server.wait_idle()
    engine.step = failing_step
    body = {"prompt": "hi", "max_tokens": 3, "stream": stream}
    try:
        response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    finally:
        engine.step = real_step
    if stream:
        assert response.status_code == 200 and "injected fault" in response.text
    else:
        assert response.status_code == 500
    after = server.wait_idle()

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert grew('sv_requests_finished_total{finish_reason="abort"}') == 1
    assert grew('sv_requests_rejected_total{reason="engine_error"}') == 0
    assert sum(grew(k) for k in after if k.startswith("sv_requests_finished_total")) == 1


def test_an_unexpected_error_is_a_500_that_closes_its_connection(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a handler: OpenAI's error shape, and `Connection: close` (uvicorn closes the
    connection after it), so a kept-alive client opens a new one and is served."""

    def broken(_body: Any) -> Any:
        raise RuntimeError("injected bug")

    monkeypatch.setattr(sv_server.app, "parse_tokenize_request", broken)
    with httpx.Client(timeout=30) as client:
        response = client.post(f"{server.url}/tokenize", json={"prompt": "hi"})
        error = openai_error(response, 500)
        assert (
            error["type"] == "server_error" and error["message"] == "internal error: RuntimeError"
        )
        assert response.headers["connection"] == "close"
        monkeypatch.undo()
        again = client.post(f"{server.url}/tokenize", json={"prompt": "hi"})
        assert again.status_code == 200 and again.json()["count"] >= 1


def test_a_request_that_arrives_during_a_long_step_is_counted_as_waiting(
    server: RunningServer,
) -> None:
    """/metrics from the last step's snapshot alone showed no request while a long step ran
    (a CPU prefill of many choices takes seconds): the request taken into that step and one
    submitted during it count as waiting until the step ends."""
    engine = server.app.state.server.loop.engine
    real_step = engine.step
    in_step, release = threading.Event(), threading.Event()

    def long_step() -> Any:
        in_step.set()
        release.wait(30)
        return real_step()

    server.wait_idle()
    engine.step = long_step
    replies: list[httpx.Response] = []
    body = {"prompt": "hi", "max_tokens": 2}

    def post() -> None:
        replies.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))

    first = threading.Thread(target=post)
    second = threading.Thread(target=post)
    try:
        first.start()
        assert in_step.wait(30), "the engine never stepped"
        second.start()  # while the engine thread is held in the step
        deadline = time.monotonic() + 30
        # both: the first taken into the step still running, the second submitted during it
        while server.metrics()["sv_requests_waiting"] != 2:
            assert time.monotonic() < deadline, "the second request was never counted"
            time.sleep(0.05)
    finally:
        engine.step = real_step
        release.set()
        first.join(60)
        second.join(60)
    assert [r.status_code for r in replies] == [200, 200]
    m = server.wait_idle()
    assert m["sv_requests_waiting"] == 0 and m["sv_requests_running"] == 0
