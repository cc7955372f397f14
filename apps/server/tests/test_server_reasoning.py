"""`sv serve --reasoning-parser`: a small random model (seeded) with Qwen3's real tokenizer and
template, served twice, with the flag and without. The same seeded request gives the same
tokens on both; the raw text (no flag), split by hand, must be what the flag gives, whole and
streamed (through the openai client, which shows `reasoning_content` as an extra field).

The random model says nothing sensible, so a `logit_bias` on `<think>` and `</think>` makes
them come up often, at random places: answers with a think block, without, cut mid-thought,
and with tags after the thinking."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

THINK, END = 151667, 151668  # Qwen3's <think> and </think>
QUESTION = [{"role": "user", "content": "What is 2+2?"}]
TAGS_OFTEN = {str(THINK): 9, str(END): 9}

# (name, the request's fields, the prompt's last think tag: "open" <think>, "closed" </think>,
# or None)
VARIANTS: list[tuple[str, dict[str, Any], str | None]] = [
    ("plain", {"messages": QUESTION}, None),
    (
        "prefilled-thinking",
        {
            "messages": [*QUESTION, {"role": "assistant", "content": "<think>\nHmm"}],
            "continue_final_message": True,
        },
        "open",
    ),
    (
        "thinking-off",
        {"messages": QUESTION, "chat_template_kwargs": {"enable_thinking": False}},
        "closed",
    ),
    ("strong-think", {"messages": QUESTION, "logit_bias": {str(THINK): 11, str(END): 9}}, None),
]


def opened(parser: str, last_tag: str | None) -> bool:
    """Whether the answer is thinking from its start: a prompt that closed the thinking, never;
    else one that left it open, and under deepseek_r1 any."""
    return last_tag == "open" or (parser == "deepseek_r1" and last_tag is None)


def by_hand(raw: str, open_at_start: bool) -> tuple[str | None, str | None]:
    """The documented rule, written out: a leading <think> or an open prompt starts the
    thinking, the first </think> ends it; (reasoning_content, content)."""
    starts_with_tag = raw[:7] == "<think>"
    if not (starts_with_tag or open_at_start):
        return None, raw
    body = raw[7:] if starts_with_tag else raw
    end = body.find("</think>")
    if end < 0:
        return body or None, None
    return body[:end] or None, body[end + 8 :] or None


@pytest.fixture(scope="module")
def servers(tiny_qwen3_dir: Path) -> Iterator[dict[str, Any]]:
    from server_test_support import RunningServer

    running = {
        "raw": RunningServer(tiny_qwen3_dir, kv_cache_mib=64),
        "qwen3": RunningServer(tiny_qwen3_dir, kv_cache_mib=64, reasoning_parser="qwen3"),
        "deepseek_r1": RunningServer(
            tiny_qwen3_dir, kv_cache_mib=64, reasoning_parser="deepseek_r1"
        ),
    }
    yield running
    for server in running.values():
        server.stop()


def _client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


# vLLM's fields, which the openai client sends in extra_body
EXTRA_FIELDS = (
    "continue_final_message",
    "chat_template_kwargs",
    "guided_regex",
    "guided_choice",
    "allowed_token_ids",
)


def _request(fields: dict[str, Any], **more: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": 20, "n": 3, "seed": 3, "logit_bias": TAGS_OFTEN}
    return body | fields | more


def _create(server: Any, body: dict[str, Any]) -> Any:
    body = dict(body)
    extra = {k: body.pop(k) for k in EXTRA_FIELDS if k in body}
    return _client(server).chat.completions.create(
        model=server.model_name, extra_body=extra or None, **body
    )


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize(("name", "fields", "last_tag"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_the_flag_gives_the_raw_text_split_by_hand(
    servers: dict[str, Any], parser: str, name: str, fields: dict[str, Any], last_tag: str | None
) -> None:
    body = _request(fields, logprobs=True, top_logprobs=2)
    raw = _create(servers["raw"], body)
    split = _create(servers[parser], body)
    # completion_tokens: every token, the thinking's too; without the flag, no details
    assert raw.usage.completion_tokens_details is None
    assert split.usage.model_dump(exclude={"completion_tokens_details"}) == raw.usage.model_dump(
        exclude={"completion_tokens_details"}
    )
    thinking_tokens = 0
    seen = set()
    for got, expected in zip(split.choices, raw.choices, strict=True):
        assert not {"reasoning", "reasoning_content"} & set(expected.message.model_extra or {})
        reasoning, content = by_hand(expected.message.content, opened(parser, last_tag))
        # vLLM's newer name and its older one, the same text
        assert got.message.model_extra["reasoning"] == got.message.reasoning_content
        counted = thinking_of(expected.logprobs.content, opened(parser, last_tag))
        # the counted tokens are those whose text is the thinking
        assert b"".join(bytes(t.bytes) for t in counted).decode() == (reasoning or "")
        thinking_tokens += len(counted)
        assert (got.message.reasoning_content, got.message.content) == (reasoning, content)
        assert got.finish_reason == expected.finish_reason
        # per token, unchanged (the values to rounding: what shares an engine step moves them)
        got_lp, expected_lp = got.logprobs.content, expected.logprobs.content
        assert [t.token for t in got_lp] == [t.token for t in expected_lp]
        assert [t.logprob for t in got_lp] == pytest.approx([t.logprob for t in expected_lp])
        seen.add((reasoning is None, content is None))
    # the variants cover what they are meant to (seen: (no reasoning, no content) per choice)
    if name == "thinking-off" or (parser == "qwen3" and name == "plain"):
        assert seen == {(True, False)}  # all content, a </think> in it as text
    if opened(parser, last_tag):
        assert (False, False) in seen  # thinking, then content
        assert (False, True) in seen  # no </think>: all thinking
    if name == "strong-think":  # answers that start with <think>
        assert any(not no_reasoning for no_reasoning, _ in seen)
    assert split.usage.completion_tokens_details.reasoning_tokens == thinking_tokens


def thinking_of(tokens: list[Any], open_at_start: bool) -> list[Any]:
    """The tokens (logprobs entries of the answer without the flag; a stop token has none) of
    the thinking, by the documented rule: after a leading <think> or from the start of an
    answer that opens in thinking, up to the first </think>; neither tag."""
    names = [t.token for t in tokens]
    if names[:1] == ["<think>"]:
        start = 1
    elif open_at_start:
        start = 0
    else:
        return []
    end = names.index("</think>", start) if "</think>" in names[start:] else len(names)
    return tokens[start:end]


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize(("name", "fields", "last_tag"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_streamed_deltas_concatenate_to_the_whole_answer(
    servers: dict[str, Any], parser: str, name: str, fields: dict[str, Any], last_tag: str | None
) -> None:
    body = _request(fields, logprobs=True)
    whole = _create(servers[parser], body)
    stream = _create(
        servers[parser], body | {"stream": True, "stream_options": {"include_usage": True}}
    )
    usage = None
    reasoning: dict[int, str] = {}
    content: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta
            piece = getattr(delta, "reasoning_content", None)
            assert getattr(delta, "reasoning", None) == piece  # both names, or neither
            if piece is not None:
                assert "</think>" not in piece and piece
                reasoning[choice.index] = reasoning.get(choice.index, "") + piece
            content[choice.index] = content.get(choice.index, "") + (delta.content or "")
            if choice.logprobs is not None and choice.logprobs.content:
                tokens.setdefault(choice.index, []).extend(t.token for t in choice.logprobs.content)
            if choice.finish_reason is not None:
                finish[choice.index] = choice.finish_reason
    for choice in whole.choices:
        i = choice.index
        assert reasoning.get(i, "") == (choice.message.reasoning_content or "")
        assert content.get(i, "") == (choice.message.content or "")
        assert tokens.get(i, []) == [t.token for t in choice.logprobs.content]
        assert finish[i] == choice.finish_reason
    assert usage == whole.usage  # reasoning_tokens included


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("name", ["prefilled-thinking", "strong-think"])
def test_continuous_usage_counts_each_choices_own_thinking(
    servers: dict[str, Any], parser: str, name: str
) -> None:
    """vLLM's continuous_usage_stats under a reasoning parser: a chunk's usage is its own
    choice's so far, its reasoning_tokens those of that choice's tokens so far that are
    thinking (by the documented rule over its logprobs entries; the stop token, which has
    none, counts in completion_tokens only)."""
    fields, last_tag = next((v[1], v[2]) for v in VARIANTS if v[0] == name)
    body = _request(fields, logprobs=True, stream=True)
    body["stream_options"] = {"continuous_usage_stats": True}
    tokens: dict[int, list[Any]] = {}
    prompt_tokens = set()
    for chunk in _create(servers[parser], body):
        (choice,) = chunk.choices
        entries = tokens.setdefault(choice.index, [])
        if choice.logprobs is not None and choice.logprobs.content:
            entries.extend(choice.logprobs.content)
        stop_token = choice.finish_reason == "stop"  # (no stop string here: the EOS token)
        usage = chunk.usage
        prompt_tokens.add(usage.prompt_tokens)
        assert usage.completion_tokens == len(entries) + stop_token
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        thinking = thinking_of(entries, opened(parser, last_tag))
        assert usage.completion_tokens_details.reasoning_tokens == len(thinking)
    assert sorted(tokens) == [0, 1, 2] and len(prompt_tokens) == 1
    counts = [len(thinking_of(t, opened(parser, last_tag))) for t in tokens.values()]
    assert len(set(counts)) > 1  # the choices thought differently long: a sum would show


# `</think>` spelled in ordinary tokens of Qwen3's vocabulary ("</", "think", ">"), not its
# added token; with "a", the only tokens the answers may use
SPELLED_END = ["</", "think", ">"]
SPELLING = {"allowed_token_ids": [522, 26865, 29, 64]}


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("seed", [4, 8])  # seeds whose answers spell it, first or later
def test_a_tag_spelled_in_ordinary_tokens_counts_as_the_split_reads_it(
    servers: dict[str, Any], parser: str, seed: int
) -> None:
    """The split reads the text: a `</think>` spelled in pieces ends the thinking as the added
    token does. reasoning_tokens agrees with it: the tokens before the spelled tag (its pieces
    no more counted than the added token is, nor what follows), whole, streamed, and on each
    streamed chunk of its choice."""
    body = _request(VARIANTS[1][1], max_tokens=24, n=4, logprobs=True, seed=seed) | SPELLING
    raw = _create(servers["raw"], body)
    split = _create(servers[parser], body)
    expected = []
    for got, plain in zip(split.choices, raw.choices, strict=True):
        names = [t.token for t in plain.logprobs.content]
        end = next((i for i in range(len(names)) if names[i : i + 3] == SPELLED_END), len(names))
        reasoning, content = by_hand(plain.message.content, True)
        assert "".join(names[:end]) == (reasoning or "")  # the text's thinking: those tokens
        assert (got.message.reasoning_content, got.message.content) == (reasoning, content)
        expected.append(end)
    assert any(0 < end < 24 for end in expected)  # the seed spells the tag after thinking
    assert split.usage.completion_tokens_details.reasoning_tokens == sum(expected)
    stream = body | {"stream": True}
    stream["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    last: dict[int, int] = {}
    usage = None
    for chunk in _create(servers[parser], stream):
        usage = chunk.usage
        for choice in chunk.choices:
            so_far = chunk.usage.completion_tokens_details.reasoning_tokens
            assert so_far >= last.get(choice.index, 0)  # never taken back
            last[choice.index] = so_far
    assert [last[i] for i in range(4)] == expected
    assert usage is not None and usage.completion_tokens_details.reasoning_tokens == sum(expected)


def test_stop_strings_apply_to_the_whole_text_thinking_included(
    servers: dict[str, Any],
) -> None:
    fields = VARIANTS[1][1]  # prefilled thinking
    raw = _create(servers["raw"], _request(fields))
    # a stop string from the middle of an answer's thinking or content
    text = next(c.message.content for c in raw.choices if len(c.message.content) > 12)
    stop = text[6:9]
    body = _request(fields, stop=[stop])
    raw = _create(servers["raw"], body)
    split = _create(servers["qwen3"], body)
    for got, expected in zip(split.choices, raw.choices, strict=True):
        reasoning, content = by_hand(expected.message.content, True)
        assert (got.message.reasoning_content, got.message.content) == (reasoning, content)
        assert got.finish_reason == expected.finish_reason


def test_tools_read_only_the_content(servers: dict[str, Any]) -> None:
    """With tools offered (auto), the answer still splits the same; the random model writes no
    call, so no choice becomes one (the content-only reading: test_reasoning_parser.py)."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    body = _request(VARIANTS[1][1], tools=tools)
    raw = _create(servers["raw"], body)
    split = _create(servers["qwen3"], body)
    for got, expected in zip(split.choices, raw.choices, strict=True):
        assert expected.message.tool_calls is None and got.message.tool_calls is None
        reasoning, content = by_hand(expected.message.content, True)
        assert (got.message.reasoning_content, got.message.content) == (reasoning, content)


