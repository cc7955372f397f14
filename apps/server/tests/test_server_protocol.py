"""Request parsing: what is accepted, what is refused (with the field named), and fuzzing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sv_server.errors import ServerError
from sv_server.request_parsing import (
    MAX_PROMPTS,
    GenerationRequest,
    parse_chat_request,
    parse_completion_request,
)
from sv_server.response_bodies import ChunkEncoder, chunk_body, response_body
from sv_tokenizer import Message


def test_completion_defaults() -> None:
    req = parse_completion_request({"prompt": "hi"})
    assert req == GenerationRequest(
        kind="completion",
        model=None,
        prompts=["hi"],
        messages=None,
        max_tokens=None,
        temperature=1.0,  # OpenAI's default
        top_p=1.0,
        top_k=0,
        seed=None,
        stop=(),
        stop_token_ids=frozenset(),
        include_stop_str_in_output=False,
        stream=False,
        include_usage=False,
        ignore_eos=False,
        n=1,
    )


def test_chat_fields() -> None:
    req = parse_chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    # (cache_control: Anthropic's caching mark that proxies add; ignored)
                    "content": [
                        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                        {"type": "text", "text": "b"},
                    ],
                },
            ],
            "max_completion_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": -1,
            "seed": -3,
            "stop": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "presence_penalty": 0,
            "logprobs": False,
            "user": "someone",
        }
    )
    # text parts joined with newlines, as vLLM joins them for a text model
    assert req.messages == [Message("system", "Be brief."), Message("user", "a\nb")]
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.seed) == (7, 0.0, 0.5, 0, -3)
    assert req.stop == ("x",) and req.stream and req.include_usage


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "x", "logprobs": True}, "logprobs"),  # True is not 0
        ({"prompt": "x", "echo": 1}, "echo"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
        ({"prompt": "x", "best_of": 1, "n": 3}, "best_of"),  # OpenAI: best_of >= n
        ({"prompt": "x", "top_logprobs": 0}, "top_logprobs"),  # chat only
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "temperature": float("nan")}, "temperature"),
        ({"prompt": "x", "temperature": True}, "temperature"),
        ({"prompt": "x", "top_k": -2}, "top_k"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": "x", "stream": True, "stream_options": {"foo": 1}}, "stream_options"),
        ({"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, "stream_options"),
        (
            {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": "yes"}},
            "stream_options",
        ),
        ({"prompt": [[1, 2], "x", []]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [True]}, "prompt"),
    ],
)
def test_completion_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ServerError) as e:
        parse_completion_request(body)
    assert e.value.status == 400 and e.value.param == param


def test_chat_max_tokens_must_agree() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    assert parse_chat_request({**body, "max_completion_tokens": 3}).max_tokens == 3
    with pytest.raises(ServerError) as e:
        parse_chat_request({**body, "max_completion_tokens": 4})
    assert e.value.param == "max_completion_tokens"


def test_chat_roles_are_openai_s() -> None:
    """OpenAI's roles only (an unknown one is a 400 naming the message); "developer", its
    newer name for the system message, is one."""
    for role in ("wizard", "ipython", "function", "", None, 3):
        with pytest.raises(ServerError) as e:
            parse_chat_request(
                {"messages": [{"role": "user", "content": "x"}, {"role": role, "content": "y"}]}
            )
        assert e.value.status == 400 and e.value.param == "messages[1]"
    req = parse_chat_request(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "x"},
            ]
        }
    )
    assert req.messages == [Message("system", "Be brief."), Message("user", "x")]


def test_chat_reply_fields_are_accepted_only_empty() -> None:
    """OpenAI's reply fields that its client sends back with a reply (refusal, annotations,
    audio, function_call) say nothing when null or empty; anything in them is refused. The
    client's `parsed` repeats the content: ignored."""
    user = {"role": "user", "content": "x"}
    for key, empty in [("refusal", None), ("annotations", []), ("audio", None)]:
        reply = {"role": "assistant", "content": "y", key: empty}
        req = parse_chat_request({"messages": [user, reply, user]})
        assert req.messages == [
            Message("user", "x"),
            Message("assistant", "y"),
            Message("user", "x"),
        ]
    reply = {"role": "assistant", "content": '{"a": 1}', "parsed": {"a": 1}}  # the client's
    req = parse_chat_request({"messages": [user, reply, user]})
    assert req.messages is not None and req.messages[1] == Message("assistant", '{"a": 1}')
    for key, value in [("refusal", "I can't."), ("function_call", {"name": "f"}), ("foo", None)]:
        with pytest.raises(ServerError) as e:
            parse_chat_request(
                {"messages": [user, {"role": "assistant", "content": "", key: value}]}
            )
        assert e.value.status == 400 and e.value.param == "messages[1]" and key in e.value.message


