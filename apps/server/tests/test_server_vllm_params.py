"""vLLM's extra request fields that OpenAI-compatible clients send: `stream_options.
continuous_usage_stats`, checked against the server's own token accounting (one logprobs entry
per generated token) and its final usage chunk; `truncate_prompt_tokens`, against the HF
tokenizer's ids cut by hand and sent as a token-id prompt; `allowed_token_ids`, against the
set (the engine's tests hold the mask to the logits)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tokenizers
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionChunk
from server_test_support import RunningServer

LONG_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away. " * 8


@pytest.fixture(scope="module")
def small(make_server: Any) -> Iterator[RunningServer]:
    """A server whose context (64 tokens) is shorter than LONG_TEXT."""
    server = make_server(max_model_len=64)
    yield server
    server.stop()


def _post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def _hf_ids(default_model: Path, text: str) -> list[int]:
    hf = tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json"))
    return hf.encode(text, add_special_tokens=False).ids


def _stream_chunks(server: RunningServer, path: str, body: dict[str, Any]) -> list[Any]:
    """The JSON chunks of a streamed answer (without `[DONE]`)."""
    with httpx.stream("POST", server.url + path, json=body | {"stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        events = r.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    return [json.loads(e.removeprefix("data: ")) for e in events[:-2]]


def test_continuous_usage_counts_each_chunks_tokens(server: RunningServer) -> None:
    """Every chunk's completion_tokens is the number of tokens streamed so far (each has one
    logprobs entry: ignore_eos leaves no unshown stop token); the last usage is the final."""
    body = {
        "prompt": "The three primary colours are",
        "max_tokens": 12,
        "logprobs": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks = _stream_chunks(server, "/v1/completions", body)
    *text_chunks, final = chunks
    seen = 0
    prompt_tokens = final["usage"]["prompt_tokens"]
    for chunk in text_chunks:
        seen += len(chunk["choices"][0]["logprobs"]["tokens"])
        assert chunk["usage"] == {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": seen,
            "total_tokens": prompt_tokens + seen,
        }
    assert seen == 12 and final["choices"] == []
    assert final["usage"] == text_chunks[-1]["usage"]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def test_continuous_usage_with_several_prompts_and_choices_is_each_choices_own(
    server: RunningServer, default_model: Path
) -> None:
    """vLLM's completion_stream_generator: a chunk's usage is its prompt's tokens and its own
    choice's tokens so far, not the response's; the include_usage chunk sums them all. Token
    counts: the HF tokenizer's for the prompts, one logprobs entry per generated token (no
    stop token with ignore_eos) for the choices; each usage parses as the SDK's CompletionUsage."""
    prompts = ["The three primary colours are", "Once upon a time, in a land far, far away,"]
    lengths = [len(_hf_ids(default_model, p)) for p in prompts]
    assert lengths[0] != lengths[1]
    body = {
        "prompt": prompts,
        "n": 2,
        "max_tokens": 6,
        "logprobs": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    *chunks, final = _stream_chunks(server, "/v1/completions", body)
    seen = [0] * 4  # choice index = prompt * n + choice, as OpenAI numbers them
    for chunk in chunks:
        CompletionUsage.model_validate(chunk["usage"])  # (a chunk's finish_reason: null)
        (choice,) = chunk["choices"]
        index = choice["index"]
        seen[index] += len(choice["logprobs"]["tokens"])
        assert chunk["usage"] == _usage(lengths[index // 2], seen[index]), chunk
    assert seen == [6, 6, 6, 6]
    assert final["choices"] == [] and final["usage"] == _usage(sum(lengths), 24)  # each prompt once


def test_continuous_usage_in_chat_is_each_choices_own(
    server: RunningServer, default_model: Path
) -> None:
    """vLLM's chat_completion_stream_generator: each choice's role chunk has its usage at zero
    completion tokens, and every later chunk the tokens of its own choice so far (not the sum
    over the choices); the prompt's count is transformers' apply_chat_template's."""
    import transformers

    messages = [{"role": "user", "content": "Count to five."}]
    hf_chat = transformers.AutoTokenizer.from_pretrained(default_model)
    text = hf_chat.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_tokens = len(hf_chat.encode(text, add_special_tokens=False))
    body = {
        "messages": messages,
        "max_tokens": 10,
        "n": 3,
        "logprobs": True,
        "ignore_eos": True,
        "stream_options": {"continuous_usage_stats": True},
    }
    chunks = _stream_chunks(server, "/v1/chat/completions", body)
    seen = [0, 0, 0]
    for number, chunk in enumerate(chunks):
        ChatCompletionChunk.model_validate(chunk)
        (choice,) = chunk["choices"]
        index = choice["index"]
        if number < 3:  # the role chunks, one per choice, first
            assert choice["delta"]["role"] == "assistant" and index == number
        if choice["logprobs"] is not None:
            seen[index] += len(choice["logprobs"]["content"])
        assert chunk["usage"] == _usage(prompt_tokens, seen[index]), chunk
    assert seen == [10, 10, 10]  # without include_usage: no usage-only chunk


def test_continuous_usage_must_be_a_bool(server: RunningServer) -> None:
    body = {"prompt": "hi", "stream": True, "stream_options": {"continuous_usage_stats": "yes"}}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert "continuous_usage_stats" in response.json()["error"]["message"]


# --- truncate_prompt_tokens -------------------------------------------------------------------


def test_truncated_text_prompt_is_its_last_tokens(
    server: RunningServer, default_model: Path
) -> None:
    text = "Once upon a time, in a land far away, there lived a king who loved"
    ids = _hf_ids(default_model, text)
    greedy = {"max_tokens": 8, "temperature": 0}
    whole = _post(server, "/v1/completions", {"prompt": text} | greedy).json()
    assert whole["usage"]["prompt_tokens"] == len(ids)  # this model's prompts have no BOS
    cut = _post(server, "/v1/completions", {"prompt": text, "truncate_prompt_tokens": 5} | greedy)
    by_ids = _post(server, "/v1/completions", {"prompt": ids[-5:]} | greedy).json()
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == 5
    assert cut.json()["choices"][0]["text"] == by_ids["choices"][0]["text"]
    assert by_ids["choices"][0]["text"] != whole["choices"][0]["text"]
    for keep in (-1, len(ids), 100):  # nothing to cut
        body = {"prompt": text, "truncate_prompt_tokens": keep} | greedy
        assert _post(server, "/v1/completions", body).json()["choices"] == whole["choices"]


def test_truncated_chat_prompt_is_the_last_tokens_of_the_rendered_conversation(
    server: RunningServer,
) -> None:
    messages = [{"role": "user", "content": "Name three rivers of Europe, please."}]
    rendered = _post(server, "/tokenize", {"messages": messages}).json()["tokens"]
    greedy = {"max_tokens": 8, "temperature": 0}
    body = {"messages": messages, "truncate_prompt_tokens": 7} | greedy
    chat = _post(server, "/v1/chat/completions", body).json()
    by_ids = _post(server, "/v1/completions", {"prompt": rendered[-7:]} | greedy).json()
    assert chat["usage"]["prompt_tokens"] == 7 < len(rendered)
    assert chat["choices"][0]["message"]["content"] == by_ids["choices"][0]["text"]


def test_truncation_lets_a_text_longer_than_the_context_in(
    small: RunningServer, default_model: Path
) -> None:
    ids = _hf_ids(default_model, LONG_TEXT)
    assert len(ids) > 64
    greedy = {"max_tokens": 4, "temperature": 0, "echo": True}
    refused = _post(small, "/v1/completions", {"prompt": LONG_TEXT} | greedy)
    assert refused.status_code == 400
    body = {"prompt": LONG_TEXT, "truncate_prompt_tokens": 32} | greedy
    cut = _post(small, "/v1/completions", body).json()
    by_ids = _post(small, "/v1/completions", {"prompt": ids[-32:]} | greedy).json()
    assert cut["usage"]["prompt_tokens"] == 32
    assert cut["choices"][0]["text"] == by_ids["choices"][0]["text"]  # echo: the kept tokens


@pytest.mark.parametrize("value", [0, -2, 65, 10**6, "5", 2.0, True])
def test_bad_truncate_prompt_tokens_get_400_naming_it(small: RunningServer, value: Any) -> None:
    for path, body in [
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ]:
        response = _post(small, path, body | {"truncate_prompt_tokens": value})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "truncate_prompt_tokens"


# --- allowed_token_ids ------------------------------------------------------------------------

ALLOWED = [11, 400, 1234, 5000, 30000]


def _allowed_texts(default_model: Path) -> dict[str, int]:
    """Each allowed token's text (the HF tokenizer's decode), as completions' logprobs show
    it; the texts are distinct, so a shown token names its id."""
    hf = tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json"))
    texts = {hf.decode([t]): t for t in ALLOWED}
    assert len(texts) == len(ALLOWED)
    return texts


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}])
def test_every_generated_token_is_allowed(
    server: RunningServer, default_model: Path, sampling: dict[str, Any]
) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 10, "logprobs": 0, "n": 2}
    answer = _post(server, "/v1/completions", body | sampling | {"allowed_token_ids": ALLOWED})
    assert answer.status_code == 200, answer.text
    texts = _allowed_texts(default_model)
    for choice in answer.json()["choices"]:
        tokens = choice["logprobs"]["tokens"]
        assert len(tokens) == 10 and set(tokens) <= set(texts)  # no stop token is allowed
        assert choice["text"] == "".join(tokens)


