"""Log-probabilities and echo through the official `openai` client, on the default model on
the CPU, against transformers' FP32 log_softmax of the same token ids (the oracle)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
import transformers
from server_test_support import RunningServer
from sv_engine import SamplingParams
from sv_tokenizer import Message

TOL = 1e-4
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oracle(default_model: Path) -> transformers.LlamaForCausalLM:
    return transformers.LlamaForCausalLM.from_pretrained(default_model, dtype=torch.float32).eval()


def hf_logprobs(model: transformers.LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: row p is the log-distribution of token p + 1."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def text_of(engine: Any, token_id: int) -> str:
    """A token as OpenAI shows one: a byte of no whole character as \\xNN."""
    return str(engine.tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace"))


def greedy(engine: Any, prompt: Any, n: int) -> Any:
    """The in-process engine's greedy answer: the token ids the server must have scored."""
    return engine.generate([prompt], SamplingParams(max_new_tokens=n))[0]


def test_chat_logprobs_equal_transformers(
    client: openai.OpenAI,
    server: RunningServer,
    oracle_engine: Any,
    oracle: transformers.LlamaForCausalLM,
) -> None:
    expected = greedy(oracle_engine, [Message("user", QUESTION)], 8)
    reply = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    choice = reply.choices[0]
    assert choice.message.content == expected.text
    assert choice.logprobs is not None and choice.logprobs.content is not None
    shown = expected.output_ids[:-1] if expected.finish_reason == "stop" else expected.output_ids
    want = hf_logprobs(oracle, expected.prompt_ids + expected.output_ids)
    assert len(choice.logprobs.content) == len(shown)
    for i, (entry, token_id) in enumerate(zip(choice.logprobs.content, shown, strict=True)):
        row = want[len(expected.prompt_ids) - 1 + i]
        assert entry.token == text_of(oracle_engine, token_id)
        assert entry.bytes == list(oracle_engine.tokenizer.token_bytes(token_id))
        assert entry.logprob == pytest.approx(float(row[token_id]), abs=TOL)
        values, ids = torch.topk(row, 3)
        assert [t.token for t in entry.top_logprobs] == [text_of(oracle_engine, t) for t in ids]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(values.tolist(), abs=TOL)
    assert "".join(e.token for e in choice.logprobs.content) == expected.text

    chunks = list(
        client.chat.completions.create(
            model=server.model_name,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=8,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        )
    )
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    # (Within TOL, not equal: the second request starts on the first's prefix-cache pages.)
    assert [e.token for e in streamed] == [e.token for e in choice.logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx(
        [e.logprob for e in choice.logprobs.content], abs=TOL
    )
    assert [[t.token for t in e.top_logprobs] for e in streamed] == [
        [t.token for t in e.top_logprobs] for e in choice.logprobs.content
    ]


SPLIT = "Привет, как дела? 日本語は"  # characters the tokenizer splits across tokens


@pytest.mark.parametrize(
    ("prompt_ids", "text"),
    [(False, "The capital of France is"), (True, "The capital of France is"), (False, SPLIT)],
    ids=["text", "token-ids", "split-characters"],
)
def test_completion_echo_scores_the_prompt(
    client: openai.OpenAI,
    server: RunningServer,
    oracle_engine: Any,
    oracle: transformers.LlamaForCausalLM,
    prompt_ids: bool,
    text: str,
) -> None:
    """echo + logprobs (what lm-eval's loglikelihood asks): the prompt's tokens first, the
    first unscored, then the output's; as one answer and streamed. Each text offset counts
    the text's characters before the token, a character split across tokens once."""
    ids = oracle_engine.tokenizer.encode(text)
    prompt: Any = ids if prompt_ids else text
    expected = greedy(oracle_engine, ids, 3)
    args: dict[str, Any] = {
        "model": server.model_name,
        "prompt": prompt,
        "max_tokens": 3,
        "temperature": 0,
        "echo": True,
        "logprobs": 2,
    }
    choice = client.completions.create(**args).choices[0]
    assert choice.text == text + expected.text
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    scored = ids + expected.output_ids
    assert lp.tokens == [text_of(oracle_engine, t) for t in scored]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = hf_logprobs(oracle, scored)
    outside_top = 0
    for p in range(1, len(scored)):
        chosen = float(want[p - 1, scored[p]])
        assert lp.token_logprobs[p] == pytest.approx(chosen, abs=TOL)
        values, top = torch.topk(want[p - 1], 2)
        expected_top = {
            text_of(oracle_engine, t): float(v) for t, v in zip(top, values, strict=True)
        }
        if scored[p] not in top.tolist():  # OpenAI: the scored token's entry is always there
            outside_top += 1
            expected_top.setdefault(text_of(oracle_engine, scored[p]), chosen)
        got = lp.top_logprobs[p]
        assert got is not None
        assert list(got) == list(expected_top)
        assert list(got.values()) == pytest.approx(list(expected_top.values()), abs=TOL)
    assert outside_top > 0  # the prompt has tokens the model did not rank in its top 2
    pieces = [oracle_engine.tokenizer.token_bytes(t) for t in scored]
    starts = [sum(map(len, pieces[:i])) for i in range(len(scored))]
    whole = b"".join(pieces)
    assert lp.text_offset == [len(whole[:s].decode("utf-8", errors="ignore")) for s in starts]
    assert lp.text_offset[-1] < len(choice.text)
    if text == SPLIT:  # the case is there: tokens that are parts of a character
        assert sum("\\x" in t for t in lp.tokens) >= 2

    chunks = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for c in chunks:
        for key, values in streamed.items():
            values.extend(getattr(c.choices[0].logprobs, key) or [])
    assert streamed["tokens"] == lp.tokens and streamed["text_offset"] == lp.text_offset
    assert streamed["token_logprobs"][0] is None
    assert streamed["token_logprobs"][1:] == pytest.approx(lp.token_logprobs[1:], abs=TOL)


def _joined(chunks: list[Any]) -> dict[str, Any]:
    """A streamed completion's one choice, put together: text, logprobs, finish, usage."""
    out: dict[str, Any] = {"text": "", "finish_reason": None, "usage": None}
    lists: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for c in chunks:
        if c.usage is not None:
            out["usage"] = c.usage
        for choice in c.choices:
            out["text"] += choice.text
            out["finish_reason"] = choice.finish_reason or out["finish_reason"]
            for key, values in lists.items():
                values.extend(getattr(choice.logprobs, key, None) or [])
    return out | lists


@pytest.mark.parametrize("prompt_ids", [False, True], ids=["text", "token-ids"])
def test_echo_without_generation_scores_the_prompt_alone(
    client: openai.OpenAI,
    server: RunningServer,
    oracle_engine: Any,
    oracle: transformers.LlamaForCausalLM,
    prompt_ids: bool,
) -> None:
    """vLLM's `echo` with `max_tokens: 0` (how evaluation harnesses score a prompt): the
    prompt's text and its tokens' log-probabilities alone, the prompt part of the same request
    with `max_tokens: 1` and transformers' log_softmax (the oracles); no token of its own in
    the text, the logprobs or the usage; finish "length". Streamed the same."""
    text = "The capital of France is"
    ids = oracle_engine.tokenizer.encode(text)
    args: dict[str, Any] = {
        "model": server.model_name,
        "prompt": ids if prompt_ids else text,
        "temperature": 0,
        "echo": True,
        "logprobs": 2,
    }
    before = server.metrics()
    reply = client.completions.create(**args, max_tokens=0)
    generated = (
        server.metrics()["sv_generation_tokens_total"] - before["sv_generation_tokens_total"]
    )
    assert generated == 1  # (the engine's one token, which the answer drops)
    (choice,) = reply.choices
    assert choice.text == text and choice.finish_reason == "length"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), 0)
    one = client.completions.create(**args, max_tokens=1).choices[0]
    lp, full = choice.logprobs, one.logprobs
    assert lp is not None and full is not None and full.token_logprobs is not None
    assert lp.tokens == full.tokens[: len(ids)] and lp.text_offset == full.text_offset[: len(ids)]
    assert lp.token_logprobs is not None and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(full.token_logprobs[1 : len(ids)], abs=TOL)
    assert lp.top_logprobs is not None and full.top_logprobs is not None
    assert [list(t or {}) for t in lp.top_logprobs] == [
        list(t or {}) for t in full.top_logprobs[: len(ids)]
    ]
    want = hf_logprobs(oracle, ids)
    chosen = [float(want[p - 1, ids[p]]) for p in range(1, len(ids))]
    assert lp.token_logprobs[1:] == pytest.approx(chosen, abs=TOL)

    chunks = list(
        client.completions.create(
            **args, max_tokens=0, stream=True, stream_options={"include_usage": True}
        )
    )
    streamed = _joined(chunks)
    assert streamed["text"] == text and streamed["finish_reason"] == "length"
    assert streamed["tokens"] == lp.tokens and streamed["text_offset"] == lp.text_offset
    assert streamed["token_logprobs"][1:] == pytest.approx(lp.token_logprobs[1:], abs=TOL)
    assert streamed["usage"].completion_tokens == 0


