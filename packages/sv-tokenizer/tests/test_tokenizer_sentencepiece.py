"""SentencePiece-style BPE with byte fallback (Mistral, Llama 2) against HF tokenizers.

No Mistral or Llama 2 tokenizer file ships in a package this project may use, so the tests
train one of the same kind with the `tokenizers` library, in both layouts the Hub has:
Llama 2 / Mistral v0.1 (Prepend + Replace normalizer, no pre-tokenizer) and tokenizers >= 0.19
/ Mistral v0.3 (Metaspace pre-tokenizer, prepend_scheme "first"). A small alphabet leaves most
characters of the corpus to byte fallback. Then Mistral's [INST] chat template goes through
the jinja path.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_tokenizer import Message, StreamDecoder, TemplateChatFormat, Tokenizer, TokenizerError
from tokenizer_test_support import CORPUS, tricky_text, unicode_text

tokenizers = pytest.importorskip("tokenizers")

BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
TRAINING_TEXT = [
    *CORPUS,
    "The model reads a prompt, and the prompt is a list of tokens. " * 3,
    "Mistral and Llama 2 write a space as a lower one-eighth block, and bytes as tokens.",
    "[INST] What is the capital of France? [/INST] The capital of France is Paris.",
]
# Mistral-7B-Instruct-v0.1's chat_template, as published in its tokenizer_config.json.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)
ORACLE_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _train(layout: str) -> str:
    """A tokenizer.json of the layout, its <0xXX> tokens plain vocabulary entries (as in
    Mistral's file: only <unk>, <s> and </s> are added tokens)."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if layout == "llama2":
        hf.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
        )
    else:
        hf.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme="first", split=False
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
        vocab_size=700,
        special_tokens=["<unk>", "<s>", "</s>", *BYTE_TOKENS],
        limit_alphabet=40,
        show_progress=False,
    )
    hf.train_from_iterator(TRAINING_TEXT, trainer)
    spec = json.loads(hf.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in BYTE_TOKENS]
    return json.dumps(spec)


