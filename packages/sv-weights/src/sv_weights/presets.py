"""Named Llama configs: the real Llama 3.2 1B Instruct, and a tiny one of the same structure."""

from __future__ import annotations

import dataclasses
from typing import Any

from sv_weights.config import ModelConfig, RopeScaling
from sv_weights.errors import WeightsError

# Llama 3's RoPE scaling as meta-llama/Llama-3.2-1B-Instruct's config.json has it.
LLAMA3_ROPE_SCALING = RopeScaling(
    rope_type="llama3",
    factor=32.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)


def llama_3_2_1b_config() -> ModelConfig:
    """The values of meta-llama/Llama-3.2-1B-Instruct's config.json."""
    return ModelConfig(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE_SCALING,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
        torch_dtype="bfloat16",
    )


def tiny_llama_config(**overrides: Any) -> ModelConfig:
    """A small config with everything structural of Llama 3.2 1B, for fast tests.

    Grouped-query attention (4 query heads share 2 key/value heads), llama3 RoPE scaling with
    the real factors, tied embeddings, several eos ids, bf16. Any field can be overridden, e.g.
    `tiny_llama_config(tie_word_embeddings=False, num_hidden_layers=3)`; the result is
    validated like any config.
    """
    base = ModelConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=256,
        vocab_size=512,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE_SCALING,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2, 3),
        torch_dtype="bfloat16",
    )
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(ModelConfig)})
    if unknown:
        raise WeightsError(f"tiny_llama_config: {unknown} are not ModelConfig fields")
    return dataclasses.replace(base, **overrides)