def test_completions_stay_raw_text(servers: dict[str, Any]) -> None:
    body = {"prompt": "<think>a</think>b", "max_tokens": 12, "seed": 1, "logit_bias": TAGS_OFTEN}
    replies = [
        httpx.post(f"{servers[k].url}/v1/completions", json=body, timeout=60).json()
        for k in ("raw", "qwen3")
    ]
    assert replies[0]["choices"] == replies[1]["choices"]
    assert "reasoning_content" not in replies[1]["choices"][0]
    assert replies[0]["usage"] == replies[1]["usage"]  # no reasoning_tokens
    assert "completion_tokens_details" not in replies[1]["usage"]


# --- output constraints: the grammar binds only the answer after </think> ---------------------

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer"],
    "additionalProperties": False,
}


def _json_ok(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), ANSWER_SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


# (name, the request's constraint, the oracle of a whole answer, of what could begin one)
CONSTRAINTS: list[tuple[str, dict[str, Any], Callable[[str], bool], Callable[[str], bool]]] = [
    (
        "regex",
        {"guided_regex": "[0-9]{1,3}"},
        lambda text: re.fullmatch("[0-9]{1,3}", text) is not None,
        lambda text: re.fullmatch("[0-9]{0,3}", text) is not None,
    ),
    (
        "choice",
        {"guided_choice": ["yes", "no"]},
        lambda text: text in ("yes", "no"),
        lambda text: "yes".startswith(text) or "no".startswith(text),
    ),
    (
        "json_schema",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA},
            }
        },
        _json_ok,
        lambda text: '{"answer":'.startswith(text[:10]),
    ),
]