def test_echo_without_generation_of_choices_and_prompts(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """Each prompt's choices are its echo, however many: a stop string, which applies to
    generated text, cuts none, even one the prompt holds."""
    prompts = ["Once upon a time", "The sky is blue"]
    reply = client.completions.create(
        model=server.model_name,
        prompt=prompts,
        max_tokens=0,
        echo=True,
        n=2,
        stop=["upon", " is"],
        temperature=1.0,
        seed=4,
    )
    assert [c.text for c in reply.choices] == [p for p in prompts for _ in range(2)]
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" and c.logprobs is None for c in reply.choices)
    assert reply.usage is not None and reply.usage.completion_tokens == 0
    chunks = list(
        client.completions.create(
            model=server.model_name, prompt=prompts, max_tokens=0, echo=True, n=2, stream=True
        )
    )
    texts = ["", "", "", ""]
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.text
    assert texts == [p for p in prompts for _ in range(2)]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),  # not without echo
        ({"max_tokens": 0, "echo": False}, "max_tokens"),
        ({"max_tokens": -1, "echo": True}, "max_tokens"),
        ({"max_tokens": 0, "echo": True, "min_tokens": 1}, "min_tokens"),
    ],
)
def test_max_tokens_zero_needs_echo(
    server: RunningServer, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", **body}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    if "echo" not in body or body["echo"] is False:  # says how 0 is taken
        assert "'echo': true" in error["message"]


def _check_prompt_logprobs(
    got: list[Any], ids: list[int], want: torch.Tensor, k: int, engine: Any
) -> None:
    """vLLM's shape: None first, then per token {id: {logprob, rank, decoded_token}}, the
    prompt token's own entry first and the top k after it (ranks 1..k), against transformers'
    log_softmax `want` (row p - 1 scores token p); a rank within the oracle's tolerance."""
    assert len(got) == len(ids) and got[0] is None
    for p in range(1, len(ids)):
        row, own = want[p - 1], ids[p]
        entries = got[p]
        top = torch.topk(row, k).indices
        order = [own, *(t for t in top.tolist() if t != own)]
        assert list(entries) == [str(t) for t in order]
        for t, entry in entries.items():
            assert set(entry) == {"logprob", "rank", "decoded_token"}
            assert entry["decoded_token"] == text_of(engine, int(t))
            assert entry["logprob"] == pytest.approx(float(row[int(t)]), abs=TOL)
        assert [entries[str(t)]["rank"] for t in top.tolist()] == list(range(1, k + 1))
        rank = entries[str(own)]["rank"]
        assert int((row > row[own] + TOL).sum()) < rank <= int((row >= row[own] - TOL).sum())


def test_prompt_logprobs_of_completions(
    client: openai.OpenAI,
    server: RunningServer,
    oracle_engine: Any,
    oracle: transformers.LlamaForCausalLM,
) -> None:
    """vLLM's `prompt_logprobs`: each choice carries its prompt's, against transformers (the
    oracle) and equal to the prompt part of echo's logprobs; each shows its own K where both
    are asked (the engine scores the more of the two)."""
    prompts = ["The capital of France is", "Once upon a time there"]
    reply = client.completions.create(
        model=server.model_name,
        prompt=prompts,
        max_tokens=2,
        temperature=0,
        n=2,
        echo=True,
        logprobs=1,
        extra_body={"prompt_logprobs": 3},
    ).model_dump()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    seen_outside = False
    for choice in reply["choices"]:
        ids = oracle_engine.tokenizer.encode(prompts[choice["index"] // 2])
        got = choice["prompt_logprobs"]
        _check_prompt_logprobs(got, ids, hf_logprobs(oracle, ids), 3, oracle_engine)
        echoed = choice["logprobs"]
        assert echoed["tokens"][: len(ids)] == [text_of(oracle_engine, t) for t in ids]
        for p in range(1, len(ids)):
            own = got[p][str(ids[p])]
            assert echoed["token_logprobs"][p] == pytest.approx(own["logprob"], abs=TOL)
            assert len(echoed["top_logprobs"][p]) <= 2  # (its own 1, and the token's own)
            seen_outside |= own["rank"] > 3
    assert seen_outside  # some prompt token is past the top 3
    assert reply["usage"]["prompt_tokens"] == sum(
        len(oracle_engine.tokenizer.encode(p)) for p in prompts
    )
    alone = client.completions.create(
        model=server.model_name, prompt=prompts[0], max_tokens=1, extra_body={"prompt_logprobs": 0}
    ).model_dump()["choices"][0]
    ids = oracle_engine.tokenizer.encode(prompts[0])
    assert alone["logprobs"] is None
    _check_prompt_logprobs(
        alone["prompt_logprobs"], ids, hf_logprobs(oracle, ids), 0, oracle_engine
    )
    plain = client.completions.create(model=server.model_name, prompt="Hi", max_tokens=1)
    assert "prompt_logprobs" not in plain.model_dump(exclude_unset=True)["choices"][0]


def test_the_choices_of_a_prompt_score_it_once(
    client: openai.OpenAI, server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server queues each of the n choices as an engine request of its own; they share
    their prompt's scores, so the prompt is scored once, and every choice shows what n = 1
    shows (each prompt token's entry: its logprob, rank and top K)."""
    engine = server.app.state.server.loop.engine
    scored: list[int] = []
    launch = engine.runner.launch

    def counting(step: Any) -> Any:
        scored.append(sum(len(targets) for _, _, targets in step.prompt_logprobs))
        return launch(step)

    args: dict[str, Any] = {
        "model": server.model_name,
        "prompt": "The quick brown fox jumps over the lazy dog, said the typist",
        "max_tokens": 2,
        "extra_body": {"prompt_logprobs": 2},
    }
    one = client.completions.create(**args).model_dump()["choices"][0]["prompt_logprobs"]
    monkeypatch.setattr(engine.runner, "launch", counting)
    reply = client.completions.create(**args, n=3, temperature=1.0, seed=4).model_dump()
    assert sum(scored) == len(one) - 1
    for choice in reply["choices"]:
        got = choice["prompt_logprobs"]
        assert len(got) == len(one) and got[0] is None and one[0] is None
        for mine, want in zip(got[1:], one[1:], strict=True):
            assert list(mine) == list(want)  # the same tokens, in the same order
            for token, entry in mine.items():
                assert entry["rank"] == want[token]["rank"]
                assert entry["decoded_token"] == want[token]["decoded_token"]
                assert entry["logprob"] == pytest.approx(want[token]["logprob"], abs=TOL)


def test_prompt_logprobs_of_a_chat_answer(
    client: openai.OpenAI,
    server: RunningServer,
    oracle_engine: Any,
    oracle: transformers.LlamaForCausalLM,
) -> None:
    """A chat answer carries its prompt's once, beside its choices, as vLLM's: the rendered
    conversation's tokens (those /tokenize gives), against transformers."""
    messages = [{"role": "user", "content": QUESTION}]
    reply = client.chat.completions.create(
        model=server.model_name,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=2,
        temperature=0,
        n=2,
        extra_body={"prompt_logprobs": 2},
    ).model_dump()
    ids = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, timeout=30).json()
    ids = ids["tokens"]
    assert reply["usage"]["prompt_tokens"] == len(ids)
    _check_prompt_logprobs(
        reply["prompt_logprobs"], ids, hf_logprobs(oracle, ids), 2, oracle_engine
    )
    assert all("prompt_logprobs" not in c for c in reply["choices"])


def test_echo_without_logprobs_repeats_the_prompt(
    client: openai.OpenAI, server: RunningServer, oracle_engine: Any
) -> None:
    text = "Once upon a time"
    expected = greedy(oracle_engine, oracle_engine.tokenizer.encode(text), 4)
    choice = client.completions.create(
        model=server.model_name, prompt=text, max_tokens=4, temperature=0, echo=True
    ).choices[0]
    assert choice.text == text + expected.text and choice.logprobs is None


def test_greedy_text_unchanged_by_logprobs(client: openai.OpenAI, server: RunningServer) -> None:
    args: dict[str, Any] = {"model": server.model_name, "prompt": QUESTION, "max_tokens": 12}
    plain = client.completions.create(**args, temperature=0).choices[0].text
    scored = client.completions.create(**args, temperature=0, logprobs=5).choices[0].text
    assert scored == plain


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # logprobs not on
        ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),  # chat's is true/false
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"logprobs": -1}, "logprobs"),
        ("/v1/completions", {"echo": "yes"}, "echo"),
        ("/v1/completions", {"top_logprobs": 2}, "top_logprobs"),  # chat's field
        ("/v1/chat/completions", {"echo": True}, "echo"),  # completions' field
        ("/v1/completions", {"prompt_logprobs": -1}, "prompt_logprobs"),  # vLLM's whole vocab
        ("/v1/completions", {"prompt_logprobs": -2}, "prompt_logprobs"),
        ("/v1/chat/completions", {"prompt_logprobs": 21}, "prompt_logprobs"),
        ("/v1/completions", {"prompt_logprobs": "2"}, "prompt_logprobs"),
        ("/v1/completions", {"prompt_logprobs": True}, "prompt_logprobs"),
        ("/v1/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ("/v1/chat/completions", {"prompt_logprobs": 0, "stream": True}, "prompt_logprobs"),
        ("/v1/responses", {"prompt_logprobs": 1}, "prompt_logprobs"),  # not vLLM's there
    ],
)
def test_bad_logprobs_fields_get_400_naming_them(
    server: RunningServer, path: str, body: dict[str, Any], param: str
) -> None:
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    if "responses" in path:
        base = {"input": "hi"}
    response = httpx.post(f"{server.url}{path}", json=base | body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


# --- streamed: each chunk's logprobs are those of the tokens whose text it completes ----------

COPY = "Copy exactly: the red fox and the blue bird sat on the old green fence."


def _logprobs_of(kind: str, choice: dict[str, Any]) -> tuple[list[str], list[float], list[int]]:
    """A choice's (or chunk's) tokens, their log-probabilities and (completions) text offsets."""
    lp = choice.get("logprobs") or {}
    if kind == "chat":
        entries = lp.get("content") or []
        return [e["token"] for e in entries], [e["logprob"] for e in entries], []
    return lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("text_offset") or []


def _text_of(kind: str, choice: dict[str, Any]) -> str:
    if kind == "chat":
        return str((choice.get("message") or choice["delta"]).get("content") or "")
    return str(choice["text"])


@pytest.mark.parametrize("stop", ["none", "aligned", "held", "cut"])
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_streamed_logprobs_come_with_their_tokens_text(
    speculating: RunningServer, kind: str, stop: str
) -> None:
    """A chunk's logprobs are those of the tokens whose text it completes: never before
    their text (a stop string holds it back while later tokens come, and several come at once
    on a speculating server), never after. Held text let out at token boundaries ("aligned"),
    each chunk's entries spell its text; held from inside a token ("held": a stop string that
    never completes), the token's entry waits for the chunk that shows the rest of it; cut by
    a stop string completed inside a token ("cut"), the cut tokens' entries come on the last
    chunk, of no text, as the whole answer has them. Together they are the whole answer's
    (the oracle), text and entries."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    body: dict[str, Any] = {"model": speculating.model_name, "max_tokens": 24, "temperature": 0}
    if kind == "chat":
        body |= {"messages": [{"role": "user", "content": COPY}], "logprobs": True}
        body["top_logprobs"] = 1
    else:
        body |= {"prompt": COPY + "\nCopy exactly:", "logprobs": 1}

    def whole() -> dict[str, Any]:
        reply = httpx.post(f"{speculating.url}{path}", json=body, timeout=300)
        assert reply.status_code == 200, reply.text
        choice: dict[str, Any] = reply.json()["choices"][0]
        return choice

    plain = whole()
    text, (tokens, _, _) = _text_of(kind, plain), _logprobs_of(kind, plain)
    assert "".join(tokens) == text and len(tokens) >= 8
    starts = [len("".join(tokens[:i])) for i in range(len(tokens) + 1)]
    first = starts[1] + 1  # inside the second token: held back from there
    body["stop"] = {
        "none": [],
        "aligned": [text[starts[3] : starts[6]] + "\u00a7"],  # (no such character: let out)
        "held": [text[first : starts[5] + 1] + "\u00a7"],
        "cut": [text[first : starts[5] + 2]],  # completed inside the sixth token
    }[stop]
    answer = whole()
    oracle_text = _text_of(kind, answer)
    oracle_tokens, oracle_logprobs, oracle_offsets = _logprobs_of(kind, answer)
    assert oracle_text == (text[:first] if stop == "cut" else text)
    assert oracle_tokens == (tokens[:6] if stop == "cut" else tokens)
    ends = [len("".join(oracle_tokens[: i + 1])) for i in range(len(oracle_tokens))]

    with httpx.stream(
        "POST", f"{speculating.url}{path}", json={**body, "stream": True}, timeout=300
    ) as response:
        assert response.status_code == 200, response.read()
        chunks = [
            json.loads(line.removeprefix("data: "))["choices"][0]
            for line in response.iter_lines()
            if line.startswith("data: {")
        ]
    shown, given, several = "", 0, False
    streamed: tuple[list[str], list[float], list[int]] = ([], [], [])
    for chunk in chunks:
        delta = _text_of(kind, chunk)
        entries = _logprobs_of(kind, chunk)
        for joined, part in zip(streamed, entries, strict=True):
            joined.extend(part)
        several = several or len(entries[0]) > 1
        if not delta:  # chat's first (its role) and the last (the finish): the rest, if any
            given += len(entries[0])
            continue
        at_token = len(shown) in starts
        shown += delta
        done = sum(end <= len(shown) for end in ends)  # the tokens whose text is shown
        assert entries[0] == oracle_tokens[given:done], (delta, entries[0])
        given = done
        if at_token and len(shown) in starts:  # a chunk of whole tokens: they spell it
            assert "".join(entries[0]) == delta, (delta, entries[0])
        if stop in ("none", "aligned"):  # all chunks are
            assert at_token and len(shown) in starts, (shown, tokens)
    assert chunks[-1]["finish_reason"] == answer["finish_reason"] and shown == oracle_text
    assert several  # several tokens reached the stream at once (or the cut ones, last)
    assert streamed[0] == oracle_tokens
    assert streamed[1] == pytest.approx(oracle_logprobs, abs=TOL)
    assert streamed[2] == oracle_offsets
