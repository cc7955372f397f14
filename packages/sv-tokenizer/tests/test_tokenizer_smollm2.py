"""SmolLM2: our loader on tokenizer.json files made from the GGUF, against HF tokenizers and transformers."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from sv_tokenizer import ChatMLFormat, TemplateChatFormat, Tokenizer
from tokenizer_test_support import CORPUS, tricky_text, unicode_text

ORACLE_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def hf_ids(hf: Any, text: str) -> list[int]:
    return list(hf.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_corpus_matches_hf(text: str, smollm2: Tokenizer, hf_smollm2: Any) -> None:
    expected = hf_ids(hf_smollm2, text)
    assert smollm2.encode(text) == expected
    assert smollm2.decode(expected) == hf_smollm2.decode(expected, skip_special_tokens=False)


@ORACLE_SETTINGS
@given(text=unicode_text())
def test_unicode_text_matches_hf(text: str, smollm2: Tokenizer, hf_smollm2: Any) -> None:
    assert smollm2.encode(text) == hf_ids(hf_smollm2, text)


@ORACLE_SETTINGS
@given(text=tricky_text())
def test_boundary_heavy_text_matches_hf(text: str, smollm2: Tokenizer, hf_smollm2: Any) -> None:
    expected = hf_ids(hf_smollm2, text)
    assert smollm2.encode(text) == expected
    assert smollm2.decode(expected) == hf_smollm2.decode(expected, skip_special_tokens=False)


def test_digits_are_split_one_by_one(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("12345")
    assert [smollm2.decode([i]) for i in ids] == ["1", "2", "3", "4", "5"]


def test_roundtrip_except_bytes_the_vocabulary_lacks(smollm2: Tokenizer) -> None:
    text = "SmolLM2 says héllo 👋 to 世界\r\n\tand\x07more"
    assert smollm2.decode(smollm2.encode(text)) == text
    # 0x04 has no token in SmolLM2's vocabulary: HF drops it (no unk token), and so do we
    assert smollm2.decode(smollm2.encode("a\x04b")) == "ab"


def test_special_tokens_and_model_dir(
    smollm2_dir: Path, smollm2: Tokenizer, hf_smollm2: Any
) -> None:
    assert smollm2.special_tokens["<|im_start|>"] == 1
    assert smollm2.special_tokens["<|im_end|>"] == 2
    assert smollm2.eos_ids == {0, 2}  # <|endoftext|>, <|im_end|>
    assert smollm2.bos_id is None  # the tokenizer.json alone names no BOS
    text = "<|im_start|>user\nhi<|im_end|>"
    assert smollm2.encode(text, allow_special=True)[0] == 1
    assert 1 not in smollm2.encode(text)
    from_dir = Tokenizer.from_model_dir(smollm2_dir)
    assert from_dir.bos_id == 1  # tokenizer_config.json's bos_token
    assert from_dir.eos_ids == {0, 2}
    assert isinstance(from_dir.chat_format, TemplateChatFormat)  # the folder's template wins
    assert isinstance(smollm2.chat_format, ChatMLFormat)  # no template: <|im_start|> -> ChatML


@pytest.fixture(scope="module")
def transformers_gguf_tokenizer(
    smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Any]:
    """transformers' own GGUF -> tokenizer conversion, saved as the tokenizer.json it writes."""
    gguf_utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from transformers.integrations.ggml import convert_gguf_tokenizer

    checkpoint = gguf_utils.load_gguf_checkpoint(str(smollm2_gguf), return_tensors=False)
    backend, _ = convert_gguf_tokenizer("llama", checkpoint["tokenizer"])
    path = tmp_path_factory.mktemp("smollm2_transformers") / "tokenizer.json"
    backend.save(str(path))
    return path, backend


@pytest.mark.slow
def test_transformers_written_tokenizer_json(
    transformers_gguf_tokenizer: tuple[Path, Any], smollm2: Tokenizer
) -> None:
    """transformers' file differs (byte_fallback, unk <|endoftext|> fused, a Sequence decoder, and
    no Digits step: it ignores tokenizer.ggml.pre); we must still agree with it on its own terms."""
    path, backend = transformers_gguf_tokenizer
    ours = Tokenizer.from_file(path)
    backend.encode_special_tokens = True
    for text in [*CORPUS, "a\x04\x06b\x13", "x\x04"]:
        expected = list(backend.encode(text, add_special_tokens=False).ids)
        assert ours.encode(text) == expected, text
        assert ours.decode(expected) == backend.decode(expected, skip_special_tokens=False)
    assert ours.encode("a\x04\x06b") == [ours.encode("a")[0], 0, ours.encode("b")[0]]  # fused unk
    # without digits the vocabulary, merges and specials read from the GGUF agree with ours
    for text in CORPUS:
        if not any(unicodedata.category(c).startswith("N") for c in text) and "\x04" not in text:
            assert ours.encode(text, allow_special=True) == smollm2.encode(text, allow_special=True)
