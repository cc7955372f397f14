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

A matrix may be quantized (`sv_kernels.quantized.QuantizedWeight`: 8-bit values and one FP32
scale per row): a pre-quantized checkpoint's FP8 matrices come in so (their `weight_scale`
beside them), and `sv_model.quantize.quantize_weights` turns the others into FP8 or int8 at
load. A packed group of quantized matrices stacks their values and their scales.

A checkpoint with a calibrated FP8 KV cache also brings each layer's K and V cache scales
(`kv_scales`), which an FP8 KV pool divides K and V by (`sv_model.KVCache`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sv_kernels.quantized import LinearWeight, QuantizedWeight
from sv_weights import ModelConfig, WeightsError
from sv_weights.quantization import kv_scale_name
from torch import Tensor

# The suffix of a pre-quantized matrix's scales (compressed-tensors): "...q_proj.weight_scale".
SCALE_SUFFIX = "_scale"


@dataclass
class LayerWeights:
    input_norm: Tensor  # [H]
    qkv: LinearWeight  # [(Hq + 2*Hkv) * D, H]
    o: LinearWeight  # [H, Hq * D]
    post_attention_norm: Tensor  # [H]
    gate_up: LinearWeight  # [2 * I, H]
    down: LinearWeight  # [H, I]
    qkv_bias: Tensor | None = None  # [(Hq + 2*Hkv) * D], Qwen2
    q_norm: Tensor | None = None  # [D], Qwen3: RMSNorm gain of each query head
    k_norm: Tensor | None = None  # [D], and of each key head


@dataclass
class ModelWeights:
    embed: LinearWeight  # [V, H]; quantized only as a tied, quantized LM head
    layers: list[LayerWeights]
    final_norm: Tensor  # [H]
    lm_head: LinearWeight  # [V, H]; the same object as `embed` when the embeddings are tied
    # [layers, 2] FP32: each layer's K and V cache scale from a checkpoint with a calibrated
    # FP8 KV cache (the same for every KV head, so on every tensor-parallel rank); None: 1.
    kv_scales: Tensor | None = None

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

        def matrix(name: str) -> LinearWeight:
            """A matrix; quantized when the checkpoint holds its scales (validated by
            sv_weights: FP8 values, FP32/BF16 scales per row or per matrix)."""
            scale = state.get(name + SCALE_SUFFIX)
            if scale is None:
                return take(name)
            data = state[name].to(device=device)
            rows = data.shape[0]
            per_row = scale.to(device=device, dtype=torch.float32).reshape(-1).expand(rows)
            return QuantizedWeight(data, per_row.contiguous(), "fp8", dtype)

        architecture = config.architecture
        layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            qkv = _stack_rows([matrix(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")])
            qkv_bias = None
            if architecture.qkv_bias:
                biases = [take(p + f"self_attn.{n}_proj.bias") for n in ("q", "k", "v")]
                qkv_bias = torch.cat(biases)
            gate_up = _stack_rows([matrix(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")])
            layers.append(
                LayerWeights(
                    input_norm=take(p + "input_layernorm.weight"),
                    qkv=qkv,
                    o=matrix(p + "self_attn.o_proj.weight"),
                    post_attention_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=gate_up,
                    down=matrix(p + "mlp.down_proj.weight"),
                    qkv_bias=qkv_bias,
                    q_norm=take(p + "self_attn.q_norm.weight") if architecture.qk_norm else None,
                    k_norm=take(p + "self_attn.k_norm.weight") if architecture.qk_norm else None,
                )
            )
        embed = take("model.embed_tokens.weight")
        lm_head: LinearWeight
        if config.tie_word_embeddings or "lm_head.weight" not in state:
            lm_head = embed
        else:
            lm_head = matrix("lm_head.weight")
        kv_scales = None
        if kv_scale_name(0, "k_scale") in state:  # in every layer or none (sv_weights checks)
            kv_scales = torch.stack(
                [
                    state[kv_scale_name(i, which)]
                    .to(device=device, dtype=torch.float32)
                    .reshape(())
                    for i in range(config.num_hidden_layers)
                    for which in ("k_scale", "v_scale")
                ]
            ).view(config.num_hidden_layers, 2)
        return cls(embed, layers, take("model.norm.weight"), lm_head, kv_scales)

    def tensors(self) -> list[Tensor]:
        """Every weight tensor once (a tied LM head is the embedding; a quantized matrix is
        its values and its scales)."""
        weights: list[LinearWeight] = [self.embed, self.final_norm]
        weights += [t for layer in self.layers for t in vars(layer).values() if t is not None]
        if self.lm_head is not self.embed:
            weights.append(self.lm_head)
        return [t for w in weights for t in _parts(w)]

    def weight_bytes(self) -> int:
        """The weights' own size: the bytes of their tensors."""
        return sum(t.nbytes for t in self.tensors())

    def storage_bytes(self) -> int:
        """The memory the weights keep alive: the bytes of the distinct storages their tensors
        view (a view of a larger buffer keeps all of it)."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in self.tensors()}
        return sum(storage.nbytes() for storage in storages.values())


def _parts(weight: LinearWeight) -> tuple[Tensor, ...]:
    return weight.tensors() if isinstance(weight, QuantizedWeight) else (weight,)


def _stack_rows(parts: list[LinearWeight]) -> LinearWeight:
    """The 2-D `parts` stacked by rows (quantized ones: values and scales; all of a group are
    quantized or none is, as the checkpoint validation guarantees)."""
    quantized = [part for part in parts if isinstance(part, QuantizedWeight)]
    plain = [part for part in parts if isinstance(part, Tensor)]
    if quantized and plain:
        raise WeightsError("a packed group (q/k/v or gate/up) mixes quantized and plain matrices")
    if quantized:
        data = _stack_tensors([part.data for part in quantized])
        scale = torch.cat([part.scale for part in quantized])
        return QuantizedWeight(data, scale, quantized[0].kind, quantized[0].dtype)
    return _stack_tensors(plain)


def _stack_tensors(parts: list[Tensor]) -> Tensor:
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
