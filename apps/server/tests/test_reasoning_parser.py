"""The reasoning split (`--reasoning-parser`) over crafted answers: hand-written expected splits
of whole answers, and every chunking of a streamed answer giving the same fields."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sv_server.reasoning import (
    ReasoningParser,
    ReasoningStream,
    ReasoningTokens,
    split_reasoning,
)
from sv_server.tools import ToolCallStream, ToolRequest, apply_to_response

# (answer text, whether the prompt left <think> open) -> (reasoning_content, content)
CASES: list[tuple[str, bool, tuple[str | None, str | None]]] = [
    # Qwen3 thinking: the tags dropped, "\n\n" after </think> kept (as vLLM keeps it)
    ("<think>\nLet me add.\n</think>\n\n4", False, ("\nLet me add.\n", "\n\n4")),
    ("<think>\nLet me add.\n</think>\n\n4", True, ("\nLet me add.\n", "\n\n4")),
    # the prompt opened the thinking (Qwen3-2507, DeepSeek-R1 templates, a prefill)
    ("Let me add.\n</think>\n\n4", True, ("Let me add.\n", "\n\n4")),
    # enable_thinking=false (the prompt closed an empty block), or no thinking at all
    ("4", False, (None, "4")),
    ("The tag </think> here is text", False, (None, "The tag </think> here is text")),
    (" <think>x</think>y", False, (None, " <think>x</think>y")),  # only at the very start
    ("", False, (None, "")),
    # an empty think block (Qwen3's /no_think), and nothing after the thinking
    ("<think>\n\n</think>\n\n4", False, ("\n\n", "\n\n4")),
    ("<think></think>", False, (None, None)),  # an empty thinking is none, as streamed
    ("<think></think>4", False, (None, "4")),
    ("<think>a</think>", True, ("a", None)),
    # max_tokens mid-thought: all thinking, no content
    ("<think>\nStill thinking", False, ("\nStill thinking", None)),
    ("Still thinking </thi", True, ("Still thinking </thi", None)),
    ("", True, (None, None)),
    # a prefix of <think> that never became one
    ("<thi", False, (None, "<thi")),
    ("<thi", True, ("<thi", None)),
    ("<think", False, (None, "<think")),
    # only the first </think> ends the thinking; later tags are content
    ("<think>a</think>b</think>c<think>d", False, ("a", "b</think>c<think>d")),
    ("<think><think>a</think>b", False, ("<think>a", "b")),
    ("a</think></think>", True, ("a", "</think>")),
]


@pytest.mark.parametrize(("text", "opened", "expected"), CASES)
def test_whole_answers_split_as_written(
    text: str, opened: bool, expected: tuple[str | None, str | None]
) -> None:
    assert split_reasoning(text, opened) == expected


def _streamed(pieces: list[str], opened: bool) -> tuple[list[str], list[str]]:
    stream = ReasoningStream(opened)
    reasoning, content = [], []
    for piece in pieces:
        r, c = stream.push(piece)
        reasoning.append(r)
        content.append(c)
    r, c = stream.finish()
    return [*reasoning, r], [*content, c]


def _every_split(text: str) -> list[list[str]]:
    """Each way to cut `text` into two or three pieces (every split point, and pairs)."""
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    cuts += [
        [text[:i], text[i:j], text[j:]]
        for i in range(len(text) + 1)
        for j in range(i, len(text) + 1)
    ]
    return cuts


@pytest.mark.parametrize(("text", "opened", "expected"), CASES)
def test_every_split_point_streams_the_same_fields(
    text: str, opened: bool, expected: tuple[str | None, str | None]
) -> None:
    for pieces in _every_split(text):
        reasoning, content = _streamed(pieces, opened)
        assert ("".join(reasoning), "".join(content)) == (
            expected[0] or "",
            expected[1] or "",
        ), pieces
        assert all("</think>" not in r for r in reasoning), pieces


TAGGY = st.text(alphabet=st.sampled_from(["<", "/", "t", "h", "i", "n", "k", ">", "a", "\n"]))
PIECES = st.lists(st.one_of(TAGGY, st.sampled_from(["<think>", "</think>", "</", "<th", "k>"])))


@given(PIECES, st.booleans())
def test_any_chunking_concatenates_to_the_whole_answers_fields(
    pieces: list[str], opened: bool
) -> None:
    text = "".join(pieces)
    expected_reasoning, expected_content = split_reasoning(text, opened)
    reasoning, content = _streamed(pieces, opened)
    assert "".join(reasoning) == (expected_reasoning or "")
    assert "".join(content) == (expected_content or "")
    # the thinking never shows its closing tag, whole or in part at its end
    joined = "".join(reasoning)
    assert "</think>" not in joined


def test_the_prompt_decides_whether_the_answer_opens_in_thinking() -> None:
    qwen3, r1 = ReasoningParser("qwen3", 10, 11), ReasoningParser("deepseek_r1", 10, 11)
    assert not qwen3.opens_in_thinking([1, 2, 3])  # Qwen3 hybrid: the model writes <think>
    assert qwen3.opens_in_thinking([1, 10, 5])  # Qwen3-2507: the prompt ends with <think>\n
    assert not qwen3.opens_in_thinking([1, 10, 5, 11, 5])  # enable_thinking=false
    assert qwen3.opens_in_thinking([10, 11, 3, 10])  # an earlier turn's block, then a new one
    assert r1.opens_in_thinking([1, 2, 3])  # vLLM's R1 rule: thinking comes first
    assert r1.opens_in_thinking([1, 10, 5])
    # ... unless the prompt ended it (vLLM's is_reasoning_end over the prompt, either parser)
    assert not r1.opens_in_thinking([1, 10, 5, 11, 5])
    for parser in (qwen3, r1):
        assert parser.ended_in_prompt([1, 10, 5, 11, 5])
        assert not parser.ended_in_prompt([10, 11, 3, 10])
        assert not parser.ended_in_prompt([1, 2, 3])


def test_an_output_constraint_waits_for_the_thinking_as_the_split_reads_it() -> None:
    """(grammar_after_token, grammar_wait_opener): the constraint binds the content alone."""
    qwen3, r1 = ReasoningParser("qwen3", 10, 11), ReasoningParser("deepseek_r1", 10, 11)
    for parser in (qwen3, r1):
        assert parser.grammar_wait([1, 10, 5, 11, 5]) == (None, None)  # ended: at once
        assert parser.grammar_wait([1, 10, 5]) == (11, None)  # thinking from the start
    assert r1.grammar_wait([1, 2, 3]) == (11, None)
    assert qwen3.grammar_wait([1, 2, 3]) == (11, 10)  # thinks only if it opens with <think>


# (the texts of an answer's tokens; whether it opens in thinking) -> reasoning_tokens: neither
# tag counted, whether one token or spelled in ordinary ones, nothing after the first </think>
COUNTS: list[tuple[list[str], bool, int]] = [
    (["<think>", "a", "b", "c", "</think>", "d", "e"], False, 3),
    (["<think>", "a", "b", "c", "</think>", "d", "e"], True, 3),  # dropped either way
    (["a", "b", "</think>", "d"], True, 2),  # the prompt opened the thinking
    (["a", "b", "</think>", "d"], False, 0),  # no thinking: all content
    (["a", "<think>", "b", "</think>"], False, 0),  # <think> only at the start opens it
    (["<think>", "a", "b"], False, 2),  # max_tokens mid-thought
    (["<think>", "</think>", "d"], False, 0),  # an empty think block
    (["a", "</think>", "b", "<think>", "c", "</think>", "d"], True, 1),  # later tags: content
    ([], True, 0),
    # tags spelled in ordinary tokens, as the split reads them (Qwen3's "</", "think", ">")
    (["a", "b", "</", "think", ">", "c"], True, 2),
    (["<think>", "a", "</", "think", ">", "c"], False, 1),
    (["<", "think", ">", "a", "</think>", "c"], False, 1),
    (["</", "think", ">", "c"], True, 0),
    (["a</", "think>b"], True, 1),  # a token with thinking and a piece of the tag: thinking
    (["</th", "ink>", "a"], True, 0),  # the tag in two pieces, at once
    (["a", "</", "thing"], True, 3),  # not the tag after all
    (["a", "</", "thi"], True, 3),  # cut short: the split's thinking to the end
    (["<thi"], False, 0),  # cut short before <think> was whole: no thinking
    (["a", "", "é", "</think>"], True, 3),  # a piece of a character (no text yet) in it
]


@pytest.mark.parametrize(("texts", "opened", "expected"), COUNTS)
def test_reasoning_tokens_count_the_thinking(texts: list[str], opened: bool, expected: int) -> None:
    final, so_far = _counts(texts, opened)
    assert final == expected
    assert so_far == sorted(so_far) and so_far[-1:] <= [expected]  # never taken back


def _counts(texts: list[str], opened: bool) -> tuple[int, list[int]]:
    """ReasoningTokens' count once the answer of these token texts has ended, and its count
    after each push."""
    count = ReasoningTokens(opened)
    so_far = []
    for text in texts:
        count.push(text)
        so_far.append(count.count)
    count.finish()
    return count.count, so_far


# token texts, some of them pieces of a tag (Qwen3's vocabulary spells one so)
TOKEN_TEXTS = [
    "<think>",
    "</think>",
    "<",
    "</",
    "think",
    ">",
    "</th",
    "ink>",
    "<thi",
    "nk>",
    "a",
    "é",
]


@settings(max_examples=400)
@given(texts=st.lists(st.sampled_from(TOKEN_TEXTS), max_size=14), opened=st.booleans())
def test_reasoning_tokens_are_those_of_the_splits_thinking(texts: list[str], opened: bool) -> None:
    """The count agrees with split_reasoning's text: the tokens whose text has a part of the
    thinking (where the thinking's text lies in the answer: after a leading <think>)."""
    whole = "".join(texts)
    reasoning, _ = split_reasoning(whole, opened)
    start = len("<think>") if whole.startswith("<think>") else 0
    end = start + len(reasoning or "")
    expected, at = 0, 0
    for text in texts:
        expected += at < end and at + len(text) > start
        at += len(text)
    final, so_far = _counts(texts, opened)
    assert final == expected
    assert so_far == sorted(so_far) and all(n <= expected for n in so_far)


def _reply(reasoning: str | None, content: str | None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


CALL = '{"name": "add", "parameters": {"a": 2}}'
ADD = ToolRequest([{"type": "function", "function": {"name": "add"}}], "auto")


def test_a_tool_call_is_read_from_the_content_only() -> None:
    body = _reply("I will call add.", "\n\n" + CALL)
    apply_to_response(body, ADD)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "I will call add."  # kept
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "add"

    for reasoning, content in ((CALL, "No call."), (CALL, None)):
        body = _reply(reasoning, content)
        apply_to_response(body, ADD)
        assert body == _reply(reasoning, content)  # a call in the thinking is no call


def test_a_streamed_call_after_the_thinking() -> None:
    """What the server does per piece: the split first, only the content to the call parser."""
    split, calls = ReasoningStream(False), ToolCallStream(ADD)
    reasoning, deltas = "", []
    for piece in ["<think>", "x", "</think>", "\n\n", CALL[:5], CALL[5:]]:
        r, c = split.push(piece)
        reasoning += r
        deltas += calls.push(c) if c else []
    r, c = split.finish()
    deltas += (calls.push(c) if c else []) + calls.finish()
    assert reasoning + r == "x" and calls.called
    assert [d for d in deltas if "content" in d and d["content"].strip()] == []
