"""vLLM's bad_words through the server: a completion and a chat answer that ban a word of the
plain greedy answer equal the in-process engine's with the same SamplingParams (the engine's
tests hold those to transformers' bad_words_ids), and bad values get a 400 naming the field."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from server_test_support import RunningServer
from sv_engine import SamplingParams
from sv_tokenizer import Message


def _post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def _a_word_of(text: str) -> str:
    """A word inside `text` (not its first: its spaced form is what the text holds)."""
    words = [w for w in text.split()[1:] if w.isalpha()]
    assert words, text
    return words[0]


def test_completion_equals_the_engines(server: RunningServer, oracle_engine: Any) -> None:
    ids = oracle_engine.tokenizer.encode("Once upon a time")
    plain = oracle_engine.generate([ids], SamplingParams(max_new_tokens=12, ignore_eos=True))[0]
    word = _a_word_of(plain.text)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, bad_words=[word, "zebra"])
    expected = oracle_engine.generate([ids], params)[0]
    assert expected.text != plain.text
    body = {
        "prompt": ids,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "bad_words": [word, "zebra"],
    }
    answer = _post(server, "/v1/completions", body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == expected.text


def test_chat_equals_the_engines(server: RunningServer, oracle_engine: Any) -> None:
    dialog = [Message("user", "Name three animals.")]
    plain = oracle_engine.generate([dialog], SamplingParams(max_new_tokens=12))[0]
    word = _a_word_of(plain.text)
    expected = oracle_engine.generate(
        [dialog], SamplingParams(max_new_tokens=12, bad_words=[word])
    )[0]
    assert expected.text != plain.text
    body = {
        "messages": [{"role": "user", "content": "Name three animals."}],
        "max_tokens": 12,
        "temperature": 0,
        "bad_words": [word],
    }
    answer = _post(server, "/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == expected.text


# ["zebra " * 2000]: past what the engine takes in all, which only the engine can count
@pytest.mark.parametrize(
    "value", ["word", [1], ["ok", None], [""], ["  "], {"a": 1}, ["w"] * 129, ["zebra " * 2000]]
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_values_get_400_naming_it(server: RunningServer, path: str, value: Any) -> None:
    body: dict[str, Any] = {"max_tokens": 2, "bad_words": value}
    if path == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    response = _post(server, path, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "bad_words"


def test_null_and_empty_are_no_words(server: RunningServer) -> None:
    for value in (None, []):
        body = {"prompt": "hi", "max_tokens": 2, "bad_words": value}
        assert _post(server, "/v1/completions", body).status_code == 200
