"""A list of prompts in one /v1/completions request: one choice per prompt, through the official
`openai` client, checked against an in-process engine run on each prompt alone."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import tokenizers
from server_test_support import RunningServer, openai_error
from sv_engine import SamplingParams

TEXTS = ["The capital of France is", "One, two, three,", "Water boils at"]


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def expected(default_model: Path, oracle_engine: Any) -> tuple[list[Any], list[list[int]]]:
    """Each prompt (the middle one as token ids) run alone: its completion and its ids."""
    hf = tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json"))
    ids = [hf.encode(text).ids for text in TEXTS]
    done = [oracle_engine.generate([i], SamplingParams(max_new_tokens=8))[0] for i in ids]
    return done, ids


def _prompts(ids: list[list[int]]) -> list[Any]:
    return [TEXTS[0], ids[1], TEXTS[2]]


def test_one_choice_per_prompt(
    client: openai.OpenAI, server: RunningServer, expected: tuple[list[Any], list[list[int]]]
) -> None:
    done, ids = expected
    reply = client.completions.create(
        model=server.model_name, prompt=_prompts(ids), max_tokens=8, temperature=0
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.text for c in reply.choices] == [c.text for c in done]
    assert [c.finish_reason for c in reply.choices] == [c.finish_reason for c in done]
    assert reply.usage.prompt_tokens == sum(map(len, ids))
    assert reply.usage.completion_tokens == sum(len(c.output_ids) for c in done)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    m = server.wait_idle()
    assert m["sv_kv_cache_pages_free"] == m["sv_kv_cache_pages_capacity"]


def test_streamed_choices_interleave_and_end_once(
    client: openai.OpenAI, server: RunningServer, expected: tuple[list[Any], list[list[int]]]
) -> None:
    done, ids = expected
    chunks = list(
        client.completions.create(
            model=server.model_name,
            prompt=_prompts(ids),
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts: dict[int, str] = defaultdict(str)
    finals: dict[int, list[str]] = defaultdict(list)
    ended: set[int] = set()
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        assert choice.index not in ended, "a chunk after its choice's finish_reason"
        texts[choice.index] += choice.text
        if choice.finish_reason is not None:
            finals[choice.index].append(choice.finish_reason)
            ended.add(choice.index)
    assert [texts[i] for i in range(3)] == [c.text for c in done]
    assert [finals[i] for i in range(3)] == [[c.finish_reason] for c in done]
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.prompt_tokens == sum(map(len, ids))
    assert usage.completion_tokens == sum(len(c.output_ids) for c in done)


def test_one_refused_prompt_ends_them_all(make_server: Any) -> None:
    """A pool of 11 pages: the second prompt could never fit, so the request is a 400 naming
    it (the field and the prompt), and the first prompt does not run either."""
    small = make_server(kv_cache_mib=8)
    try:
        body = {"prompt": [[1000] * 8, [1000] * 400], "max_tokens": 50, "ignore_eos": True}
        for stream in (False, True):
            response = httpx.post(
                f"{small.url}/v1/completions", json=body | {"stream": stream}, timeout=60
            )
            error = openai_error(response, 400)
            assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
            assert error["message"].startswith("prompt[1] has 400 tokens but the KV cache holds")
        m = small.wait_idle()
        assert m["sv_kv_cache_pages_free"] == m["sv_kv_cache_pages_capacity"]
        assert m["sv_generation_tokens_total"] < 2 * 50
    finally:
        small.stop()


def test_a_hang_up_cancels_every_prompt(server: RunningServer) -> None:
    before = server.wait_idle()
    body = {
        "prompt": ["Count: 1, 2, 3,", "Letters: a, b, c,"],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        seen: set[int] = set()
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen.add(json.loads(line.removeprefix("data: "))["choices"][0]["index"])
            if seen == {0, 1}:
                break  # leaving the block closes the connection mid-stream
    after = server.wait_idle(timeout=10)
    assert after["sv_kv_cache_pages_free"] == after["sv_kv_cache_pages_capacity"]
    cancelled = 'sv_requests_finished_total{finish_reason="cancelled"}'
    assert after[cancelled] == before[cancelled] + 2


# --- vLLM's stop_token_ids and include_stop_str_in_output ------------------------------------


def test_stop_token_ids_and_include_stop_str(
    client: openai.OpenAI, server: RunningServer, default_model: Path, oracle_engine: Any
) -> None:
    """Against the engine's own greedy run without them: stop_token_ids end the answer at that
    token's first occurrence (ignore_eos notwithstanding, as vLLM), without its text;
    include_stop_str_in_output keeps a stop string at the end of the text."""
    hf = tokenizers.Tokenizer.from_file(str(default_model / "tokenizer.json"))
    ids = hf.encode(TEXTS[1]).ids
    full = oracle_engine.generate([ids], SamplingParams(max_new_tokens=16, ignore_eos=True))[0]
    stop = full.output_ids[6]
    first = full.output_ids.index(stop)

    def greedy(**extra: Any) -> Any:
        return client.completions.create(
            model=server.model_name,
            prompt=ids,
            max_tokens=16,
            temperature=0,
            extra_body={"ignore_eos": True} | extra,
        )

    reply = greedy(stop_token_ids=[stop])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == first + 1
    assert reply.choices[0].text == hf.decode(full.output_ids[:first])
    stop_text = full.text[5:8]
    cut = full.text.find(stop_text)
    kept = greedy(stop=[stop_text], include_stop_str_in_output=True).choices[0]
    assert kept.text == full.text[: cut + len(stop_text)] and kept.finish_reason == "stop"
    streamed = list(
        client.completions.create(
            model=server.model_name,
            prompt=ids,
            max_tokens=16,
            temperature=0,
            stream=True,
            stop=[stop_text],
            extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
        )
    )
    assert "".join(c.choices[0].text for c in streamed) == kept.text
    for bad in ({"stop_token_ids": [-1]}, {"stop_token_ids": "x"}, {"stop_token_ids": [10**6]}):
        with pytest.raises(openai.BadRequestError) as refused:
            greedy(**bad)
        assert refused.value.param == "stop_token_ids"
    with pytest.raises(openai.BadRequestError) as both:
        greedy(stop_token_ids=[stop], include_stop_str_in_output=True)
    assert both.value.param == "include_stop_str_in_output"