@pytest.mark.parametrize(
    ("parser", "variant"),
    [("qwen3", "prefilled-thinking"), ("qwen3", "strong-think"), ("deepseek_r1", "plain")],
)
@pytest.mark.parametrize(
    ("name", "constraint", "valid", "could_start"), CONSTRAINTS, ids=[c[0] for c in CONSTRAINTS]
)
def test_a_constraint_binds_only_the_answer_after_the_thinking(
    servers: dict[str, Any],
    parser: str,
    variant: str,
    name: str,
    constraint: dict[str, Any],
    valid: Callable[[str], bool],
    could_start: Callable[[str], bool],
) -> None:
    """The thinking is the very text of the same seeded request without the constraint
    (nothing masked it: text the constraint could never begin with is in it), and the content
    after </think> matches the constraint. (Under qwen3 with no tag in the prompt, an answer
    thinks only if it starts with <think>: its first token is <think> or the constraint's, and
    an answer that does not think is constrained whole.)"""
    fields = next(v[1] for v in VARIANTS if v[0] == variant)
    body = _request(fields, max_tokens=40, n=4)
    free = _create(servers[parser], body)
    bound = _create(servers[parser], body | constraint)
    answered = unmasked = 0
    for got, plain in zip(bound.choices, free.choices, strict=True):
        thought, content = got.message.reasoning_content, got.message.content
        if plain.message.reasoning_content is not None:  # it thought: the same thinking
            assert thought == plain.message.reasoning_content
            unmasked += not could_start(thought)
            if plain.message.content is None:  # and it never ended: nothing was masked
                assert (content, got.finish_reason) == (None, plain.finish_reason)
        if content is not None and got.finish_reason == "stop":
            assert valid(content), content
            answered += 1
    assert answered >= 1 and unmasked >= 1  # the seeds cover what the test is about


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_a_prompt_that_ended_the_thinking_is_constrained_from_the_first_token(
    servers: dict[str, Any], parser: str
) -> None:
    """Qwen3's enable_thinking=false closes an empty think block in the prompt: the whole
    answer is content, and the constraint binds it from its first token (a </think>, which the
    logit_bias favours, never comes)."""
    _, constraint, valid, _ = CONSTRAINTS[0]
    body = _request(VARIANTS[2][1], max_tokens=8)
    reply = _create(servers[parser], body | constraint)
    for choice in reply.choices:
        assert choice.message.reasoning_content is None
        assert valid(choice.message.content), choice.message.content
        assert choice.finish_reason == "stop"


