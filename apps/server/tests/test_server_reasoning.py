"""`sv serve --reasoning-parser`: a small random model (seeded) with Qwen3's real tokenizer and
template, served twice, with the flag and without. The same seeded request gives the same
tokens on both; the raw text (no flag), split by hand, must be what the flag gives, whole and
streamed (through the openai client, which shows `reasoning_content` as an extra field).

The random model says nothing sensible, so a `logit_bias` on `<think>` and `</think>` makes
them come up often, at random places: answers with a think block, without, cut mid-thought,
and with tags after the thinking."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_test_support import openai_error

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
        return body, None
    return body[:end], body[end + 8 :] or None


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


def _request(fields: dict[str, Any], **more: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": 20, "n": 3, "seed": 3, "logit_bias": TAGS_OFTEN}
    return body | fields | more


def _create(server: Any, body: dict[str, Any]) -> Any:
    body = dict(body)
    extra = {
        k: body.pop(k) for k in ("continue_final_message", "chat_template_kwargs") if k in body
    }
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
    assert split.usage == raw.usage  # completion_tokens: every token, the thinking's too
    seen = set()
    for got, expected in zip(split.choices, raw.choices, strict=True):
        assert "reasoning_content" not in (expected.message.model_extra or {})  # no flag
        reasoning, content = by_hand(expected.message.content, opened(parser, last_tag))
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


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize(("name", "fields", "last_tag"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_streamed_deltas_concatenate_to_the_whole_answer(
    servers: dict[str, Any], parser: str, name: str, fields: dict[str, Any], last_tag: str | None
) -> None:
    body = _request(fields, logprobs=True)
    whole = _create(servers[parser], body)
    stream = _create(servers[parser], body | {"stream": True})
    reasoning: dict[int, str] = {}
    content: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            piece = getattr(delta, "reasoning_content", None)
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
    texts = [
        httpx.post(f"{servers[k].url}/v1/completions", json=body, timeout=60).json()["choices"]
        for k in ("raw", "qwen3")
    ]
    assert texts[0] == texts[1]
    assert "reasoning_content" not in texts[1][0]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"guided_regex": "[0-9]+"}, "guided_regex"),
        ({"response_format": {"type": "text"}, "guided_choice": ["a", "b"]}, "guided_choice"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "add"}}],
                "tool_choice": "required",
            },
            "tool_choice",
        ),
    ],
)
def test_output_constraints_are_refused_with_the_flag(
    servers: dict[str, Any], fields: dict[str, Any], param: str
) -> None:
    body = {"messages": QUESTION, "max_tokens": 4, **fields}
    error = openai_error(
        httpx.post(f"{servers['qwen3'].url}/v1/chat/completions", json=body, timeout=60), 400
    )
    assert error["param"] == param and param in error["message"], error
    assert "--reasoning-parser qwen3" in error["message"]
    # a plain response_format, which constrains nothing, is no refusal
    plain = body | {"response_format": {"type": "text"}}
    plain = {k: v for k, v in plain.items() if k not in fields or k == "response_format"}
    reply = httpx.post(f"{servers['qwen3'].url}/v1/chat/completions", json=plain, timeout=60)
    assert reply.status_code == 200, reply.text


def test_a_model_without_think_tokens_is_a_startup_error(
    default_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sv_server.cli import serve_main

    status = serve_main(["--model", str(default_model), "--reasoning-parser", "qwen3"])
    assert status == 2
    err = capsys.readouterr().err
    assert "--reasoning-parser qwen3" in err and "'<think>'" in err, err
