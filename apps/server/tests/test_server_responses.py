"""POST /v1/responses through the official `openai` client (its `responses.create`, streamed
and not, which parses every body and event into its pydantic types), on the default model on
the CPU. The oracle for the text and the token counts is the same conversation sent as a chat
completion: both endpoints run one generation path, only the shapes differ."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response
from server_test_support import openai_error
from sv_server.responses_parsing import parse_responses_request
from sv_tokenizer import Message, ToolCall

RunningServer = Any

QUESTION = "What is the capital of France?"
CONVERSATION: list[Any] = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": [{"type": "input_text", "text": "Hello!"}]},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hi. How can I help?", "annotations": []}],
    },
    {"type": "message", "role": "user", "content": QUESTION},
]
# The same conversation as chat messages.
CHAT_FORM = [
    {"role": "system", "content": "Be kind."},
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": QUESTION},
]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _post(server: RunningServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/responses", json=body, timeout=120)


# --- the answer, whole ----------------------------------------------------------------------


def test_a_greedy_response_is_the_greedy_chat_completion(
    client: openai.OpenAI, server: RunningServer
) -> None:
    response = client.responses.create(
        model=server.model_name,
        instructions="Be kind.",
        input=CONVERSATION,
        max_output_tokens=24,
        temperature=0,
    )
    chat = client.chat.completions.create(
        model=server.model_name, messages=CHAT_FORM, max_tokens=24, temperature=0
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.instructions == "Be kind." and response.max_output_tokens == 24
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    usage, chat_usage = response.usage, chat.usage
    assert usage is not None and chat_usage is not None
    assert usage.input_tokens == chat_usage.prompt_tokens
    assert usage.output_tokens == chat_usage.completion_tokens
    assert usage.total_tokens == chat_usage.total_tokens
    finished = chat.choices[0].finish_reason
    assert response.status == ("completed" if finished == "stop" else "incomplete")


def test_the_raw_body_validates_as_the_sdks_response(server: RunningServer) -> None:
    answer = _post(
        server,
        {"model": server.model_name, "input": QUESTION, "max_output_tokens": 6, "temperature": 0},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    response = Response.model_validate(body)
    assert response.status in ("completed", "incomplete") and response.error is None
    assert body["store"] is False and body["tools"] == [] and body["tool_choice"] == "auto"
    assert body["text"] == {"format": {"type": "text"}} and body["parallel_tool_calls"] is True
    usage = body["usage"]  # (cached tokens: test_cached_input_tokens_are_the_prefix_caches)
    assert 0 <= usage["input_tokens_details"]["cached_tokens"] < usage["input_tokens"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == 0


def test_max_output_tokens_gives_an_incomplete_response(
    client: openai.OpenAI, server: RunningServer
) -> None:
    response = client.responses.create(
        model=server.model_name,
        input=QUESTION,
        max_output_tokens=3,
        extra_body={"ignore_eos": True},  # vLLM's, taken here as on chat
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 3
    assert response.output[0].status == "incomplete"


def test_store_metadata_and_tags_are_accepted_and_nothing_is_stored(
    client: openai.OpenAI, server: RunningServer
) -> None:
    response = client.responses.create(
        model=server.model_name,
        input=QUESTION,
        max_output_tokens=2,
        store=True,  # OpenAI's default: accepted, and the answer says nothing was stored
        metadata={"run": "7"},
        user="u1",
        safety_identifier="s1",
        prompt_cache_key="k",
        truncation="disabled",
        include=[],
        service_tier="auto",
        reasoning={},
        parallel_tool_calls=False,
        background=False,
    )
    assert response.store is False and response.metadata == {"run": "7"}
    assert response.parallel_tool_calls is False and response.user == "u1"
    # What clients that keep no state send (Codex CLI): met as it is, nothing dropped, nothing
    # encrypted; an overflow under "auto" is still a 400 naming 'input'.
    asks = {"truncation": "auto", "include": ["reasoning.encrypted_content"]}
    response = client.responses.create(
        model=server.model_name, input=QUESTION, max_output_tokens=2, **asks
    )
    assert response.status == "incomplete" and response.output
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server.model_name, input="word " * 20_000, **asks)
    assert e.value.body["param"] == "input"  # type: ignore[index]


def test_earlier_reasoning_items_and_output_fields_sent_back_are_accepted(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """`input += response.output`: the items come back with their ids and statuses (and a
    reasoning item of an earlier turn, with no text: it gives the turn after it nothing)."""
    first = client.responses.create(
        model=server.model_name, input=QUESTION, max_output_tokens=4, temperature=0
    )
    earlier = {"type": "reasoning", "id": "rs_1", "summary": [], "content": []}
    history: list[Any] = [{"role": "user", "content": QUESTION}, earlier]
    history += first.output  # the client's own objects, as it serializes them
    history.append({"role": "user", "content": "And of Spain?"})
    again = client.responses.create(
        model=server.model_name, input=history, max_output_tokens=4, temperature=0
    )
    chat = client.chat.completions.create(
        model=server.model_name,
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And of Spain?"},
        ],
        max_tokens=4,
        temperature=0,
    )
    assert again.output_text == chat.choices[0].message.content
    assert again.usage is not None and chat.usage is not None
    assert again.usage.input_tokens == chat.usage.prompt_tokens


def test_a_reasoning_item_is_the_next_turns_thinking() -> None:
    """Its reasoning_text goes on the assistant turn that follows it (a message, or function
    calls, which then start a turn of their own), as chat's reasoning_content; an item that is
    not followed by an assistant turn gives nothing."""
    thinking = {
        "type": "reasoning",
        "summary": [],
        "content": [
            {"type": "reasoning_text", "text": "Need "},
            {"type": "reasoning_text", "text": "both."},
        ],
    }
    call = {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"}
    req = parse_responses_request(
        {
            "input": [
                {"role": "user", "content": "Hi"},
                thinking,
                {"role": "assistant", "content": "Looking."},
                thinking,
                call,
                thinking,
                {"role": "user", "content": "Well?"},
            ],
        }
    )
    tool_call = ToolCall("w", "{}", "c1")
    # (a reasoning item's parts are pieces of one thought; a message's parts are joined with
    # newlines, as chat's and vLLM's)
    parts = [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]
    joined = parse_responses_request({"input": [{"role": "user", "content": parts}]})
    assert joined.messages == [Message("user", "a\nb")]
    assert req.messages == [
        Message("user", "Hi"),
        Message("assistant", "Looking.", reasoning_content="Need both."),
        Message("assistant", "", tool_calls=(tool_call,), reasoning_content="Need both."),
        Message("user", "Well?"),
    ]


def test_items_become_the_chat_messages_they_stand_for() -> None:
    """An assistant's text and the function calls after it are one turn; a reasoning item
    without text gives nothing (one with text: test_a_reasoning_item_is_the_next_turns_thinking)."""
    req = parse_responses_request(
        {
            "instructions": "Be kind.",
            "input": [
                {"role": "user", "content": "Weather and time?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "assistant", "content": "Looking."},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "t", "arguments": '{"z": 1}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "noon"}],
                },
                {"type": "function_call", "call_id": "c3", "name": "w", "arguments": "{}"},
            ],
        }
    )
    assert req.kind == "responses" and req.messages == [
        Message("system", "Be kind."),
        Message("user", "Weather and time?"),
        Message(
            "assistant",
            "Looking.",
            tool_calls=(ToolCall("w", "{}", "c1"), ToolCall("t", '{"z": 1}', "c2")),
        ),
        Message("tool", "sunny", tool_call_id="c1"),
        Message("tool", "noon", tool_call_id="c2"),
        Message("assistant", "", tool_calls=(ToolCall("w", "{}", "c3"),)),
    ]


def test_what_the_sdks_own_input_types_dump_is_read_as_they_mean_it() -> None:
    """The SDK's message types dump `"type": None` (its field is optional: a message), an
    assistant message's `phase`, and an output message's refusal part, whose text is what the
    assistant said (each was a 400)."""
    from openai.types.responses import EasyInputMessage

    asked = EasyInputMessage(role="user", content="Hello!").model_dump()
    assert asked["type"] is None
    req = parse_responses_request(
        {
            "input": [
                asked,
                {"role": "assistant", "content": "Hi.", "phase": "final_answer"},
                {"role": "user", "content": "Tell me a secret."},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "refusal", "refusal": "I can't share that."}],
                },
            ]
        }
    )
    assert req.messages == [
        Message("user", "Hello!"),
        Message("assistant", "Hi."),
        Message("user", "Tell me a secret."),
        Message("assistant", "I can't share that."),
    ]


def test_cached_input_tokens_are_the_prefix_caches(server: RunningServer) -> None:
    """usage.input_tokens_details.cached_tokens counts the prompt tokens the prefix cache
    served (it was always 0): the second of two identical requests reports what /metrics'
    prefix-cache counter gained for it."""
    body = {"model": server.model_name, "input": "word " * 300, "max_output_tokens": 1}
    first = _post(server, body).json()["usage"]["input_tokens_details"]["cached_tokens"]
    before = server.wait_idle()["sv_prefix_cache_hit_tokens_total"]
    usage = _post(server, body).json()["usage"]
    gained = server.wait_idle()["sv_prefix_cache_hit_tokens_total"] - before
    assert first < usage["input_tokens_details"]["cached_tokens"] == gained
    assert 0 < gained < usage["input_tokens"]


def test_cached_input_tokens_survive_a_stop_string(server: RunningServer) -> None:
    """An answer a stop string ends (the server cancels its request at the stop) reports the
    prompt tokens the prefix cache served as one that ran to its end does (it said 0)."""
    body = {
        "model": server.model_name,
        "input": "Please tell me a long story about a brave dragon and a wise old knight. " * 4,
        "max_output_tokens": 6,
        "temperature": 0,
    }
    whole = _post(server, body).json()  # (and the prompt is in the cache now)
    text = whole["output"][0]["content"][0]["text"]
    assert whole["status"] == "incomplete" and len(text) > 2
    before = server.wait_idle()["sv_prefix_cache_hit_tokens_total"]
    # (a stop that ends well before the last token: the server cancels the request)
    stopped = _post(server, {**body, "stop": [text[1:6]]}).json()
    assert stopped["usage"]["output_tokens"] < whole["usage"]["output_tokens"]
    gained = server.wait_idle()["sv_prefix_cache_hit_tokens_total"] - before
    assert stopped["status"] == "completed"
    assert stopped["output"][0]["content"][0]["text"] == text[:1]
    assert 0 < gained == stopped["usage"]["input_tokens_details"]["cached_tokens"]


def test_truncation_completed_at_and_cache_retention_are_echoed(
    client: openai.OpenAI, server: RunningServer
) -> None:
    yes = {"type": "object", "properties": {"a": {"enum": ["yes"]}}, "required": ["a"]}
    done = client.responses.create(  # (a schema with one answer: it completes within budget)
        model=server.model_name,
        input="Say yes.",
        max_output_tokens=64,
        temperature=0,
        text={
            "format": {
                "type": "json_schema",
                "name": "yes",
                "schema": {**yes, "additionalProperties": False},
            }
        },
        truncation="auto",
        prompt_cache_retention="24h",
    )
    assert done.status == "completed" and done.truncation == "auto"
    assert done.completed_at is not None and done.completed_at >= done.created_at
    assert done.prompt_cache_retention == "24h"
    cut = client.responses.create(
        model=server.model_name,
        input=QUESTION,
        max_output_tokens=2,
        extra_body={"ignore_eos": True},
    )
    assert cut.status == "incomplete" and cut.completed_at is None
    assert cut.truncation == "disabled"
    error = openai_error(_post(server, {"input": "hi", "prompt_cache_retention": "forever"}), 400)
    assert error["param"] == "prompt_cache_retention"


# --- log-probabilities ----------------------------------------------------------------------

LOGPROBS = "message.output_text.logprobs"
COPY = "Copy exactly: the red fox and the blue bird sat on the old green fence."


def _stream_events(server: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream(
        "POST", f"{server.url}/v1/responses", json={**body, "stream": True}, timeout=300
    ) as response:
        assert response.status_code == 200, response.read()
        return [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]


@pytest.mark.parametrize("stop", ["none", "held", "cut"])
def test_streamed_logprobs_come_with_their_tokens_text(speculating: Any, stop: str) -> None:
    """Each output_text.delta carries the entries of the tokens whose text it completes: the
    entries so far spell a prefix of the text so far, even where several tokens come at once
    and a stop string holds their text back ("held": one that never completes; "cut": one
    that ends the answer inside a token). Together they are the whole answer's (the oracle),
    the stop string's cut tokens' last, on a delta of no text."""
    body: dict[str, Any] = {
        "model": speculating.model_name,
        "input": COPY,
        "max_output_tokens": 24,
        "temperature": 0,
        "include": [LOGPROBS],
        "top_logprobs": 1,
    }
    plain = _post(speculating, body).json()["output"][0]["content"][0]
    text, tokens = plain["text"], [e["token"] for e in plain["logprobs"]]
    assert "".join(tokens) == text and len(tokens) >= 8
    starts = [len("".join(tokens[:i])) for i in range(len(tokens))]
    if stop != "none":
        first = starts[1] + 1  # inside the second token: held back from there
        # (never completed: the answer has no such character; or completed in the sixth)
        body["stop"] = [
            text[first : starts[5] + 1] + "\u00a7"
            if stop == "held"
            else text[first : starts[5] + 2]
        ]
    whole = _post(speculating, body).json()["output"][0]["content"][0]
    events = _stream_events(speculating, body)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == whole["text"]
    assert whole["text"] == (text if stop != "cut" else text[: starts[1] + 1])
    shown, spelt = "", b""
    for delta in deltas:
        shown += delta["delta"]
        spelt += b"".join(bytes(e["bytes"]) for e in delta["logprobs"])
        if delta["delta"]:  # (a last delta of no text: the cut tokens')
            assert shown.encode().startswith(spelt), (shown, spelt)
    assert any(len(d["logprobs"]) > 1 for d in deltas)  # several tokens at once
    streamed = [e for d in deltas for e in d["logprobs"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in whole["logprobs"]]
    assert [e["logprob"] for e in streamed] == pytest.approx(
        [e["logprob"] for e in whole["logprobs"]], abs=1e-4
    )
    if stop == "cut":  # every token generated is scored, the cut ones too
        assert [e["token"] for e in whole["logprobs"]] == tokens[:6]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["logprobs"] == streamed


def test_logprobs_are_the_chat_completions_whole_and_streamed(
    client: openai.OpenAI, server: RunningServer
) -> None:
    asked: dict[str, Any] = {"include": [LOGPROBS], "top_logprobs": 2}
    request = {"model": server.model_name, "input": QUESTION, "max_output_tokens": 8}
    whole = client.responses.create(**request, **asked, temperature=0)
    chat = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    expected = (chat.choices[0].logprobs.content or []) if chat.choices[0].logprobs else []
    (message,) = whole.output
    assert message.type == "message"
    logprobs = message.content[0].logprobs or []  # type: ignore[union-attr]
    assert len(logprobs) == len(expected) > 0 and whole.top_logprobs == 2
    # (the same tokens; their values to float noise: a prompt's KV may come from the prefix
    # cache or be computed anew, in other sums)
    for got, want in zip(logprobs, expected, strict=True):
        assert (got.token, got.bytes) == (want.token, want.bytes)
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert [t.token for t in got.top_logprobs] == [t.token for t in want.top_logprobs]
        assert [t.logprob for t in got.top_logprobs] == pytest.approx(
            [t.logprob for t in want.top_logprobs], abs=1e-4
        )
    events = list(client.responses.create(**request, **asked, temperature=0, stream=True))
    streamed = [
        (lp.token, lp.logprob)
        for e in events
        if e.type == "response.output_text.delta"
        for lp in e.logprobs
    ]
    assert [t for t, _ in streamed] == [lp.token for lp in logprobs]
    assert [v for _, v in streamed] == pytest.approx([lp.logprob for lp in logprobs], abs=1e-4)
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [lp.token for lp in done.logprobs] == [lp.token for lp in logprobs]
    # Not asked for: none.
    plain = client.responses.create(**request, temperature=0)
    assert plain.output[0].content[0].logprobs == []  # type: ignore[union-attr]


# --- structured output ----------------------------------------------------------------------


def test_text_format_json_schema_validates(client: openai.OpenAI, server: RunningServer) -> None:
    response = client.responses.create(
        model=server.model_name,
        input="Describe Lisbon as JSON.",
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}},
        temperature=0,
    )
    assert response.status == "completed", response.output_text
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"


def test_the_sdks_parse_helper_reads_a_pydantic_models_schema(
    client: openai.OpenAI, server: RunningServer
) -> None:
    import pydantic

    class City(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=20)
        coastal: bool

    response = client.responses.parse(
        model=server.model_name,
        input="Describe Lisbon as JSON.",
        max_output_tokens=40,
        temperature=0,
        text_format=City,
    )
    assert isinstance(response.output_parsed, City)


def test_text_format_json_schema_streamed_validates(
    client: openai.OpenAI, server: RunningServer
) -> None:
    response = client.responses.create(
        model=server.model_name,
        input="Describe Lisbon as JSON.",
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}},
        temperature=0.7,
        extra_body={"seed": 5},  # vLLM's sampling extras, taken here as on chat
        stream=True,
    )
    events = list(response)
    assert events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    jsonschema.validate(json.loads(text), SCHEMA)
    assert events[-1].response.output_text == text


def test_text_format_json_object_constrains_the_text(
    client: openai.OpenAI, server: RunningServer
) -> None:
    response = client.responses.create(
        model=server.model_name,
        input="Describe Lisbon as JSON.",
        max_output_tokens=30,
        text={"format": {"type": "json_object"}},
        temperature=0,
    )
    # (a small model's object may outrun the budget: then it is an object's start)
    assert response.output_text.lstrip().startswith("{")
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)


def test_vllms_structured_outputs_constrains_the_text(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """vLLM's `structured_outputs`, which its /v1/responses takes beside `text.format`."""
    response = client.responses.create(
        model=server.model_name,
        input="Is Lisbon in Portugal?",
        max_output_tokens=10,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert response.status == "completed" and response.output_text in ("yes", "no")


# --- streamed -------------------------------------------------------------------------------


def _event_types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def test_streamed_events_come_in_openais_order_and_add_up_to_the_whole_answer(
    client: openai.OpenAI, server: RunningServer
) -> None:
    whole = client.responses.create(
        model=server.model_name, input=QUESTION, max_output_tokens=16, temperature=0
    )
    events = list(
        client.responses.create(
            model=server.model_name,
            input=QUESTION,
            max_output_tokens=16,
            temperature=0,
            stream=True,
        )
    )
    types = _event_types(events)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    last = "response.completed" if whole.status == "completed" else "response.incomplete"
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(d.delta for d in deltas)
    assert text == whole.output_text
    done = events[-1].response
    assert done.output_text == text and done.status == whole.status
    # The same counts, but for the prompt tokens served from the prefix cache: the first
    # answer may have filled it for the second.
    assert done.usage is not None and whole.usage is not None
    cached = "input_tokens_details"
    assert done.usage.model_dump(exclude={cached}) == whole.usage.model_dump(exclude={cached})
    assert whole.usage.input_tokens_details.cached_tokens <= (
        done.usage.input_tokens_details.cached_tokens
    )
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in deltas) and done.output[0].id == item_id