def test_max_tokens_spent_thinking_is_length_with_no_content(servers: dict[str, Any]) -> None:
    never_ends = {str(END): -100}
    body = _request(VARIANTS[1][1], max_tokens=6, logit_bias=never_ends)
    for stream in (False, True):
        reply = _collected(servers["qwen3"], body | {"stream": stream}, CONSTRAINTS[2][1])
        for reasoning, content, finish in reply:
            assert (content, finish) == ("", "length")
            assert reasoning


def _collected(server: Any, body: dict[str, Any], constraint: dict[str, Any]) -> list[Any]:
    """Each choice's (reasoning_content, content, finish_reason), streamed or not ("" for
    none), with tool calls as their JSON."""
    reply = _create(server, body | constraint)
    if not body.get("stream"):
        return [
            (
                c.message.reasoning_content or "",
                c.message.content or _calls_json(c.message.tool_calls),
                c.finish_reason,
            )
            for c in reply.choices
        ]
    parts: dict[int, list[Any]] = {}
    for chunk in reply:
        for c in chunk.choices:
            got = parts.setdefault(c.index, ["", "", None])
            got[0] += getattr(c.delta, "reasoning_content", None) or ""
            got[1] += (c.delta.content or "") + _calls_json(c.delta.tool_calls)
            got[2] = c.finish_reason or got[2]
    return [tuple(parts[i]) for i in sorted(parts)]


