"""sv-engine: tokenizer + scheduler + model runner -> generate / stream."""

from sv_engine.engine import Engine, Prompt
from sv_engine.errors import EngineError
from sv_engine.params import MAX_LOGPROBS, Completion, SamplingParams, StreamEvent, TokenLogprob

__all__ = [
    "MAX_LOGPROBS",
    "Completion",
    "Engine",
    "EngineError",
    "Prompt",
    "SamplingParams",
    "StreamEvent",
    "TokenLogprob",
]