def test_openai_chat_fields_for_what_the_server_has_not_are_taken_off_only() -> None:
    """OpenAI's `store`, `service_tier`, `reasoning_effort`, ... are no unknown fields: at the
    value that asks for nothing (as a client that sends every field sends them) they pass; any
    other is refused naming the field; the completions endpoint knows none of them."""
    chat = {"messages": [{"role": "user", "content": "x"}]}
    off = {
        "store": False,
        "metadata": None,
        "service_tier": "auto",
        "reasoning_effort": None,
        "verbosity": None,
        "modalities": ["text"],
        "audio": None,
        "prediction": None,
        "web_search_options": None,
        "functions": None,  # (deprecated forerunners of tools, sent null by older clients)
        "function_call": None,
        "safety_identifier": "user-1",
        "prompt_cache_key": "k",
    }
    assert parse_chat_request({**chat, **off}).messages == [Message("user", "x")]
    assert parse_chat_request({**chat, "service_tier": "default"}).messages is not None
    on = {
        "store": True,
        "metadata": {"a": "b"},
        "service_tier": "flex",
        "reasoning_effort": "low",
        "modalities": ["text", "audio"],
        "prediction": {"type": "content", "content": "x"},
        "functions": [{"name": "f", "parameters": {}}],
        "function_call": "auto",
        "safety_identifier": 3,
    }
    for key, value in on.items():
        with pytest.raises(ServerError) as e:
            parse_chat_request({**chat, key: value})
        assert e.value.status == 400 and e.value.param == key
    with pytest.raises(ServerError) as e:
        parse_completion_request({"prompt": "x", "store": False})
    assert e.value.param == "store" and "unknown" in e.value.message


def test_stream_options_include_obfuscation_is_taken_false_only() -> None:
    """OpenAI's `stream_options.include_obfuscation: false` asks for chunks without its
    random padding, which these chunks never have; true (padding) is refused."""
    for parse, body in [
        (parse_chat_request, {"messages": [{"role": "user", "content": "x"}]}),
        (parse_completion_request, {"prompt": "x"}),
    ]:
        for off in (False, None):
            options = {"include_usage": True, "include_obfuscation": off}
            req = parse({**body, "stream": True, "stream_options": options})
            assert req.stream and req.include_usage
        with pytest.raises(ServerError) as e:
            parse({**body, "stream": True, "stream_options": {"include_obfuscation": True}})
        assert e.value.param == "stream_options" and "include_obfuscation" in e.value.message


def test_chat_refuses_completion_only_fields() -> None:
    with pytest.raises(ServerError) as e:
        parse_chat_request({"messages": [{"role": "user", "content": "x"}], "echo": False})
    assert e.value.param == "echo"


def test_response_shapes() -> None:
    chat = response_body("chat", "id1", "m", [("hello", "stop")], 3, 2)
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert chat["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    first = chunk_body("chat", "id1", "m", 0, "", first=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last = chunk_body("chat", "id1", "m", 0, None, "length")
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"
    assert chunk_body("completion", "id2", "m", 0, "t")["choices"][0]["text"] == "t"
    two = response_body("completion", "id3", "m", [("a", "stop"), ("b", "length")], 5, 4)
    assert [(c["index"], c["text"], c["finish_reason"]) for c in two["choices"]] == [
        (0, "a", "stop"),
        (1, "b", "length"),
    ]
    assert two["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert chunk_body("completion", "id2", "m", 0, "t", index=3)["choices"][0]["index"] == 3


def test_a_list_of_prompts() -> None:
    req = parse_completion_request({"prompt": ["a", [1, 2], "b"]})
    assert req.prompts == ["a", [1, 2], "b"]
    assert parse_completion_request({"prompt": [1, 2]}).prompts == [[1, 2]]
    for bad in (["a", ""], ["a", 5], [[1], []], [[1, "x"]], ["a"] * (MAX_PROMPTS + 1)):
        with pytest.raises(ServerError) as e:
            parse_completion_request({"prompt": bad})
        assert e.value.param == "prompt"
    with pytest.raises(ServerError) as e:
        parse_completion_request({"prompt": ["a", ""]})
    assert "prompt[1]" in e.value.message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "prompt",
        "messages",
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "n",
        "stream",
        "stream_options",
        "logprobs",
        "echo",
        "user",
        "ignore_eos",
        "max_completion_tokens",
    ]
)
BODIES = JSON | st.dictionaries(KEYS, JSON, max_size=6)


@settings(max_examples=300, deadline=None)
@given(BODIES)
def test_any_json_is_parsed_or_refused_with_400(body: Any) -> None:
    for parse in (parse_completion_request, parse_chat_request):
        try:
            req = parse(body)
        except ServerError as e:
            assert e.status == 400 and e.message
        else:
            assert isinstance(req, GenerationRequest)
            assert req.max_tokens is None or req.max_tokens >= 1
            assert 0 <= req.temperature <= 2 and 0 < req.top_p <= 1 and req.top_k >= 0


@given(st.text(max_size=20), st.sampled_from(["completion", "chat"]))
def test_chunk_encoder_equals_plain_json(text: str, kind: Any) -> None:
    import json

    event = ChunkEncoder(kind, 'id\u00e9"', "m/1", 7).text_event(text)
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[6:]) == chunk_body(kind, 'id\u00e9"', "m/1", 7, text)


def test_a_text_part_with_other_keys_is_refused() -> None:
    """Only Anthropic's cache_control mark is let through beside type and text."""
    part = {"type": "text", "text": "a", "foo": 1}
    with pytest.raises(ServerError) as e:
        parse_chat_request({"messages": [{"role": "user", "content": [part]}]})
    assert e.value.param == "messages[0]" and "content parts must be" in e.value.message
