"""Llama 3.2: our encode/decode token for token against tiktoken and HF tokenizers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_tokenizer import Tokenizer, TokenizerError
from tokenizer_test_support import CORPUS, all_assigned_characters, tricky_text, unicode_text

ORACLE_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def hf_ids(hf: Any, text: str) -> list[int]:
    return list(hf.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_corpus_matches_tiktoken_and_hf(
    text: str, llama_model: Tokenizer, llama_json: Tokenizer, tiktoken_llama: Any, hf_llama: Any
) -> None:
    expected = tiktoken_llama.encode_ordinary(text)
    assert llama_model.encode(text) == expected
    assert llama_json.encode(text) == expected
    assert hf_ids(hf_llama, text) == expected  # the two oracles agree with each other too
    assert llama_model.decode(expected) == text
    assert llama_json.decode(expected) == text


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_corpus_with_special_tokens_allowed(
    text: str,
    llama_model: Tokenizer,
    llama_json: Tokenizer,
    tiktoken_llama: Any,
    hf_llama_special: Any,
) -> None:
    expected = tiktoken_llama.encode(text, allowed_special="all")
    assert llama_model.encode(text, allow_special=True) == expected
    assert llama_json.encode(text, allow_special=True) == expected
    assert hf_ids(hf_llama_special, text) == expected


@ORACLE_SETTINGS
@given(text=unicode_text())
def test_unicode_text_matches_oracles(
    text: str, llama_model: Tokenizer, llama_json: Tokenizer, tiktoken_llama: Any, hf_llama: Any
) -> None:
    expected = tiktoken_llama.encode_ordinary(text)
    assert llama_model.encode(text) == expected
    assert llama_json.encode(text) == hf_ids(hf_llama, text) == expected
    assert llama_model.decode(expected) == text


@ORACLE_SETTINGS
@given(text=tricky_text())
def test_boundary_heavy_text_matches_oracles(
    text: str, llama_model: Tokenizer, llama_json: Tokenizer, tiktoken_llama: Any, hf_llama: Any
) -> None:
    expected = tiktoken_llama.encode_ordinary(text)
    assert llama_model.encode(text) == expected
    assert llama_json.encode(text) == hf_ids(hf_llama, text) == expected
    assert llama_model.encode(text, allow_special=True) == tiktoken_llama.encode(
        text, allowed_special="all"
    )
    assert llama_json.decode(expected) == text


@pytest.mark.slow
def test_every_assigned_character_matches_tiktoken(
    llama_model: Tokenizer, tiktoken_llama: Any
) -> None:
    """Every assigned code point, in contexts that exercise each pattern alternative."""
    characters = list(all_assigned_characters())
    contexts = ["x{c}y", " {c}{c} 1", "'{c}", "{c}  b"]
    chunk = 4096
    for start in range(0, len(characters), chunk):
        text = "\n".join(
            context.format(c=c) for c in characters[start : start + chunk] for context in contexts
        )
        assert llama_model.encode(text) == tiktoken_llama.encode_ordinary(text), (
            f"characters from {start}"
        )


def test_special_token_list_matches_tokenizer_json(
    llama_dir: Path, llama_model: Tokenizer, llama_json: Tokenizer
) -> None:
    """The 256 specials we give tokenizer.model = tokenizer.json's added_tokens below 128256."""
    added = json.loads((llama_dir / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    expected = {t["content"]: t["id"] for t in added if t["id"] < 128256}
    assert len(expected) == 256
    assert llama_model.special_tokens == expected
    assert llama_model.vocab_size == 128256
    assert llama_model.bos_id == 128000
    assert llama_model.eos_ids == {128001, 128008, 128009}
    # tokenizer.json adds the vision model's <|image|> (128256); everything else is identical
    assert llama_json.special_tokens == {**expected, "<|image|>": 128256}


def test_special_tokens_only_with_allow_special(
    llama_model: Tokenizer, llama_json: Tokenizer
) -> None:
    text = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    for tokenizer in (llama_model, llama_json):
        plain = tokenizer.encode(text)
        assert not set(plain) & set(tokenizer.special_tokens.values())
        assert tokenizer.decode(plain) == text
        special = tokenizer.encode(text, allow_special=True)
        assert special[0] == 128006 and special[2] == 128007 and special[-1] == 128009
        assert special == [
            128006,
            *tokenizer.encode("user"),
            128007,
            *tokenizer.encode("\n\nhi"),
            128009,
        ]
        assert tokenizer.decode(special) == text


@ORACLE_SETTINGS
@given(ids=st.lists(st.integers(0, 128255), max_size=40))
def test_decode_of_any_ids_matches_oracles(
    ids: list[int],
    llama_model: Tokenizer,
    llama_json: Tokenizer,
    tiktoken_llama: Any,
    hf_llama: Any,
) -> None:
    """Arbitrary ids cut characters: U+FFFD replacement must match tiktoken and HF exactly."""
    expected = tiktoken_llama.decode(ids)
    assert llama_model.decode(ids) == expected
    assert llama_json.decode(ids) == expected
    assert hf_llama.decode(ids, skip_special_tokens=False) == expected
    assert llama_model.decode_bytes(ids) == tiktoken_llama.decode_bytes(ids)


def test_token_bytes(llama_model: Tokenizer, tiktoken_llama: Any) -> None:
    for token_id in (0, 13, 220, 9906, 127999):
        assert llama_model.token_bytes(token_id) == tiktoken_llama.decode_single_token_bytes(
            token_id
        )
    assert llama_model.token_bytes(128009) == b"<|eot_id|>"
    for bad in (-1, 128256, 10**9):
        with pytest.raises(TokenizerError, match=f"token id {bad}"):
            llama_model.token_bytes(bad)
        with pytest.raises(TokenizerError, match=f"token id {bad}"):
            llama_model.decode([9906, bad])


def test_shown_bytes_are_the_token_bytes_or_none_past_the_vocabulary(
    llama_model: Tokenizer, tiktoken_llama: Any
) -> None:
    for token_id in (0, 13, 9906, 127999):
        assert llama_model.shown_bytes(token_id) == tiktoken_llama.decode_single_token_bytes(
            token_id
        )
    assert llama_model.shown_bytes(128009) == b"<|eot_id|>"
    for past in (-1, 128256, 10**9):  # a padded model's spare logit rows, say
        assert llama_model.shown_bytes(past) == b""


def test_lone_surrogates_are_replaced_like_tiktoken(
    llama_model: Tokenizer, tiktoken_llama: Any
) -> None:
    text = "a\ud800b \udfff \ud83d\ude00"  # two lone surrogates, one valid pair (😀)
    assert llama_model.encode(text) == tiktoken_llama.encode_ordinary(text)
    assert llama_model.decode(llama_model.encode(text)) == "a\ufffdb \ufffd 😀"


@pytest.mark.parametrize(
    "word", ["a" * 100_000, "ab" * 50_000, "日本" * 30_000, "x" + "😀" * 25_000]
)
def test_very_long_words_are_exact(
    word: str, llama_model: Tokenizer, llama_json: Tokenizer, tiktoken_llama: Any, hf_llama: Any
) -> None:
    """Words tens of thousands of characters long, against both oracles. Not timed: a
    wall-clock bound fails on a busy machine, not on a bug."""
    ours = llama_model.encode(word)
    assert ours == tiktoken_llama.encode_ordinary(word) == hf_ids(hf_llama, word)
    assert llama_json.encode(word) == ours
    assert llama_model.decode(ours) == word


def test_cache_does_not_change_results(llama_dir: Path, tiktoken_llama: Any) -> None:
    fresh = Tokenizer.from_file(llama_dir / "tokenizer.model")
    text = " ".join(CORPUS)
    first = fresh.encode(text)
    assert fresh.encode(text) == first == tiktoken_llama.encode_ordinary(text)


@pytest.fixture(scope="module")
def ignore_merges_pair(
    llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Tokenizer, Any]:
    """Newer uploads of Llama 3 tokenizer.json set model.ignore_merges (whole-word lookup first)."""
    tokenizers = pytest.importorskip("tokenizers")
    document = json.loads((llama_dir / "tokenizer.json").read_text(encoding="utf-8"))
    document["model"]["ignore_merges"] = True
    path = tmp_path_factory.mktemp("ignore_merges") / "tokenizer.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    hf = tokenizers.Tokenizer.from_file(str(path))
    hf.encode_special_tokens = True
    return Tokenizer.from_file(path), hf


@ORACLE_SETTINGS
@given(text=st.one_of(unicode_text(), tricky_text(), st.sampled_from(CORPUS)))
def test_ignore_merges_variant_matches_oracles(
    text: str, ignore_merges_pair: tuple[Tokenizer, Any], tiktoken_llama: Any
) -> None:
    ours, hf = ignore_merges_pair
    assert ours.encode(text) == hf_ids(hf, text) == tiktoken_llama.encode_ordinary(text)


@pytest.mark.parametrize("text", [b"Hi", None, 7, ["Hi"]])
def test_encode_refuses_what_is_not_text_by_name(llama_json: Tokenizer, text: object) -> None:
    """encode takes a str; bytes failed inside the regex engine ("cannot use a string pattern
    on a bytes-like object"), None inside the special-token matcher."""
    with pytest.raises(TokenizerError, match=f"encode takes a str, got {type(text).__name__}"):
        llama_json.encode(text)  # type: ignore[arg-type]
