"""sv-engine: tokenizer + scheduler + model runner -> generate / stream."""

from sv_engine.engine import Engine, Prompt
from sv_engine.errors import EngineError
from sv_engine.params import Completion, SamplingParams, StreamEvent

__all__ = ["Completion", "Engine", "EngineError", "Prompt", "SamplingParams", "StreamEvent"]
