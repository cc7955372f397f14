"""What every handler of the app shares: the engine loop, the metrics, the served model's name
and limits, and the tokenizer threads.

In a module of its own so that the modules app.py imports (the dashboard, prompt preparation,
answer delivery) take a `ServerState` without importing app.py back: no import cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sv_tokenizer import Tokenizer, TokenizerError

from sv_server.engine_loop import EngineLoop
from sv_server.metrics import Metrics
from sv_server.reasoning import ReasoningParser
from sv_server.tool_parsers import ToolCallParser

TOKENIZER_THREADS = 4


@dataclass
class ServerState:
    loop: EngineLoop
    metrics: Metrics
    model_name: str
    max_queue: int
    add_bos: bool
    created: int
    max_request_bytes: int
    read_timeout_s: float
    reasoning: ReasoningParser | None = None  # --reasoning-parser: chat answers' thinking apart
    trust_request_chat_template: bool = False  # take a request's own `chat_template`
    tool_call_parser: ToolCallParser = "llama3_json"  # how the model writes its tool calls
    # Set when shutting down: new generations get 503, and so do bodies still arriving.
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    # Bodies are decoded, checked and tokenized here, off the event loop. Several threads, so
    # that a multi-MiB prompt (seconds of tokenizing) does not hold up every request behind it:
    # they share one GIL, so a small one finishes within a few switch intervals (app.py).
    tokenizer_threads: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(
            TOKENIZER_THREADS, thread_name_prefix="sv-tokenizer"
        )
    )

    def __post_init__(self) -> None:
        engine = self.loop.engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.runner.max_model_len
        self.scheduler_config = engine.scheduler.config  # immutable: safe from this thread
        self.vocab_size = engine.runner.config.vocab_size
        self.longest_token_bytes = _longest_token_bytes(self.tokenizer)


def _longest_token_bytes(tokenizer: Tokenizer) -> int:
    """The most bytes one token stands for (special and added tokens included)."""
    longest = 1
    for token_id in range(tokenizer.vocab_size):
        with contextlib.suppress(TokenizerError):  # an id without a token
            longest = max(longest, len(tokenizer.token_bytes(token_id)))
    return longest
