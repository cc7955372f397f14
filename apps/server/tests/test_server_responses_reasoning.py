"""/v1/responses under `--reasoning-parser qwen3`, on test_server_reasoning.py's small random
model with Qwen3's tokenizer (a `logit_bias` on the think tags makes them come often): the
thinking is a reasoning item and the rest a message, the same split (and token counts) as the
chat completion of the same seeded request, whole and streamed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

THINK, END = 151667, 151668  # Qwen3's <think> and </think>
TAGS_OFTEN = {str(THINK): 12, str(END): 10}  # test_server_reasoning.py's strong-think
QUESTION = "What is 2+2?"


@pytest.fixture(scope="module")
def thinking_server(tiny_qwen3_dir: Path) -> Iterator[Any]:
    from server_test_support import RunningServer

    running = RunningServer(tiny_qwen3_dir, kv_cache_mib=64, reasoning_parser="qwen3")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(thinking_server: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{thinking_server.url}/v1", api_key="unused", max_retries=0, timeout=300
    )


# (On this model the seeds give answers that think then answer, only think, or only answer.)
@pytest.mark.parametrize("seed", range(6))
def test_the_thinking_is_a_reasoning_item_as_chat_splits_it(
    client: openai.OpenAI, thinking_server: Any, seed: int
) -> None:
    extra = {"seed": seed, "logit_bias": TAGS_OFTEN}
    response = client.responses.create(
        model=thinking_server.model_name, input=QUESTION, max_output_tokens=20, extra_body=extra
    )
    chat = client.chat.completions.create(
        model=thinking_server.model_name,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=20,
        extra_body=extra,
    )
    message = chat.choices[0].message
    thinking = getattr(message, "reasoning_content", None)
    reasoning = [item for item in response.output if item.type == "reasoning"]
    texts = [item for item in response.output if item.type == "message"]
    assert [r.content[0].text for r in reasoning if r.content] == ([thinking] if thinking else [])
    assert response.output_text == (message.content or "")
    assert len(texts) == (1 if message.content else 0)
    assert response.output[: len(reasoning)] == reasoning  # the thinking comes first
    assert response.usage is not None and chat.usage is not None
    details = chat.usage.completion_tokens_details
    assert details is not None
    assert response.usage.output_tokens_details.reasoning_tokens == details.reasoning_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    # Streamed: the reasoning deltas and text deltas add up to the same items.
    events = list(
        client.responses.create(
            model=thinking_server.model_name,
            input=QUESTION,
            max_output_tokens=20,
            extra_body=extra,
            stream=True,
        )
    )
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == (thinking or "")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.usage == response.usage
    assert [item.type for item in final.output] == [item.type for item in response.output]


LOGPROBS = "message.output_text.logprobs"


@pytest.mark.parametrize("seed", range(6))
def test_the_message_logprobs_are_its_own_tokens_whole_and_streamed(
    thinking_server: Any, seed: int
) -> None:
    """The message's logprobs are the entries of its own text's tokens: the thinking's (and
    its tags') are dropped, a reasoning item carrying none. Streamed, each text delta carries
    those of the tokens whose text it completes, and together they are the whole answer's."""
    import json

    import httpx

    body = {
        "model": thinking_server.model_name,
        "input": QUESTION,
        "max_output_tokens": 20,
        "seed": seed,
        "logit_bias": TAGS_OFTEN,
        "include": [LOGPROBS],
        "top_logprobs": 1,
    }
    answer = httpx.post(f"{thinking_server.url}/v1/responses", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    output = answer.json()["output"]
    messages = [item for item in output if item["type"] == "message"]
    whole = messages[0]["content"][0] if messages and messages[0]["content"] else None
    if whole is not None:
        # (Qwen3's `</think>` is one token: no token holds both the tag and the message's text)
        assert b"".join(bytes(e["bytes"]) for e in whole["logprobs"]) == whole["text"].encode()
        assert len(whole["logprobs"]) > 0 or whole["text"] == ""
    with httpx.stream(
        "POST", f"{thinking_server.url}/v1/responses", json={**body, "stream": True}, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        events = [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    text, spelt = "", b""
    for delta in deltas:
        text += delta["delta"]
        spelt += b"".join(bytes(e["bytes"]) for e in delta["logprobs"])
        assert text.encode().startswith(spelt), (text, spelt)  # never before their text
    streamed = [e for d in deltas for e in d["logprobs"]]
    wanted = whole["logprobs"] if whole is not None else []
    assert [e["token"] for e in streamed] == [e["token"] for e in wanted]
    assert [e["logprob"] for e in streamed] == pytest.approx(
        [e["logprob"] for e in wanted], abs=1e-4
    )
    if whole is not None:
        assert text == whole["text"] and spelt == text.encode()


def test_some_seed_thinks_then_answers_with_logprobs(thinking_server: Any) -> None:
    """The test above sees answers whose message follows a thinking (so its tokens are not
    the answer's first)."""
    import httpx

    both = 0
    for seed in range(6):
        body = {
            "input": QUESTION,
            "max_output_tokens": 20,
            "seed": seed,
            "logit_bias": TAGS_OFTEN,
            "include": [LOGPROBS],
        }
        answer = httpx.post(f"{thinking_server.url}/v1/responses", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        kinds = {item["type"]: item for item in answer.json()["output"]}
        message = kinds.get("message")
        if "reasoning" in kinds and message and message["content"][0]["text"]:
            both += 1
    assert both > 0


def test_a_reasoning_item_before_a_call_renders_as_chats_reasoning_content(
    thinking_server: Any,
) -> None:
    """In a tool loop Qwen3's template shows the latest assistant turn's thinking: the
    conversation as Responses items and as chat messages (the thinking as reasoning_content)
    gives the same prompt tokens, and more than without the reasoning item (so it was shown)."""
    import httpx

    tool = {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    args, thought = '{"city": "Paris"}', "I should ask the weather tool."
    items: list[dict[str, Any]] = [
        {"role": "user", "content": QUESTION},
        {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": thought}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": args},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]

    def input_tokens(inputs: list[dict[str, Any]]) -> int:
        body = {"input": inputs, "tools": [{"type": "function", **tool}], "max_output_tokens": 1}
        answer = httpx.post(f"{thinking_server.url}/v1/responses", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["usage"]["input_tokens"])

    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": args}}
    chat = {
        "messages": [
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": thought,
                "tool_calls": [call],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [{"type": "function", "function": tool}],
        "max_tokens": 1,
    }
    answer = httpx.post(f"{thinking_server.url}/v1/chat/completions", json=chat, timeout=120)
    assert answer.status_code == 200, answer.text
    shown = input_tokens(items)
    assert shown == answer.json()["usage"]["prompt_tokens"]
    assert input_tokens([items[0], *items[2:]]) < shown