def test_an_answer_of_nothing_is_one_empty_message_whole_and_streamed(
    client: openai.OpenAI, server: RunningServer
) -> None:
    eos = sorted(server.app.state.server.tokenizer.eos_ids)
    request: dict[str, Any] = {
        "model": server.model_name,
        "input": QUESTION,
        "max_output_tokens": 4,
        "extra_body": {"allowed_token_ids": eos},  # vLLM's: only a stop token can come
    }
    whole = client.responses.create(**request)
    events = list(client.responses.create(**request, stream=True))
    assert whole.usage is not None and whole.usage.output_tokens == 1
    for response in (whole, events[-1].response):
        assert response.status == "completed" and response.output_text == ""
        assert [item.type for item in response.output] == ["message"]
    assert "response.output_text.delta" not in [e.type for e in events]


def test_the_sdks_stream_helper_assembles_the_same_response(
    client: openai.OpenAI, server: RunningServer
) -> None:
    with client.responses.stream(
        model=server.model_name, input=QUESTION, max_output_tokens=10, temperature=0
    ) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(texts)


def test_the_raw_stream_names_each_event_and_sends_no_done(server: RunningServer) -> None:
    body = {"model": server.model_name, "input": QUESTION, "max_output_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=120) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        blocks = answer.read().decode().strip().split("\n\n")
    for block in blocks:
        event_line, data_line = block.split("\n")
        kind = event_line.removeprefix("event: ")
        assert json.loads(data_line.removeprefix("data: "))["type"] == kind
    assert "[DONE]" not in blocks[-1]


# --- refusals -------------------------------------------------------------------------------

BASE: dict[str, Any] = {"input": QUESTION, "max_output_tokens": 2}


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        ({"input": None}, "input", "'input' must be a string or a list"),
        ({"input": []}, "input", "at least one item"),
        ({"input": [3]}, "input", "input[0] must be an object"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
            "input[0].content[0] is an input_image part",
        ),
        (
            {"input": [{"role": "user", "content": "a"}, {"role": "user", "content": [{}]}]},
            "input",
            "input[1].content[0].type must be 'input_text'",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
            "input",
            "input[0].content[0].type must be 'output_text'",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input", "input[0].role must be"),
        (
            {"input": [{"type": "item_reference", "id": "msg_1"}]},
            "input",
            "input[0] is of type 'item_reference'",
        ),
        (
            {"input": [{"type": "web_search_call", "id": "ws_1"}]},
            "input",
            "input[0] is of type 'web_search_call'",
        ),
        (
            {"input": [{"role": "user", "content": "x", "extra": 1}]},
            "input",
            "unknown field 'input[0].extra'",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[]"}]},
            "input",
            "input[0].arguments must be a JSON object's text",
        ),
        (
            {"input": [{"type": "function_call_output", "output": "x"}]},
            "input",
            "input[0].call_id must be a string",
        ),
        ({"instructions": 3}, "instructions", "'instructions' must be a string"),
        ({"tools": [{"type": "web_search"}]}, "tools", "tools[0] is of type 'web_search'"),
        (
            {"tools": [{"type": "function", "name": "f", "function": {}}]},
            "tools",
            "unknown field 'tools[0].function'",
        ),
        ({"tool_choice": "required"}, "tool_choice", "'tool_choice' needs 'tools'"),
        (
            {"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "file_search"}},
            "tool_choice",
            "'tool_choice' must be",
        ),
        ({"text": {"format": {"type": "xml"}}}, "text", "'text.format.type' must be"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x"}}},
            "text",
            "needs a 'name' (a string) and a 'schema'",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}},
            "text",
            "'text.format.schema'",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": 1}}},
            "text",
            "'text.format.strict' must be true or false",
        ),
        (
            {"structured_outputs": {"regex": "a"}, "text": {"format": {"type": "json_object"}}},
            "structured_outputs",
            "not 'text.format' and 'structured_outputs'",
        ),
        (
            {
                "structured_outputs": {"regex": "a"},
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": "required",
            },
            "tool_choice",
            "drop 'structured_outputs'",
        ),
        ({"structured_outputs": {"regex": "("}}, "structured_outputs", "structured_outputs.regex"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
        ({"conversation": "conv_1"}, "conversation", "stores no responses"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "stores no responses"),
        ({"background": True}, "background", "in the foreground"),
        ({"truncation": "middle"}, "truncation", "takes 'disabled' or 'auto'"),
        ({"include": ["file_search_call.results"]}, "include", "takes only"),
        ({"include": "x"}, "include", "takes only"),
        ({"top_logprobs": 2}, "top_logprobs", "needs 'include'"),
        ({"include": [LOGPROBS], "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "no reasoning effort"),
        ({"service_tier": "flex"}, "service_tier", "one service tier"),
        ({"metadata": {"a": 1}}, "metadata", "'metadata' must be an object"),
        ({"store": "yes"}, "store", "'store' must be true or false"),
        ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
        ({"temperature": 3}, "temperature", "'temperature' must be between"),
        ({"messages": []}, "messages", "unknown field 'messages'"),
        ({"n": 2}, "n", "unknown field 'n'"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options", "'stream': true"),
        ({"model": "gpt-4o"}, "model", "does not exist"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(
    server: RunningServer, change: dict[str, Any], param: str, says: str
) -> None:
    answer = _post(server, BASE | change)
    error = openai_error(answer, 404 if param == "model" else 400)
    assert error["param"] == param, error
    assert says in error["message"], error["message"]


def test_nulls_of_what_needs_storage_ask_for_nothing(server: RunningServer) -> None:
    body = BASE | {"previous_response_id": None, "conversation": None, "prompt": None}
    assert _post(server, body).status_code == 200


def test_the_routes_checks_apply(make_server: Any) -> None:
    """The API key, the content type and the body size limit, as on the other routes."""
    guarded = make_server(api_key="k", max_request_bytes=1000)
    try:
        url = f"{guarded.url}/v1/responses"
        key = {"Authorization": "Bearer k"}
        openai_error(httpx.post(url, json=BASE), 401)
        openai_error(httpx.post(url, content=b"{}", headers=key), 415)
        openai_error(httpx.post(url, json=BASE | {"input": "x" * 2000}, headers=key), 413)
        assert httpx.post(url, json=BASE, headers=key, timeout=120).status_code == 200
        openai_error(httpx.get(f"{url}/resp_x"), 401)
        assert openai_error(httpx.get(f"{url}/resp_x", headers=key), 404)["param"] == "response_id"
    finally:
        guarded.stop()


def test_an_output_budget_beyond_the_context_names_max_output_tokens(
    server: RunningServer,
) -> None:
    error = openai_error(_post(server, BASE | {"max_output_tokens": 10**7}), 400)
    assert error["param"] == "max_output_tokens" and "max_output_tokens is" in error["message"]


def test_the_sdk_raises_its_bad_request_error(client: openai.OpenAI, server: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError, match="stores no responses"):
        client.responses.create(
            model=server.model_name, input=QUESTION, previous_response_id="resp_123"
        )


def _assert_response_not_found(error: Any, response_id: str) -> None:
    """OpenAI's answer for a response it does not have (vLLM's too), as its client reads it."""
    assert isinstance(error, openai.NotFoundError) and error.status_code == 404
    assert error.body == {
        "message": f"Response with id '{response_id}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": None,
    }
    assert f"Response with id '{response_id}' not found." in str(error)


def test_the_sdks_calls_on_a_stored_response_find_none(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """Nothing is stored (an answer's `store` is false): retrieving, deleting or cancelling a
    response, or listing its input items, is OpenAI's 404 for an id it does not know, also
    for the id of a response this server has just given."""
    given = client.responses.create(model=server.model_name, input=QUESTION, max_output_tokens=2)
    for response_id in ("resp_x", given.id):
        calls = [
            client.responses.retrieve,
            client.responses.delete,
            client.responses.cancel,
            client.responses.input_items.list,
        ]
        for call in calls:
            with pytest.raises(openai.NotFoundError) as not_found:
                call(response_id)
            _assert_response_not_found(not_found.value, response_id)


def test_other_paths_under_responses_stay_unknown_routes(server: RunningServer) -> None:
    """OpenAI's POST /v1/responses/input_tokens (and the like) is not served: still the 404 of
    an unknown route, not a 405 of the stored-response route its path matches."""
    error = openai_error(httpx.post(f"{server.url}/v1/responses/input_tokens", json={}), 404)
    assert error["code"] == "not_found" and "/v1/responses/input_tokens" in error["message"]
    error = openai_error(httpx.get(f"{server.url}/v1/responses/resp_x/other"), 404)
    assert error["code"] == "not_found"


def test_a_prompt_that_overflows_the_context_is_a_400_naming_input(server: RunningServer) -> None:
    answer = _post(server, {"input": "hello " * 20_000})
    error = openai_error(answer, 400)
    assert error["param"] == "input" and error["code"] == "context_length_exceeded"


# --- clients that go away, and failures -----------------------------------------------------

LONG = {"input": "Count: 1, 2, 3,", "max_output_tokens": 400, "ignore_eos": True}


def test_a_hang_up_mid_stream_cancels_the_request(server: RunningServer) -> None:
    before = server.wait_idle()
    body = LONG | {"stream": True}
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body, timeout=60) as answer:
        deltas = 0
        for line in answer.iter_lines():
            deltas += line == "event: response.output_text.delta"
            if deltas == 3:
                break  # leaving the block closes the connection mid-stream
    cancelled, generated = server.after_hang_up(before)
    assert cancelled == 1 and 3 <= generated < 400


def test_a_hang_up_while_waiting_for_the_whole_response_cancels(server: RunningServer) -> None:
    before = server.wait_idle()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/responses", json=LONG, timeout=1.5)
    _, generated = server.after_hang_up(before)
    assert generated < 400


def test_a_failure_after_the_stream_began_is_an_error_event(
    client: openai.OpenAI, server: RunningServer
) -> None:
    engine = server.app.state.server.loop.engine
    real_step = engine.step
    steps = 0

    def failing_step() -> Any:
        nonlocal steps
        steps += 1
        if steps == 4:  # a few tokens in: the status line and the first events are sent
            engine.step = real_step
            raise RuntimeError("injected fault")
        return real_step()

    server.wait_idle()
    engine.step = failing_step
    try:
        stream = client.responses.create(
            model=server.model_name,
            input=QUESTION,
            max_output_tokens=50,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        events = list(stream)  # the client parses the error event as its ResponseErrorEvent
    finally:
        engine.step = real_step
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in types and types[-1] == "error"
    error = events[-1]
    assert "injected fault" in error.message and error.sequence_number == len(events) - 1
    assert server.wait_idle()["sv_kv_cache_pages_used"] == 0
