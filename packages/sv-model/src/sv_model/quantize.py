"""Quantizing a model's matrices at load (`--quantization fp8|int8`).

Every linear matrix (q/k/v, o, gate/up, down and the LM head) that is not quantized already
becomes `sv_kernels.quantized.quantize(matrix, kind)`: 8-bit values with one FP32 scale per
row. A tied LM head is the embedding matrix, so the embedding then gathers its rows from the
quantized matrix too (one row per token, dequantized): at Llama 3.2 1B shapes that matrix is
a fifth of the bytes a decode step reads. Norms stay as they are. Matrices a pre-quantized
checkpoint brought (FP8) are kept as they came.
"""

from __future__ import annotations

from sv_kernels.quantized import LinearWeight, QuantizedWeight, QuantKind, quantize
from torch import Tensor

from sv_model.weights import LayerWeights, ModelWeights


def quantize_weights(weights: ModelWeights, kind: QuantKind) -> ModelWeights:
    """`weights` with every plain matrix quantized to `kind`; norms copied into tensors of
    their own, so that nothing keeps the loader's buffer of unquantized weights alive once the
    caller drops `weights` (on CUDA, call `torch.cuda.empty_cache()` then, so that the KV pool,
    sized from the device's free memory, gets the freed bytes)."""

    def q(w: LinearWeight) -> LinearWeight:
        return w if isinstance(w, QuantizedWeight) else quantize(w, kind)

    def own(t: Tensor) -> Tensor:
        return t.clone()

    def own_optional(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.clone()

    layers = [
        LayerWeights(
            input_norm=own(layer.input_norm),
            qkv=q(layer.qkv),
            o=q(layer.o),
            post_attention_norm=own(layer.post_attention_norm),
            gate_up=q(layer.gate_up),
            down=q(layer.down),
            qkv_bias=own_optional(layer.qkv_bias),
            q_norm=own_optional(layer.q_norm),
            k_norm=own_optional(layer.k_norm),
        )
        for layer in weights.layers
    ]
    lm_head = q(weights.lm_head)
    tied = weights.lm_head is weights.embed
    embed = lm_head if tied else weights.embed
    if isinstance(embed, Tensor) and not tied:
        embed = own(embed)
    return ModelWeights(embed, layers, own(weights.final_norm), lm_head)
