"""Shared fixtures: small random-weight checkpoints and the transformers oracle."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sv_weights import tiny_llama_config, write_random_checkpoint


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small but structurally faithful Llama (GQA, llama3 RoPE scaling, tied), FP32."""
    d = tmp_path_factory.mktemp("tiny")
    write_random_checkpoint(d, tiny_llama_config(), seed=0, dtype=torch.float32)
    return d


@pytest.fixture(scope="session")
def untied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same shape family with a separate LM head, MHA-sized kv heads and head_dim 32."""
    d = tmp_path_factory.mktemp("untied")
    cfg = tiny_llama_config(
        tie_word_embeddings=False, num_key_value_heads=4, head_dim=32, rope_scaling=None
    )
    write_random_checkpoint(d, cfg, seed=1, dtype=torch.float32)
    return d
