"""sv-model: the Llama model (config-driven) and the model runner (prefill, paged decode, sampling)."""

from sv_model.decoder import AttentionMetadata, DecoderModel, KVCache
from sv_model.linear_plans import LayerPlans, LinearPlans
from sv_model.pending_tokens import Logprobs, PendingTokens
from sv_model.quantize import dequantize_weights, quantize_weights
from sv_model.runner import ModelRunner
from sv_model.step import LogitControls, SamplingRows, StepInputs, TokenBitmask
from sv_model.weights import LayerWeights, ModelWeights

__all__ = [
    "AttentionMetadata",
    "DecoderModel",
    "KVCache",
    "LayerPlans",
    "LayerWeights",
    "LinearPlans",
    "LogitControls",
    "Logprobs",
    "ModelRunner",
    "ModelWeights",
    "PendingTokens",
    "SamplingRows",
    "StepInputs",
    "TokenBitmask",
    "dequantize_weights",
    "quantize_weights",
]
