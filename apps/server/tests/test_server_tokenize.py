"""vLLM's /tokenize, /detokenize and /version, with raw httpx: token ids checked against the HF
`tokenizers` library and transformers' apply_chat_template on the model folder's own files."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import tokenizers
from server_test_support import WEATHER_CALL, RunningServer, openai_error

TEXT = "Tokenizers split text: naïve café, 12345, and spaces  ."
DIALOG = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
]


@pytest.fixture(scope="module")
def hf(default_model: Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json"))


def _post(server: RunningServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def test_tokenize_a_text(server: RunningServer, hf: tokenizers.Tokenizer) -> None:
    context = httpx.get(f"{server.url}/v1/models").json()["data"][0]["max_model_len"]
    expected = hf.encode(TEXT).ids  # SmolLM2 adds no BOS
    for body in (
        {"prompt": TEXT},
        {"prompt": TEXT, "add_special_tokens": True, "model": server.model_name},
        {"prompt": TEXT, "add_special_tokens": False},
    ):
        response = _post(server, "/tokenize", body)
        assert response.status_code == 200, response.text
        assert response.json() == {
            "count": len(expected),
            "max_model_len": context,
            "tokens": expected,
        }
    assert _post(server, "/tokenize", {"prompt": ""}).json()["tokens"] == []
    # special-token text in a raw text is plain text, as /v1/completions encodes it
    forged = _post(server, "/tokenize", {"prompt": "<|im_end|>"}).json()
    assert hf.token_to_id("<|im_end|>") not in forged["tokens"]
    assert forged["count"] > 1
    reply = _post(server, "/v1/completions", {"prompt": "<|im_end|>", "max_tokens": 1})
    assert reply.json()["usage"]["prompt_tokens"] == forged["count"]


@pytest.mark.parametrize("generation", [True, False])
def test_tokenize_a_conversation(
    server: RunningServer, default_model: Path, generation: bool
) -> None:
    import transformers

    hf_chat = transformers.AutoTokenizer.from_pretrained(default_model)
    text = hf_chat.apply_chat_template(DIALOG, tokenize=False, add_generation_prompt=generation)
    expected = hf_chat.encode(text, add_special_tokens=False)
    body = {"messages": DIALOG, "add_generation_prompt": generation}
    got = _post(server, "/tokenize", body).json()
    assert got["tokens"] == expected and got["count"] == len(expected)
    if generation:  # the very ids a chat completion's prompt is
        reply = _post(server, "/v1/chat/completions", {"messages": DIALOG, "max_tokens": 1})
        assert reply.json()["usage"]["prompt_tokens"] == len(expected)


def test_a_chat_template_option_replaces_the_folders(make_server: Any, default_model: Path) -> None:
    """`sv serve --chat-template` (Engine.from_model_dir's chat_template): /tokenize and chat
    completions render the given template, as transformers renders it."""
    import transformers

    template = (
        "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
    )
    hf_chat = transformers.AutoTokenizer.from_pretrained(default_model)
    text = hf_chat.apply_chat_template(
        DIALOG, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    expected = hf_chat.encode(text, add_special_tokens=False)
    running = make_server(chat_template=template, kv_cache_mib=8)
    try:
        got = _post(running, "/tokenize", {"messages": DIALOG}).json()
        assert got["tokens"] == expected
        reply = _post(running, "/v1/chat/completions", {"messages": DIALOG, "max_tokens": 1})
        assert reply.json()["usage"]["prompt_tokens"] == len(expected)
    finally:
        running.stop()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALLED = [
    {"role": "user", "content": "Weather in Lisbon?"},
    WEATHER_CALL,
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]


@pytest.fixture(scope="module")
def qwen3_server(tiny_qwen3_dir: Path) -> Any:
    """A tiny random model with Qwen3's tokenizer and template, which writes `tools`."""
    running = RunningServer(tiny_qwen3_dir, kv_cache_mib=16)
    yield running
    running.stop()


@pytest.mark.parametrize("messages", [DIALOG, CALLED], ids=["question", "after-a-call"])
def test_tokenize_a_conversation_with_tools(
    qwen3_server: RunningServer, tiny_qwen3_dir: Path, messages: list[dict[str, Any]]
) -> None:
    """vLLM's /tokenize takes a chat request's `tools` and renders them with the chat template:
    the ids are transformers' apply_chat_template's with the same tools (a call's arguments
    as the object templates take, as vLLM passes them), and a chat completion's prompt."""
    import transformers

    hf_chat = transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    as_hf = [_with_decoded_arguments(m) for m in messages]
    text = hf_chat.apply_chat_template(
        as_hf, tools=[WEATHER], tokenize=False, add_generation_prompt=True
    )
    assert "get_weather" in text.split("<|im_start|>user")[0]  # the tools are written first
    expected = hf_chat.encode(text, add_special_tokens=False)
    body = {"messages": messages, "tools": [WEATHER], "model": qwen3_server.model_name}
    got = _post(qwen3_server, "/tokenize", body)
    assert got.status_code == 200, got.text
    assert got.json()["tokens"] == expected and got.json()["count"] == len(expected)
    reply = _post(qwen3_server, "/v1/chat/completions", body | {"max_tokens": 1})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(expected)
    without = _post(qwen3_server, "/tokenize", {"messages": messages}).json()["tokens"]
    assert len(without) < len(expected)


def _with_decoded_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """A message as transformers' templates take it: content a string, a call's arguments an
    object."""
    calls = message.get("tool_calls")
    message = message | {"content": message["content"] or ""}
    if calls is None:
        return message
    decoded = [
        c | {"function": c["function"] | {"arguments": json.loads(c["function"]["arguments"])}}
        for c in calls
    ]
    return message | {"tool_calls": decoded}


def test_detokenize_round_trip(server: RunningServer, hf: tokenizers.Tokenizer) -> None:
    ids = _post(server, "/tokenize", {"prompt": TEXT}).json()["tokens"]
    response = _post(server, "/detokenize", {"tokens": ids, "model": server.model_name})
    assert response.status_code == 200
    assert response.json() == {"prompt": TEXT}
    special = hf.token_to_id("<|im_start|>")
    assert _post(server, "/detokenize", {"tokens": [special]}).json() == {"prompt": "<|im_start|>"}
    assert _post(server, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


def test_version(server: RunningServer) -> None:
    response = httpx.get(f"{server.url}/version")
    assert response.status_code == 200
    assert response.json() == {"version": importlib.metadata.version("sv-server")}


BAD = [
    # (path, body, param)
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"prompt": "x", "add_generation_prompt": True}, "add_generation_prompt"),
    ("/tokenize", {"prompt": "x", "return_token_strs": True}, "return_token_strs"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": [{"role": "user"}]}, "messages[0]"),
    ("/tokenize", {"messages": [{"role": "<|im_end|>", "content": "x"}]}, "messages[0]"),
    ("/tokenize", {"messages": DIALOG, "prompt": "x"}, "prompt"),
    ("/tokenize", {"messages": DIALOG, "tools": "x"}, "tools"),
    ("/tokenize", {"messages": DIALOG, "tools": [{"type": "function"}]}, "tools"),
    ("/tokenize", {"messages": DIALOG, "tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),
    ("/tokenize", {"prompt": "x", "tools": [WEATHER]}, "tools"),
    ("/tokenize", [1], None),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {"tokens": [1, 2.5]}, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [1], "skip": 1}, "skip"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
def test_bad_bodies_are_400_naming_the_field(
    server: RunningServer, path: str, body: Any, param: str | None
) -> None:
    error = openai_error(_post(server, path, body), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_refusals_do_not_say_where_the_model_lives(
    server: RunningServer, default_model: Path
) -> None:
    """A tokenizer's message names its file; the server's answer keeps the file's name only."""
    error = openai_error(_post(server, "/detokenize", {"tokens": [-1]}), 400)
    assert str(default_model) not in error["message"]
    assert "tokenizer.json: token id -1 is not in the vocabulary" in error["message"]


def test_other_refusals(server: RunningServer) -> None:
    unknown = _post(server, "/tokenize", {"prompt": "x", "model": "gpt-4"})
    assert openai_error(unknown, 404)["code"] == "model_not_found"
    for path in ("/tokenize", "/detokenize"):
        plain = httpx.post(
            f"{server.url}{path}", content=b"{}", headers={"Content-Type": "text/plain"}
        )
        assert openai_error(plain, 415)["code"] == "unsupported_media_type"
        not_json = httpx.post(
            f"{server.url}{path}", content=b"{x", headers={"Content-Type": "application/json"}
        )
        openai_error(not_json, 400)
        assert openai_error(httpx.get(f"{server.url}{path}"), 405)["code"] == "method_not_allowed"


def test_a_message_name_is_accepted(server: RunningServer) -> None:
    """SmolLM2's template has no place for names: the prompt is the same ids without them,
    whatever the name says (one that spells a special token too)."""
    plain = _post(server, "/tokenize", {"messages": DIALOG}).json()["tokens"]
    for name in ("ann", "x<|im_end|>"):
        named = [DIALOG[0], DIALOG[1] | {"name": name}]
        assert _post(server, "/tokenize", {"messages": named}).json()["tokens"] == plain
        reply = _post(server, "/v1/chat/completions", {"messages": named, "max_tokens": 1})
        assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == len(plain)
    for bad in (5, ["ann"]):
        body = {"messages": [DIALOG[1] | {"name": bad}]}
        for path, extra in (("/tokenize", {}), ("/v1/chat/completions", {"max_tokens": 1})):
            error = openai_error(_post(server, path, body | extra), 400)
            assert error["param"] == "messages[0]"
            assert "name" in error["message"]
