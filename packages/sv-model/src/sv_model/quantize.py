"""Quantizing a model's matrices at load (`--quantization fp8|int8`).

Every linear matrix (q/k/v, o, gate/up, down and the LM head) that is not quantized already
becomes `sv_kernels.quantized.quantize(matrix, kind)`: 8-bit values with one FP32 scale per
row. A tied LM head is the embedding matrix, so the embedding then gathers its rows from the
quantized matrix too (one row per token, dequantized): at Llama 3.2 1B shapes that matrix is
a fifth of the bytes a decode step reads. Norms stay as they are. Matrices a pre-quantized
checkpoint brought (FP8) are kept as they came when they are of `kind`, and quantized again
from the values they stand for when they are not (`--quantization int8` on an FP8 checkpoint:
every matrix int8).

`dequantize_weights` goes the other way, for the CPU, which has no FP8 kernel: there an FP8
matrix would be dequantized by the reference at every call (39 ms a matrix of the default
model, against its 1 ms matmul); dequantized once at load it gives the same values.
"""

from __future__ import annotations

from dataclasses import replace

from sv_kernels.quantized import LinearWeight, QuantizedWeight, QuantKind, dequantize, quantize
from torch import Tensor

from sv_model.weights import LayerWeights, ModelWeights


def quantize_weights(weights: ModelWeights, kind: QuantKind) -> ModelWeights:
    """`weights` with every plain matrix quantized to `kind`; norms copied into tensors of
    their own, so that nothing keeps the loader's buffer of unquantized weights alive once the
    caller drops `weights` (on CUDA, call `torch.cuda.empty_cache()` then, so that the KV pool,
    sized from the device's free memory, gets the freed bytes)."""

    def q(w: LinearWeight) -> LinearWeight:
        if isinstance(w, QuantizedWeight):
            return w if w.kind == kind else quantize(dequantize(w), kind)
        return quantize(w, kind)

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
    return ModelWeights(embed, layers, own(weights.final_norm), lm_head, weights.kv_scales)


def dequantize_weights(weights: ModelWeights) -> ModelWeights:
    """`weights` with every quantized matrix replaced by the plain matrix it stands for
    (`dequantize`, in the dtype it stands in for); the rest as it is."""

    def plain(w: LinearWeight) -> LinearWeight:
        return dequantize(w) if isinstance(w, QuantizedWeight) else w

    layers = [
        replace(layer, qkv=plain(layer.qkv), o=plain(layer.o), gate_up=plain(layer.gate_up),
                down=plain(layer.down))
        for layer in weights.layers
    ]  # fmt: skip
    lm_head = plain(weights.lm_head)
    embed = lm_head if weights.lm_head is weights.embed else plain(weights.embed)
    return ModelWeights(embed, layers, weights.final_norm, lm_head, weights.kv_scales)
