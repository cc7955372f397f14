"""`n` choices per prompt through the official `openai` client: OpenAI's numbering (prompt * n
+ choice), the prompt counted once in the usage, seeded choices as the engine draws them."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import tokenizers
from server_test_support import RunningServer, openai_error
from sv_engine import SamplingParams
from sv_tokenizer import Message


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_completion_choices_are_the_engines_seeded_draws(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any, default_model: Path
) -> None:
    texts = ["Once upon a time", "The best way to cook rice is"]
    hf = tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json"))
    ids = [hf.encode(text).ids for text in texts]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5, n=3)
    expected = oracle_engine.generate(ids, params)  # prompt-major, as the server numbers them
    reply = client.completions.create(
        model=server.model_name, prompt=texts, max_tokens=6, temperature=1.0, seed=5, n=3
    )
    assert [c.index for c in reply.choices] == list(range(6))
    assert [c.text for c in reply.choices] == [c.text for c in expected]
    assert len({c.text for c in reply.choices[:3]}) > 1  # the choices are different draws
    assert reply.usage.prompt_tokens == sum(map(len, ids))  # once per prompt
    assert reply.usage.completion_tokens == sum(len(c.output_ids) for c in expected)
    m = server.wait_idle()
    assert m["sv_kv_cache_pages_free"] == m["sv_kv_cache_pages_capacity"]


def test_streamed_chat_choices_each_get_a_role_and_one_finish(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any
) -> None:
    question = "Name a colour."
    expected = oracle_engine.generate(
        [[Message("user", question)]],
        SamplingParams(max_new_tokens=8, temperature=0.8, seed=9, n=2),
    )
    stream = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": question}],
        max_tokens=8,
        temperature=0.8,
        seed=9,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    roles: dict[int, list[str]] = defaultdict(list)
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role is not None:
                roles[choice.index].append(choice.delta.role)
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finishes[choice.index].append(choice.finish_reason)
    assert dict(roles) == {0: ["assistant"], 1: ["assistant"]}
    assert [texts[0], texts[1]] == [c.text for c in expected]
    assert [finishes[0], finishes[1]] == [[c.finish_reason] for c in expected]
    assert usage is not None and usage.prompt_tokens == len(expected[0].prompt_ids)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"n": 0}, "'n' must be between 1 and 128, got 0"),
        ({"n": 129}, "'n' must be between 1 and 128, got 129"),
        ({"n": 2.5}, "'n' must be an integer"),
        ({"n": 2, "prompt": ["a"] * 200}, "200 prompts x n=2 choices is 400 generations"),
    ],
)
def test_bad_n_is_refused_naming_it(
    server: RunningServer, body: dict[str, Any], message: str
) -> None:
    reply = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": server.model_name, "prompt": "hi", "max_tokens": 1, **body},
    )
    error = openai_error(reply, 400)
    assert error["param"] == "n" and message in error["message"]