@pytest.fixture(scope="module", params=["llama2", "metaspace"])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(our tokenizer, HF with special-token text as text, HF recognising special tokens,
    the folder holding tokenizer.json and a tokenizer_config.json with Mistral's template)."""
    folder = tmp_path_factory.mktemp(request.param)
    text = _train(request.param)
    (folder / "tokenizer.json").write_text(text, encoding="utf-8")
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": MISTRAL_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    as_text = tokenizers.Tokenizer.from_str(text)
    as_text.encode_special_tokens = True
    return Tokenizer.from_model_dir(folder), as_text, tokenizers.Tokenizer.from_str(text), folder


def hf_ids(hf: Any, text: str) -> list[int]:
    return list(hf.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_corpus_matches_hf(text: str, trained: Any) -> None:
    ours, hf, _, _ = trained
    expected = hf_ids(hf, text)
    assert ours.encode(text) == expected
    assert ours.decode(expected) == hf.decode(expected, skip_special_tokens=False)


def streamed(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    decoder = StreamDecoder(tokenizer)
    return [decoder.push(token_id) for token_id in ids] + [decoder.flush()]


@ORACLE_SETTINGS
@given(text=unicode_text())
def test_streamed_text_is_hf_decode(text: str, trained: Any) -> None:
    """Streamed deltas join to HF's decode of the same ids (its leading space dropped, as the
    decoder's Strip drops it), and no delta holds a cut character or a stray U+FFFD."""
    ours, hf, _, _ = trained
    ids = hf_ids(hf, text)
    chunks = streamed(ours, ids)
    expected = hf.decode(ids, skip_special_tokens=False)
    assert "".join(chunks) == ours.decode(ids) == expected
    if "\ufffd" not in text:
        assert all("\ufffd" not in chunk for chunk in chunks)


def test_stream_starts_without_the_prepended_space(trained: Any) -> None:
    ours, hf, _, _ = trained
    ids = hf_ids(hf, "Paris is the capital")
    assert ours.token_bytes(ids[0]).startswith(b" ")  # the ▁ the encoding put in front
    chunks = streamed(ours, ids)
    assert chunks[0] == hf.decode(ids[:1]) and not chunks[0].startswith(" ")
    assert "".join(chunks) == hf.decode(ids) == "Paris is the capital"


@ORACLE_SETTINGS
@given(prompt=unicode_text(), text=unicode_text())
def test_a_continuation_is_hf_decode_of_both_past_the_prompt(
    prompt: str, text: str, trained: Any
) -> None:
    """A completion's text continues its prompt's: what decoding prompt and output together
    adds past the prompt's own decode (vLLM's incremental rule), its leading space kept."""
    ours, hf, _, _ = trained
    before, after = hf_ids(hf, "x" + prompt), hf_ids(hf, text)
    head = hf.decode(before, skip_special_tokens=False)
    whole = hf.decode(before + after, skip_special_tokens=False)
    if not whole.startswith(head):  # (a character split across the two: no common prefix)
        return
    decoder = StreamDecoder(ours, continuation=True)
    chunks = [decoder.push(t) for t in after] + [decoder.flush()]
    assert "".join(chunks) == ours.decode(after, continuation=True) == whole[len(head) :]


def _ids_heavy_in_byte_tokens(tokenizer: Tokenizer) -> st.SearchStrategy[list[int]]:
    byte_ids = sorted(tokenizer.byte_fallback_ids)
    any_id = st.integers(0, tokenizer.vocab_size - 1)
    return st.lists(st.one_of(st.sampled_from(byte_ids), any_id), max_size=30)


@ORACLE_SETTINGS
@given(data=st.data())
def test_arbitrary_ids_decode_and_stream_as_hf(data: st.DataObject, trained: Any) -> None:
    """Ids no encoding gives: byte-token runs that are not UTF-8 (HF: one U+FFFD per token of
    such a run), special tokens, a ▁ or a <0x20> first."""
    ours, hf, _, _ = trained
    ids = data.draw(_ids_heavy_in_byte_tokens(ours))
    expected = hf.decode(ids, skip_special_tokens=False)
    assert ours.decode(ids) == expected
    assert "".join(streamed(ours, ids)) == expected


def test_byte_fallback_is_exercised(trained: Any) -> None:
    """The corpus has characters outside the 40-character alphabet: they come out as <0xXX>."""
    ours, _, _, _ = trained
    ids = ours.encode("日本語 ✓")
    byte_ids = {ours.special_tokens.get(t, -1) for t in BYTE_TOKENS} | {
        i for i in range(ours.vocab_size) if ours.token_bytes(i) in {bytes([b]) for b in range(256)}
    }
    assert sum(i in byte_ids for i in ids) >= len("日本語✓".encode())


@ORACLE_SETTINGS
@given(text=unicode_text())
def test_unicode_text_matches_hf(text: str, trained: Any) -> None:
    ours, hf, _, _ = trained
    expected = hf_ids(hf, text)
    assert ours.encode(text) == expected
    assert ours.decode(expected) == hf.decode(expected, skip_special_tokens=False)


@ORACLE_SETTINGS
@given(text=tricky_text())
def test_boundary_heavy_text_matches_hf(text: str, trained: Any) -> None:
    ours, hf, _, _ = trained
    assert ours.encode(text) == hf_ids(hf, text)


@pytest.mark.parametrize("text", ["<s>[INST] hi [/INST]", "a</s> b<s>", "<s>", " <s> x"])
def test_special_tokens_split_the_text_as_hf_does(text: str, trained: Any) -> None:
    """Each stretch between special tokens gets its leading ▁ as HF gives it (every stretch
    with the Prepend normalizer, only the one at the very start with Metaspace "first")."""
    ours, _, hf_special, _ = trained
    assert ours.encode(text, allow_special=True) == hf_ids(hf_special, text)


def test_mistral_chat_template_through_jinja(trained: Any) -> None:
    """The [INST] format from the folder's own template: the render is transformers' render,
    and its ids are HF's encoding of that render."""
    transformers = pytest.importorskip("transformers")
    ours, _, hf_special, folder = trained
    chat = ours.chat_format
    assert isinstance(chat, TemplateChatFormat)
    messages = [
        Message("user", "What is the capital of France?"),
        Message("assistant", "Paris."),
        Message("user", "And  of Italy?"),
    ]
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token="<s>", eos_token="</s>"
    )
    dicts = [{"role": m.role, "content": m.content} for m in messages]
    rendered = fast.apply_chat_template(dicts, chat_template=MISTRAL_TEMPLATE, tokenize=False)
    assert chat.render(messages) == rendered
    assert chat.encode_dialog(messages) == hf_ids(hf_special, rendered)
    # Message text stays text: a "</s>" typed by the user is not the end-of-sequence token.
    typed = chat.encode_dialog([Message("user", "a </s> b")])
    assert typed.count(ours.special_tokens["</s>"]) == 0


_REPLACE = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}
_BYTE_FALLBACK, _FUSE = {"type": "ByteFallback"}, {"type": "Fuse"}
_STRIP = {"type": "Strip", "content": " ", "start": 1, "stop": 0}


@pytest.mark.parametrize(
    "steps",
    [
        [_REPLACE, _BYTE_FALLBACK, _FUSE, _STRIP],  # Llama 2's, Mistral's
        [_REPLACE, _BYTE_FALLBACK, _FUSE],  # Gemma's: no leading space to drop
        [_REPLACE, _BYTE_FALLBACK, _STRIP, _FUSE],  # Strip before Fuse: one space per token
        [_REPLACE, _BYTE_FALLBACK, _STRIP],  # no Fuse: Strip acts on each token too
        [_REPLACE, _FUSE, _BYTE_FALLBACK, _STRIP],  # <0xXX> fused before ByteFallback
        [_BYTE_FALLBACK, _FUSE, _STRIP],  # no Replace: ▁ stays
        [_REPLACE, _FUSE, _STRIP],  # no ByteFallback: <0xXX> stays text
        [{**_REPLACE, "content": "_"}, _BYTE_FALLBACK, _FUSE, _STRIP],  # ▁ becomes "_"
        [_STRIP, _REPLACE, _BYTE_FALLBACK, _FUSE],  # Strip before the ▁ is a space
    ],
)
def test_a_decoder_decodes_as_hf_or_is_refused(tmp_path: Path, steps: list[Any]) -> None:
    """HF runs a Sequence decoder's steps in order, Strip on each token it is given: a file
    whose steps sv would not decode as HF does is refused by name, not decoded otherwise."""
    spec = json.loads(_train("llama2"))
    spec["decoder"] = {"type": "Sequence", "decoders": steps}
    text = json.dumps(spec)
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    try:
        ours = Tokenizer.from_file(tmp_path / "tokenizer.json")
    except TokenizerError as error:
        assert "field 'decoder" in str(error)
        return
    hf = tokenizers.Tokenizer.from_str(text)
    for sample in ("Hello world, the prompt", "日本 x", " lead", "a\u2581b"):
        ids = hf_ids(hf, sample)
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), sample


