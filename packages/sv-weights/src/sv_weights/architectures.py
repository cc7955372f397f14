"""The decoder families sv runs, each declared by how it differs from the one shared forward.

Every family here is a pre-norm decoder with RMSNorm, rotary attention with grouped-query
heads and a SwiGLU MLP; sizes, head_dim, GQA ratio, tied embeddings and RoPE settings are
config values read the same way for all. What is left differs by family, and is all that an
`Architecture` says:

- `qkv_bias`: the q, k and v projections carry a bias (Qwen2; the output projection does not);
- `qk_norm`: an RMSNorm over each head of q and of k, before RoPE (Qwen3);
- `sliding_window`: the config's `sliding_window` (keys within that many positions of the
  query, itself included) applies to every layer (Mistral);
- where a config leaves a key out, the family's own default in transformers'
  configuration class: `default_head_dim` (Qwen3's 128, where the others divide the hidden
  size among the heads), `default_num_key_value_heads` (Mistral's 8, Qwen's 32, where
  Llama has one per query head) and `default_sliding_window` (Mistral's 4096; null is no
  window).

A config is matched by `model_type`, or by its first `architectures` class name when it has
no `model_type`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sv_weights.errors import WeightsError


@dataclass(frozen=True)
class Architecture:
    model_type: str  # config.json's `model_type`
    class_name: str  # config.json's `architectures[0]`: transformers' class of this family
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: bool = False
    default_head_dim: int | None = None  # None: hidden_size // num_attention_heads
    default_num_key_value_heads: int | None = None  # None: num_attention_heads
    default_sliding_window: int | None = None


ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in (
        Architecture("llama", "LlamaForCausalLM"),
        Architecture(
            "mistral",
            "MistralForCausalLM",
            sliding_window=True,
            default_num_key_value_heads=8,
            default_sliding_window=4096,
        ),
        Architecture("qwen2", "Qwen2ForCausalLM", qkv_bias=True, default_num_key_value_heads=32),
        Architecture(
            "qwen3",
            "Qwen3ForCausalLM",
            qk_norm=True,
            default_head_dim=128,
            default_num_key_value_heads=32,
        ),
    )
}


def architecture_of(model_type: object, class_names: object) -> Architecture:
    """The family a config names (see the module doc); a one-line `WeightsError` otherwise."""
    if model_type is None and isinstance(class_names, list) and class_names:
        by_class = {a.class_name: a for a in ARCHITECTURES.values()}
        found = by_class.get(class_names[0]) if isinstance(class_names[0], str) else None
        if found is not None:
            return found
        model_type = class_names[0]
    if model_type is None:
        model_type = "llama"  # the oldest Llama configs name neither
    found = ARCHITECTURES.get(model_type) if isinstance(model_type, str) else None
    if found is None:
        raise WeightsError(
            f"config model_type {model_type!r} is not supported (supported: "
            f"{', '.join(sorted(ARCHITECTURES))})"
        )
    return found
