"""sv-model: the Llama model (config-driven) and the model runner (prefill, paged decode, sampling)."""

from sv_model.llama import AttentionMetadata, KVCache, LlamaModel
from sv_model.runner import ModelRunner, PendingTokens, SamplingRows, StepInputs
from sv_model.weights import LayerWeights, LlamaWeights

__all__ = [
    "AttentionMetadata",
    "KVCache",
    "LayerWeights",
    "LlamaModel",
    "LlamaWeights",
    "ModelRunner",
    "PendingTokens",
    "SamplingRows",
    "StepInputs",
]
