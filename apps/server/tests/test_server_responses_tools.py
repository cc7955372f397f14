"""Function calls on /v1/responses through the official `openai` client, on the small random
Llama with the Llama 3.2 tokenizer of test_server_tools.py (whose chat format writes Llama
3.x's JSON tool calls; a required call is grammar-constrained, so even random weights make
one): a call is a function_call item, whole or streamed, and sending it back with its output
gives the model the same prompt as chat's tool messages."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response
from test_server_tools import (  # noqa: F401  (pytest finds the fixtures by their names here)
    QUESTION,
    SCHEMAS,
    TOOLS,
    llama_server,
    tools_model_dir,
)

# test_server_tools.py's tools in the Responses API's flat shape.
FLAT_TOOLS: list[Any] = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture(scope="module")
def client(llama_server: Any) -> openai.OpenAI:  # noqa: F811
    return openai.OpenAI(
        base_url=f"{llama_server.url}/v1", api_key="unused", max_retries=0, timeout=300
    )


def _check_call(item: Any, name: str | None = None) -> dict[str, Any]:
    assert item.type == "function_call" and item.status == "completed"
    assert item.id.startswith("fc_") and item.call_id.startswith("call_")
    assert name is None or item.name == name
    arguments = json.loads(item.arguments)
    jsonschema.validate(arguments, SCHEMAS[item.name])
    return arguments  # type: ignore[no-any-return]


def test_a_required_call_is_a_function_call_item_and_goes_back_as_chat_tool_messages(
    client: openai.OpenAI,
    llama_server: Any,  # noqa: F811
) -> None:
    first = client.responses.create(
        model=llama_server.model_name,
        input=[QUESTION],
        tools=FLAT_TOOLS,
        tool_choice="required",
        max_output_tokens=60,
    )
    assert first.status == "completed" and first.output_text == ""
    (call,) = first.output
    _check_call(call)
    assert first.tool_choice == "required" and len(first.tools) == 2
    # The round trip: the call and its output as items, against chat's assistant tool_calls
    # turn and tool message; the same prompt tokens (and so, greedy, the same answer).
    output = json.dumps({"temp": 21})
    history: list[Any] = [
        QUESTION,
        call.model_dump(),  # every field, the unset ones null
        {"type": "function_call_output", "call_id": call.call_id, "output": output},
    ]
    second = client.responses.create(
        model=llama_server.model_name,
        input=history,
        tools=FLAT_TOOLS,
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=60,
        temperature=0,
    )
    chat_history = [
        QUESTION,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": output},
    ]
    chat = client.chat.completions.create(
        model=llama_server.model_name,
        messages=chat_history,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=60,
        temperature=0,
    )
    assert second.usage is not None and chat.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    tokenized = httpx.post(
        f"{llama_server.url}/tokenize", json={"messages": chat_history, "tools": TOOLS}
    ).json()
    assert second.usage.input_tokens == tokenized["count"]
    (again,) = second.output
    assert _check_call(again, "get_time") == json.loads(
        (chat.choices[0].message.tool_calls or [])[0].function.arguments  # type: ignore[union-attr]
    )


def test_a_streamed_call_comes_as_its_argument_events(
    client: openai.OpenAI,
    llama_server: Any,  # noqa: F811
) -> None:
    whole = client.responses.create(
        model=llama_server.model_name,
        input=[QUESTION],
        tools=FLAT_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=0,
    )
    events = list(
        client.responses.create(
            model=llama_server.model_name,
            input=[QUESTION],
            tools=FLAT_TOOLS,
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, delta, done = events[2], events[3], events[4]
    assert added.item.type == "function_call" and added.item.status == "in_progress"
    assert delta.item_id == done.item_id == added.item.id
    (call,) = events[-1].response.output
    (expected,) = whole.output
    assert _check_call(call, "get_weather") == _check_call(expected, "get_weather")
    assert done.arguments == delta.delta == call.arguments  # type: ignore[union-attr]


def test_auto_text_that_is_no_call_stays_a_message(
    client: openai.OpenAI,
    llama_server: Any,  # noqa: F811
) -> None:
    """Without a forced call the answer is a call or text, never both (random weights: text)."""
    answer = httpx.post(
        f"{llama_server.url}/v1/responses",
        json={"input": [QUESTION], "tools": FLAT_TOOLS, "max_output_tokens": 8},
        timeout=300,
    )
    response = Response.model_validate(answer.json())
    kinds = [item.type for item in response.output]
    assert kinds in (["message"], ["function_call"])


def test_tool_choice_none_and_no_tools(
    client: openai.OpenAI,
    llama_server: Any,  # noqa: F811
) -> None:
    none = client.responses.create(
        model=llama_server.model_name,
        input=[QUESTION],
        tools=FLAT_TOOLS,
        tool_choice="none",
        max_output_tokens=4,
    )
    assert [item.type for item in none.output] == ["message"]
    empty = client.responses.create(
        model=llama_server.model_name, input=[QUESTION], tools=[], max_output_tokens=4
    )
    assert empty.tools == [] and empty.tool_choice == "auto"
