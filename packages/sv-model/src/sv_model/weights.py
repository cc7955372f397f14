"""Llama weights as the model uses them: per layer, Q/K/V and gate/up packed into one matrix each.

Packing turns three (or two) small matmuls into one larger one: one read of the activations,
one cuBLAS launch, better tensor-core occupancy. The checkpoint keeps Hugging Face's separate
tensors; packing happens once, at load.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sv_weights import LlamaConfig
from torch import Tensor


@dataclass
class LayerWeights:
    input_norm: Tensor  # [H]
    qkv: Tensor  # [(Hq + 2*Hkv) * D, H]
    o: Tensor  # [H, Hq * D]
    post_attention_norm: Tensor  # [H]
    gate_up: Tensor  # [2 * I, H]
    down: Tensor  # [H, I]


@dataclass
class LlamaWeights:
    embed: Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: Tensor  # [H]
    lm_head: Tensor  # [V, H]; the same tensor as `embed` when the embeddings are tied

    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        state: dict[str, Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> LlamaWeights:
        """Pack a Hugging Face-named state dict (already validated against `config`)."""

        def take(name: str) -> Tensor:
            return state[name].to(device=device, dtype=dtype)

        layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            qkv = torch.cat(
                [take(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")], dim=0
            )
            gate_up = torch.cat([take(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")], dim=0)
            layers.append(
                LayerWeights(
                    input_norm=take(p + "input_layernorm.weight"),
                    qkv=qkv,
                    o=take(p + "self_attn.o_proj.weight"),
                    post_attention_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=gate_up,
                    down=take(p + "mlp.down_proj.weight"),
                )
            )
        embed = take("model.embed_tokens.weight")
        if config.tie_word_embeddings or "lm_head.weight" not in state:
            lm_head = embed
        else:
            lm_head = take("lm_head.weight")
        return cls(embed, layers, take("model.norm.weight"), lm_head)
