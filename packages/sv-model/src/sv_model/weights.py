"""Decoder weights as the model uses them: per layer, Q/K/V and gate/up packed into one matrix each.

Packing turns three (or two) small matmuls into one larger one: one read of the activations,
one cuBLAS launch, better tensor-core occupancy. The checkpoint keeps Hugging Face's separate
tensors; packing happens once, at load.

Which load copies and which maps (see `sv_weights.load_checkpoint`): on a GPU the loader
copies the checkpoint into one allocation in the model's order, where each group already lies
end to end, so packing is a view and the weights hold exactly their own bytes. On the CPU a
checkpoint in the model's dtype is mapped: every unpacked weight is a view of the file's pages
(the page cache's memory, not this process's), and so is a group the file holds end to end
(gate, up: files sort tensors by name); the others (q, k, v) are copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sv_weights import ModelConfig
from torch import Tensor


@dataclass
class LayerWeights:
    input_norm: Tensor  # [H]
    qkv: Tensor  # [(Hq + 2*Hkv) * D, H]
    o: Tensor  # [H, Hq * D]
    post_attention_norm: Tensor  # [H]
    gate_up: Tensor  # [2 * I, H]
    down: Tensor  # [H, I]
    qkv_bias: Tensor | None = None  # [(Hq + 2*Hkv) * D], Qwen2
    q_norm: Tensor | None = None  # [D], Qwen3: RMSNorm gain of each query head
    k_norm: Tensor | None = None  # [D], and of each key head


@dataclass
class ModelWeights:
    embed: Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: Tensor  # [H]
    lm_head: Tensor  # [V, H]; the same tensor as `embed` when the embeddings are tied

    @classmethod
    def from_state_dict(
        cls,
        config: ModelConfig,
        state: dict[str, Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> ModelWeights:
        """Pack a Hugging Face-named state dict (already validated against `config`)."""

        def take(name: str) -> Tensor:
            return state[name].to(device=device, dtype=dtype)  # the tensor itself when no change

        architecture = config.architecture
        layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            qkv = _stack_rows([take(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")])
            qkv_bias = None
            if architecture.qkv_bias:
                biases = [take(p + f"self_attn.{n}_proj.bias") for n in ("q", "k", "v")]
                qkv_bias = torch.cat(biases)
            gate_up = _stack_rows([take(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")])
            layers.append(
                LayerWeights(
                    input_norm=take(p + "input_layernorm.weight"),
                    qkv=qkv,
                    o=take(p + "self_attn.o_proj.weight"),
                    post_attention_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=gate_up,
                    down=take(p + "mlp.down_proj.weight"),
                    qkv_bias=qkv_bias,
                    q_norm=take(p + "self_attn.q_norm.weight") if architecture.qk_norm else None,
                    k_norm=take(p + "self_attn.k_norm.weight") if architecture.qk_norm else None,
                )
            )
        embed = take("model.embed_tokens.weight")
        if config.tie_word_embeddings or "lm_head.weight" not in state:
            lm_head = embed
        else:
            lm_head = take("lm_head.weight")
        return cls(embed, layers, take("model.norm.weight"), lm_head)

    def tensors(self) -> list[Tensor]:
        """Every weight tensor once (a tied LM head is the embedding)."""
        tensors = [self.embed, self.final_norm]
        tensors += [t for layer in self.layers for t in vars(layer).values() if t is not None]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        return tensors

    def weight_bytes(self) -> int:
        """The weights' own size: the bytes of their tensors."""
        return sum(t.nbytes for t in self.tensors())

    def storage_bytes(self) -> int:
        """The memory the weights keep alive: the bytes of the distinct storages their tensors
        view (a view of a larger buffer keeps all of it)."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in self.tensors()}
        return sum(storage.nbytes() for storage in storages.values())


def _stack_rows(parts: list[Tensor]) -> Tensor:
    """The 2-D `parts` stacked by rows. A view of them when they already lie end to end in one
    storage (as the copying loader places each group); otherwise a new tensor, and the parts'
    memory is then the caller's to drop."""
    first = parts[0]
    storage = first.untyped_storage().data_ptr()
    end = first.data_ptr()
    for part in parts:
        if not (
            part.dim() == 2
            and part.shape[1] == first.shape[1]
            and part.is_contiguous()
            and part.untyped_storage().data_ptr() == storage
            and part.data_ptr() == end
        ):
            return torch.cat(parts)
        end += part.nbytes
    rows = sum(part.shape[0] for part in parts)
    return first.as_strided((rows, first.shape[1]), (first.shape[1], 1))
