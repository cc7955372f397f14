"""What a caller asks for (`SamplingParams`) and what it gets back (`Completion`, `StreamEvent`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from sv_scheduler import FinishReason, RequestId

from sv_engine.errors import EngineError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token, and when to stop.

    temperature: 0 (the default) is greedy; otherwise logits are divided by it before sampling.
    top_k:       keep only the k most likely tokens (0 = off).
    top_p:       keep the smallest set of most likely tokens whose mass reaches p (1.0 = off).
    seed:        makes sampling reproducible per request; None draws one.
    ignore_eos:  never stop at the model's stop tokens (benchmarks: always generate max_new_tokens).
    stop_token_ids: more ids to stop at, beside the model's (kept under ignore_eos, as vLLM's);
                 like those, the stop token ends the output and its text is not shown.
    n:           how many choices to generate for the prompt (`Engine.add_choices`): each is a
                 request of its own with its own seed stream; they share the prompt's full
                 pages through the prefix cache.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise EngineError(f"max_new_tokens must be an integer, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)):
            raise EngineError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise EngineError(f"temperature must be >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise EngineError(f"top_k must be a non-negative integer (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise EngineError(f"seed must be an integer or None, got {self.seed!r}")
        if not isinstance(self.stop_token_ids, frozenset) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise EngineError(
                f"stop_token_ids must be a frozenset of token ids, got {self.stop_token_ids!r}"
            )

        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise EngineError(f"n must be an integer from 1 to {MAX_N}, got {self.n!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def choices(self) -> list[SamplingParams]:
        """The parameters of each of the n choices, each with n = 1.

        Choice 0 keeps the seed, so n = 1 and the first of n choices are the same draw. Choice
        i > 0 gets a seed of its own, mixed from (seed, i): reproducible, and unlike seed + i
        not another request's stream (seed 0's choice 5 would be seed 5's answer, and a test
        of choices over consecutive seeds fails). Without a seed, every choice draws its own.
        """
        if self.seed is None:
            return [replace(self, n=1) for _ in range(self.n)]
        return [
            replace(self, n=1, seed=self.seed if i == 0 else _mix(self.seed, i))
            for i in range(self.n)
        ]


# As OpenAI's API: at most 128 choices per prompt.
MAX_N = 128


def _mix(seed: int, index: int) -> int:
    """splitmix64 of the pair, as a non-negative 63-bit int."""
    x = (seed + index * 0x9E3779B97F4A7C15) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) >> 1


@dataclass
class Completion:
    """A finished request."""

    request_id: RequestId
    prompt_ids: list[int]
    output_ids: list[int]  # includes the stop token when finish_reason == "stop"
    text: str  # the output without the stop token
    finish_reason: FinishReason
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    time_to_first_token_s: float | None = None
    latency_s: float = 0.0


@dataclass(slots=True)
class StreamEvent:
    """One sampled token of one request, as it is generated.

    text is the newly complete UTF-8 text (may be empty while a multi-byte character is split
    across tokens; never includes the text of a stop token). `finished` is set on the request's
    last event; a request cancelled or finished without a new token gets an event with token_id
    None.
    """

    request_id: RequestId
    token_id: int | None
    text: str
    finished: FinishReason | None = None
    completion: Completion | None = field(default=None, repr=False)
