"""sv-model: the Llama model (config-driven) and the model runner (prefill, paged decode, sampling)."""

from sv_model.linear_plans import LayerPlans, LinearPlans
from sv_model.llama import AttentionMetadata, KVCache, LlamaModel
from sv_model.pending_tokens import PendingTokens
from sv_model.quantize import quantize_weights
from sv_model.runner import ModelRunner
from sv_model.step import SamplingRows, StepInputs
from sv_model.weights import LayerWeights, LlamaWeights

__all__ = [
    "AttentionMetadata",
    "KVCache",
    "LayerPlans",
    "LayerWeights",
    "LinearPlans",
    "LlamaModel",
    "LlamaWeights",
    "ModelRunner",
    "PendingTokens",
    "SamplingRows",
    "StepInputs",
    "quantize_weights",
]