def test_one_allowed_token_is_all_a_chat_says(server: RunningServer, default_model: Path) -> None:
    body = {
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 5,
        "temperature": 1.0,
        "allowed_token_ids": [1234],
    }
    answer = _post(server, "/v1/chat/completions", body).json()
    hf = tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json"))
    assert answer["choices"][0]["message"]["content"] == hf.decode([1234] * 5)
    assert answer["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("value", [[], [-1], ["5"], [True], 5, {"5": 1}, [49152], [10**9]])
def test_bad_allowed_token_ids_get_400_naming_it(server: RunningServer, value: Any) -> None:
    response = _post(server, "/v1/completions", {"prompt": "hi", "allowed_token_ids": value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "allowed_token_ids"


def test_allowed_token_ids_none_of_which_can_begin_the_json_get_400_naming_it(
    server: RunningServer, default_model: Path
) -> None:
    """A JSON object starts with "{" (or whitespace): digits alone leave nothing that both
    the constraint and allowed_token_ids allow, so nothing could be generated."""
    hf = tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json"))
    digits = [hf.token_to_id(str(d)) for d in range(10)]
    body = {
        "messages": [{"role": "user", "content": "Give me JSON."}],
        "max_tokens": 8,
        "response_format": {"type": "json_object"},
        "allowed_token_ids": digits,
    }
    response = _post(server, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "allowed_token_ids" and "allows first" in error["message"]
