"""Named configs with the published shapes of the models people run, and a tiny Llama.

Each preset holds the values of that model's published `config.json` (the Instruct release
where there is one); `PRESETS` names them for `sv bench --preset`. Mistral 7B is v0.1, the
release with a 4,096-token sliding window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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


def llama_3_2_3b_config() -> ModelConfig:
    """The values of meta-llama/Llama-3.2-3B-Instruct's config.json."""
    return dataclasses.replace(
        llama_3_2_1b_config(),
        hidden_size=3072,
        num_hidden_layers=28,
        num_attention_heads=24,
        head_dim=128,
    )


def llama_3_1_8b_config() -> ModelConfig:
    """The values of meta-llama/Llama-3.1-8B-Instruct's config.json."""
    return dataclasses.replace(
        llama_3_2_1b_config(),
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        head_dim=128,
        intermediate_size=14336,
        rope_scaling=dataclasses.replace(LLAMA3_ROPE_SCALING, factor=8.0),
        tie_word_embeddings=False,
    )


def qwen2_5_0_5b_config() -> ModelConfig:
    """The values of Qwen/Qwen2.5-0.5B-Instruct's config.json."""
    return ModelConfig(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=4864,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        rope_scaling=None,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_ids=(151645,),
        torch_dtype="bfloat16",
        model_type="qwen2",
    )


def qwen3_0_6b_config() -> ModelConfig:
    """The values of Qwen/Qwen3-0.6B's config.json: Qwen2.5's vocabulary, norms, RoPE base and
    special tokens at other shapes, with per-head q/k norms (the `qwen3` model type)."""
    return dataclasses.replace(
        qwen2_5_0_5b_config(),
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        max_position_embeddings=40960,
        model_type="qwen3",
    )


def mistral_7b_config() -> ModelConfig:
    """The values of mistralai/Mistral-7B-Instruct-v0.1's config.json: Llama 3.1 8B's shapes
    with its own vocabulary, tokens and plain RoPE, and a sliding window."""
    return dataclasses.replace(
        llama_3_1_8b_config(),
        vocab_size=32000,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=32768,
        bos_token_id=1,
        eos_token_ids=(2,),
        model_type="mistral",
        sliding_window=4096,
    )


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "llama-3.2-1b": llama_3_2_1b_config,
    "llama-3.2-3b": llama_3_2_3b_config,
    "llama-3.1-8b": llama_3_1_8b_config,
    "qwen2.5-0.5b": qwen2_5_0_5b_config,
    "qwen3-0.6b": qwen3_0_6b_config,
    "mistral-7b": mistral_7b_config,
}


def preset_config(name: str) -> ModelConfig:
    """The preset `name`; a `WeightsError` listing the names otherwise."""
    if name not in PRESETS:
        raise WeightsError(f"unknown preset {name!r} (presets: {', '.join(PRESETS)})")
    return PRESETS[name]()


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