def _calls_json(calls: Any) -> str:
    """Tool calls (or their streamed deltas) as name and arguments text."""
    return "".join((c.function.name or "") + (c.function.arguments or "") for c in calls or [])


@pytest.mark.parametrize("name", [c[0] for c in CONSTRAINTS])
def test_streamed_and_whole_constrained_answers_agree(servers: dict[str, Any], name: str) -> None:
    constraint = next(c[1] for c in CONSTRAINTS if c[0] == name)
    body = _request(VARIANTS[1][1], max_tokens=40, n=4)
    whole = _collected(servers["qwen3"], body, constraint)
    assert _collected(servers["qwen3"], body | {"stream": True}, constraint) == whole


ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "add"}}]
)
def test_a_required_tool_call_comes_after_the_thinking(
    servers: dict[str, Any], tool_choice: Any
) -> None:
    body = _request(VARIANTS[1][1], max_tokens=48, n=4, tools=[ADD_TOOL], tool_choice=tool_choice)
    reply = _create(servers["qwen3"], body)
    called = 0
    # (a named call finishes as "stop", as OpenAI's does)
    finish = "tool_calls" if tool_choice == "required" else "stop"
    for choice in reply.choices:
        if choice.finish_reason == "length":
            continue
        assert choice.finish_reason == finish, choice.message
        (call,) = choice.message.tool_calls
        assert call.function.name == "add"
        jsonschema.validate(json.loads(call.function.arguments), ADD_TOOL["function"]["parameters"])
        assert choice.message.content is None and choice.message.reasoning_content is not None
        called += 1
    assert called >= 1
    streamed = _collected(servers["qwen3"], body | {"stream": True}, {})
    assert streamed == _collected(servers["qwen3"], body, {})