@pytest.mark.parametrize("replacement", ["\u2581", "_"])
def test_a_metaspace_decoder_decodes_as_hf_or_is_refused(tmp_path: Path, replacement: str) -> None:
    """HF's Metaspace decoder turns its `replacement` into spaces, not `▁`: a decoder whose
    replacement is another character is refused, not decoded as if it were `▁`."""
    spec = json.loads(_train("metaspace"))
    spec["decoder"] = {"type": "Metaspace", "replacement": replacement, "prepend_scheme": "first"}
    text = json.dumps(spec)
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    try:
        ours = Tokenizer.from_file(tmp_path / "tokenizer.json")
    except TokenizerError as error:
        assert "field 'decoder.replacement' must be" in str(error)
        return
    hf = tokenizers.Tokenizer.from_str(text)
    for sample in ("The model_reads a prompt", "a_b c", " lead"):
        ids = hf_ids(hf, sample)
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), sample


def test_a_vocabulary_without_its_byte_tokens_is_refused(tmp_path: Path) -> None:
    spec = json.loads(_train("llama2"))
    del spec["model"]["vocab"]["<0x41>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"model.vocab' has no <0x41> token"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["pre_tokenizer"].update(prepend_scheme="sometimes"),
            "field 'pre_tokenizer.prepend_scheme' is 'sometimes'",
        ),
        (
            lambda s: s["pre_tokenizer"].update(replacement="_"),
            "field 'pre_tokenizer.replacement' must be '▁'",
        ),
        (
            lambda s: s["decoder"]["decoders"].append({"type": "Lowercase"}),
            "is 'Lowercase'; not a SentencePiece-style decoder step",
        ),
        (lambda s: s.update(decoder=None), "field 'decoder' is missing"),
    ],
)
def test_bad_sentencepiece_fields_are_named(tmp_path: Path, change: Any, message: str) -> None:
    spec = json.loads(_train("metaspace"))
    change(spec)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(TokenizerError) as caught:
        Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert message in str(caught.value)


