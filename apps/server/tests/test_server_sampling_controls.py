"""Penalties, min_p, logit_bias, min_tokens and skip_special_tokens through the official
`openai` client: the server's answers equal the in-process engine's with the same
SamplingParams (the engine's own tests hold those to the formulas), and bad values get a 400
naming the field."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from server_test_support import RunningServer
from sv_engine import SamplingParams
from sv_tokenizer import Message

QUESTION = "Say 'cat' ten times."


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_controls_equal_the_engines(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any
) -> None:
    """The answer banned its plain first token and penalized: the engine's answer."""
    dialog = [Message("user", QUESTION)]
    plain = oracle_engine.generate([dialog], SamplingParams(max_new_tokens=12))[0]
    first = plain.output_ids[0]
    controls = {"presence_penalty": 1.5, "frequency_penalty": 1.0, "repetition_penalty": 1.3}
    params = SamplingParams(max_new_tokens=12, logit_bias={first: -100.0}, **controls)  # type: ignore[arg-type]
    expected = oracle_engine.generate([dialog], params)[0]
    assert expected.output_ids[0] != first
    reply = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=12,
        temperature=0,
        logit_bias={str(first): -100},
        presence_penalty=1.5,
        frequency_penalty=1.0,
        extra_body={"repetition_penalty": 1.3},
    )
    assert reply.choices[0].message.content == expected.text


def test_min_p_sampled_completion_equals_the_engines(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any
) -> None:
    ids = oracle_engine.tokenizer.encode("Once upon a time")
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, min_p=0.1)
    expected = oracle_engine.generate([ids], params)[0]
    choice = client.completions.create(
        model=server.model_name,
        prompt=ids,
        max_tokens=12,
        temperature=1.0,
        seed=5,
        extra_body={"min_p": 0.1},
    ).choices[0]
    assert choice.text == expected.text


def test_skip_special_tokens(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any
) -> None:
    special = next(iter(oracle_engine.tokenizer.special_tokens.items()))
    args: dict[str, Any] = {
        "model": server.model_name,
        "prompt": "Hi",
        "max_tokens": 2,
        "temperature": 0,
        "logit_bias": {str(special[1]): 100},
        "extra_body": {"ignore_eos": True},
    }
    assert client.completions.create(**args).choices[0].text == ""
    args["extra_body"] |= {"skip_special_tokens": False}
    shown = client.completions.create(**args).choices[0].text
    assert special[0] in shown


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 1e-38}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"logit_bias": [1]}, "logit_bias"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
    ],
)
def test_bad_values_get_400_naming_the_field(
    server: RunningServer, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi"} | body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_min_tokens_holds_back_stop_strings(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any
) -> None:
    """As vLLM: a stop string ends the answer only in the text after the first min_tokens
    tokens (a '.' in the second token ended an answer that had to be 8 tokens long)."""
    tokenizer = oracle_engine.tokenizer
    ids = tokenizer.encode("The capital of France is")
    plain = oracle_engine.generate([ids], SamplingParams(max_new_tokens=24, ignore_eos=True))[0]
    text_of = [tokenizer.decode(plain.output_ids[:k]) for k in range(len(plain.output_ids) + 1)]
    first_dot = next(k for k, text in enumerate(text_of) if "." in text)
    min_tokens = first_dot + 1  # the first '.' is within them
    held = text_of[min_tokens]
    rest = text_of[-1][len(held) :]
    expected = held + rest.split(".")[0]
    choice = client.completions.create(
        model=server.model_name,
        prompt=ids,
        max_tokens=24,
        temperature=0,
        stop=["."],
        extra_body={"min_tokens": min_tokens, "ignore_eos": True},
    ).choices[0]
    assert choice.text == expected
    assert choice.finish_reason == ("stop" if "." in rest else "length")
    assert "." in choice.text  # the '.' of the first min_tokens tokens stayed