def test_a_model_without_think_tokens_is_a_startup_error(
    default_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found from the tokenizer alone, before any weights load."""
    import sv_engine.loading
    from sv_server.cli import serve_main

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(sv_engine.loading, "load_runner", refuse)
    argv = ["--model", str(default_model), "--reasoning-parser", "qwen3", "--port", "0"]
    status = serve_main(argv)
    assert status == 2
    err = capsys.readouterr().err
    assert "--reasoning-parser qwen3" in err and "'<think>'" in err, err


# --- the thinking in the history: a reply sent back whole ------------------------------------

THOUGHT = {"role": "assistant", "content": "4", "reasoning_content": "2+2 is 4."}


def test_a_reply_sent_back_whole_continues_the_conversation(servers: dict[str, Any]) -> None:
    """The openai client's multi-turn idiom: the reply message itself goes into the history,
    with the reasoning_content this server gave it (content null when it only thought)."""
    body = _request(VARIANTS[3][1], n=1)  # strong-think: the answer thinks
    reply = _create(servers["qwen3"], body).choices[0].message
    assert reply.reasoning_content is not None
    history = [*QUESTION, reply.model_dump(), {"role": "user", "content": "And 3+3?"}]
    again = _create(servers["qwen3"], body | {"messages": history})
    assert again.choices[0].finish_reason is not None


@pytest.mark.parametrize(
    ("messages", "options"),
    [
        ([*QUESTION, THOUGHT], {"add_generation_prompt": False}),  # the last turn keeps it
        ([*QUESTION, THOUGHT, *QUESTION], {"add_generation_prompt": True}),  # dropped
        ([*QUESTION, THOUGHT | {"content": None}], {"add_generation_prompt": False}),
    ],
)
def test_the_thinking_in_the_history_renders_as_transformers_does(
    servers: dict[str, Any],
    tiny_qwen3_dir: Path,
    messages: list[dict[str, Any]],
    options: dict[str, Any],
) -> None:
    """Qwen3's template reads an assistant message's reasoning_content."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    # transformers' template wants a string content; OpenAI's null content is "" here
    as_text = [m | {"content": m["content"] or ""} for m in messages]
    text = hf.apply_chat_template(as_text, tokenize=False, **options)
    expected = list(hf.encode(text, add_special_tokens=False))
    body = {"messages": messages, **options}
    tokenized = httpx.post(f"{servers['qwen3'].url}/tokenize", json=body, timeout=60)
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json()["tokens"] == expected


@pytest.mark.parametrize(
    "names",
    [("reasoning",), ("reasoning", "reasoning_content")],
    ids=["newer-name", "both-names"],
)
def test_the_thinking_under_vllms_newer_name_renders_the_same(
    servers: dict[str, Any], tiny_qwen3_dir: Path, names: tuple[str, ...]
) -> None:
    """vLLM reads an assistant message's thinking from the history as `reasoning` and gives
    it to the template as `reasoning_content` too (Qwen3's reads that one): the ids are
    transformers' with `reasoning_content`, the chat prompt's count with them."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)

    def ids(**options: bool) -> list[int]:
        text = hf.apply_chat_template([*QUESTION, THOUGHT], tokenize=False, **options)
        return list(hf.encode(text, add_special_tokens=False))

    expected = ids()
    thought = {"role": "assistant", "content": "4"}
    thought |= dict.fromkeys(names, THOUGHT["reasoning_content"])
    body = {"messages": [*QUESTION, thought], "add_generation_prompt": False}
    tokenized = httpx.post(f"{servers['qwen3'].url}/tokenize", json=body, timeout=60)
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json()["tokens"] == expected
    body = {"messages": body["messages"], "continue_final_message": True, "max_tokens": 1}
    reply = httpx.post(f"{servers['qwen3'].url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    continued = ids(continue_final_message=True)
    assert reply.json()["usage"]["prompt_tokens"] == len(continued) < len(expected)


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (THOUGHT | {"role": "user"}, "on an 'assistant' message"),
        (THOUGHT | {"reasoning_content": 4}, "must be a string"),
        (THOUGHT | {"reasoning": 4}, "reasoning must be a string"),
        (
            {"role": "user", "content": "x", "reasoning": "y"},
            "reasoning must be a string, on an 'assistant' message",
        ),
        (THOUGHT | {"reasoning": "2+2 is four."}, "reasoning_content differ"),
    ],
)
def test_a_bad_thinking_in_the_history_is_a_400(
    servers: dict[str, Any], message: dict[str, Any], says: str
) -> None:
    body = {"messages": [*QUESTION, message], "max_tokens": 1}
    reply = httpx.post(f"{servers['qwen3'].url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] in ("messages", "messages[1]") and says in error["message"], error


@pytest.mark.parametrize("name", ["reasoning_content", "reasoning"])
def test_a_thinking_that_spells_a_special_token_stays_text(
    servers: dict[str, Any], tiny_qwen3_dir: Path, name: str
) -> None:
    """A thinking in the history that spells a special token (it was a 400) is rendered as
    transformers renders it, under either name, that text plain: no control token from it."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    thinking = "x<|im_end|>y"
    thought = {"role": "assistant", "content": "4", name: thinking}
    expected = hf.apply_chat_template(
        [*QUESTION, THOUGHT | {"reasoning_content": thinking}], tokenize=False
    )
    assert expected.count("<|im_end|>") == 3
    body = {"messages": [*QUESTION, thought], "add_generation_prompt": False}
    tokenized = httpx.post(f"{servers['qwen3'].url}/tokenize", json=body, timeout=60)
    assert tokenized.status_code == 200, tokenized.text
    tokens = tokenized.json()["tokens"]
    assert hf.decode(tokens) == expected
    assert tokens.count(hf.convert_tokens_to_ids("<|im_end|>")) == 2


def test_an_empty_thinking_is_null_whole_and_streamed(servers: dict[str, Any]) -> None:
    """A prefilled `<think>` closed at once, then the answer: no thinking text, so no field,
    either way (a stream sends no delta for it)."""
    ends_at_once = {str(END): 100}  # the grammar starts after </think>
    body = VARIANTS[1][1] | {"max_tokens": 8, "logit_bias": ends_at_once}
    body |= {"guided_choice": ["yes", "no"], "temperature": 0}  # the same choice both ways
    whole = _create(servers["qwen3"], body)
    (choice,) = whole.choices
    assert choice.message.reasoning_content is None and choice.message.content in ("yes", "no")
    assert whole.usage.completion_tokens_details.reasoning_tokens == 0
    chunks = list(_create(servers["qwen3"], body | {"stream": True}))
    assert not any(getattr(c.delta, "reasoning_content", None) for k in chunks for c in k.choices)
    streamed = "".join(c.delta.content or "" for k in chunks for c in k.choices)
    assert streamed == choice.message.content


# --- only the answer's own turn decides: think tags of earlier turns say nothing of it ---------

CALLED = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
EARLIER_TAGS = {
    # a tool's result after a call the model made while thinking: Qwen3's template keeps that
    # turn's thinking, <think>...</think>, before the new answer's turn
    "after-a-tool": {
        "messages": [
            *QUESTION,
            {"role": "assistant", "content": None, "reasoning_content": "Add.", "tool_calls": [CALLED]},
            {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        ],
        "tools": [ADD_TOOL],
    },
    "quoted": {"messages": [{"role": "user", "content": "What does </think> mean?"}]},
}  # fmt: skip


@pytest.mark.parametrize("name", list(EARLIER_TAGS))
def test_think_tags_of_earlier_turns_do_not_end_the_answers_thinking(
    servers: dict[str, Any], name: str
) -> None:
    """The answer may still think before a constrained answer, as with no earlier tags."""
    fields = EARLIER_TAGS[name]
    history = {"messages": fields["messages"], "tools": fields.get("tools")}
    tokenized = httpx.post(f"{servers['qwen3'].url}/tokenize", json=history, timeout=60)
    assert END in tokenized.json()["tokens"]  # the prompt has a </think>, not of this answer
    body = _request(fields, max_tokens=40, n=4, logit_bias={str(THINK): 11, str(END): 9})
    reply = _create(servers["qwen3"], body | {"guided_regex": "[a-c]{2,5}"})
    thought = 0
    for choice in reply.choices:
        if choice.message.reasoning_content is not None:
            thought += 1
        if choice.finish_reason == "stop":
            assert re.fullmatch("[a-c]{2,5}", choice.message.content), choice.message
    assert thought >= 1