def test_an_added_token_on_a_vocabulary_id_is_refused(tmp_path: Path) -> None:
    """An added token whose id is a vocabulary entry of other text: HF gives that id the
    entry's text (and the added token another id), so sv would encode the entry's text as the
    id and decode it as the added token's. Refused by name, as in a byte-level file."""
    spec = json.loads(_train("llama2"))
    entry, taken = next((t, i) for t, i in spec["model"]["vocab"].items() if t.isalpha())
    spec["added_tokens"].append(
        {"id": taken, "content": "<extra>", "special": True, "single_word": False,
         "lstrip": False, "rstrip": False, "normalized": False}
    )  # fmt: skip
    text = json.dumps(spec)
    hf = tokenizers.Tokenizer.from_str(text)
    assert hf.decode([taken], skip_special_tokens=False) == entry.replace(
        "\u2581", " "
    ).removeprefix(" ")
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    with pytest.raises(
        TokenizerError, match=rf"'added_tokens\[\d+\].id' is {taken}, already the id of model.vocab"
    ):
        Tokenizer.from_file(tmp_path / "tokenizer.json")


def test_a_sentencepiece_id_far_past_the_vocabulary_is_refused(tmp_path: Path) -> None:
    """A damaged id (10**12) is a TokenizerError, not a table of 10**12 entries (MemoryError)."""
    spec = json.loads(_train("metaspace"))
    spec["model"]["vocab"]["zzz"] = 10**12
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(TokenizerError, match="token id 1,000,000,000,000 leaves"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")


@pytest.mark.parametrize("scheme", ["first", "always", "never"])
def test_a_metaspace_decoder_leaves_byte_tokens_as_text(tmp_path: Path, scheme: str) -> None:
    """HF's Metaspace decoder turns ▁ into a space (dropping the first token's where its scheme
    prepends one) and has no byte fallback: `<0xXX>` tokens decode as their own text, as HF's
    decode and vLLM's output show them. The encoding still falls back to them."""
    from tokenizers import decoders

    hf = tokenizers.Tokenizer.from_str(_train("metaspace"))
    hf.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    text = hf.to_str()
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    ours = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert not ours.byte_fallback_ids
    vocab = json.loads(text)["model"]["vocab"]
    byte_ids = [vocab[token] for token in BYTE_TOKENS]
    rng = random.Random(0)
    samples = [hf_ids(hf, t) for t in ("日本 x", "a\nb ✓", " lead", "Paris is the capital")]
    samples += [
        [
            rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(len(vocab))
            for _ in range(n)
        ]
        for n in range(1, 60)
    ]
    assert any(i in byte_ids for i in samples[0]), "the sample must fall back to byte tokens"
    for ids in samples:
        expected = hf.decode(ids, skip_special_tokens=False)
        assert ours.decode(ids) == expected, ids
        assert "".join(streamed(ours, ids)) == expected, ids
    assert ours.encode("日本 x") == samples[0]
