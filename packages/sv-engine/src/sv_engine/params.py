"""What a caller asks for (`SamplingParams`) and what it gets back (`Completion`, `StreamEvent`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from sv_scheduler import FinishReason, RequestId

from sv_engine.errors import EngineError
from sv_engine.grammar import Grammar

MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs (sv_kernels.ops has it too)
MAX_PENALTY = 2.0  # frequency_penalty and presence_penalty, in [-MAX_PENALTY, MAX_PENALTY]
MAX_REPETITION_PENALTY = 1e30  # and 1 / it, the least
MAX_BAD_WORDS = 128  # words per request, as vLLM's MAX_NUM_BAD_WORDS
# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS); logits are divided by the
# temperature in FP32, and FP32_MAX is the largest value a step's FP32 inputs hold.
GREEDY_BELOW = 1e-5
FP32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token, and when to stop.

    temperature: 0 (the default) is greedy; otherwise logits are divided by it before sampling.
                 Below 1e-5 it is greedy too, as in vLLM (kept as 0.0): dividing by less
                 would leave FP32's range, and the draw is the most likely token anyway.
    top_k:       keep only the k most likely tokens (0 = off).
    top_p:       keep the smallest set of most likely tokens whose mass reaches p, and every
                 token as likely as the least likely one kept (ties are kept whole, where
                 transformers and vLLM cut them in sort order) (1.0 = off).
    seed:        makes sampling reproducible per request; None draws one. Any int: the
                 sampler's state is 32 bits (see `sampler_seed`).
    ignore_eos:  never stop at the model's stop tokens (benchmarks: always generate max_new_tokens).
    stop_token_ids: more ids to stop at, beside the model's (kept under ignore_eos, as vLLM's);
                 like those, the stop token ends the output and its text is not shown. A
                 list, tuple or set (vLLM takes a list) is kept as a frozenset; an id past
                 the model's vocabulary is refused at `add_request`, as logit_bias's are.
    n:           how many choices to generate for the prompt (`Engine.add_choices`): each is a
                 request of its own with its own seed stream; they share the prompt's full
                 pages through the prefix cache.
    logprobs:    None: off; K in 0..20: each output token's log-probability and its top K
                 alternatives (of the raw logits, before temperature or filters), on each
                 StreamEvent and in the Completion.
    prompt_logprobs: None: off; K in 0..20: the same for every prompt token but the first, with
                 its rank (what an evaluation harness scores; the prompt is computed in full,
                 not taken from the prefix cache).

    Logit processing, in vLLM's order and semantics (each off by default):
    allowed_token_ids: None, or the only token ids that may be generated (every other logit
                 is -inf; a list, tuple or set is kept as a frozenset, not empty). The stop
                 tokens are no exception: leave them out and only the length limit stops.
    bad_words:   words never to generate (vLLM's): each is tokenized as written (leading
                 whitespace dropped) and with a leading space (kept when that starts with
                 another token and is as long; see sv_engine.bad_words), and a word's last
                 token is banned wherever the output so far ends with its other tokens (a
                 one-token word: always). Only output tokens count, not the prompt. A list or
                 tuple of non-blank strings, at most 128; kept as a tuple.
    logit_bias:  token id -> value added to its logit (OpenAI's: -100 bans, 100 all but forces;
                 any value FP32 holds here); kept as a copy of its own.
    min_tokens:  the stop tokens (the model's unless ignore_eos, and stop_token_ids) are banned
                 until this many tokens have been generated.
    repetition_penalty: in [1e-30, 1e30]; a token already in the prompt or the output has a
                 positive logit divided by it, a negative one multiplied (1 = off).
    frequency_penalty, presence_penalty: in [-2, 2]; subtract count * frequency + (count > 0)
                 * presence from each token's logit, count = its occurrences in the output so
                 far (0 = off).
    min_p:       in [0, 1]; drop tokens less likely than min_p times the most likely one, at the
                 sampling temperature (0 = off; no effect on greedy rows).
    skip_special_tokens: leave special tokens (other than the stop token, never shown) out of
                 the text, as vLLM does by default.
    grammar:     constrain the output to a JSON schema, regex, choice or EBNF grammar
                 (sv_engine.grammar); its end stops the request, ignore_eos or not.
    grammar_after_token: with a grammar, a token id: the grammar binds only the tokens after
                 the first generated one of this id, from its initial state (a reasoning
                 model's `</think>`: the thinking before it is free text); None: from the
                 first token.
    grammar_wait_opener: with grammar_after_token, a token id (a reasoning model's `<think>`):
                 the grammar waits only if the first generated token is this one; any other
                 first token is the grammar's (the first token may be this one or one the
                 grammar allows). None: the grammar waits from the first token.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    allowed_token_ids: frozenset[int] | None = None
    bad_words: tuple[str, ...] = ()
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_p: float = 0.0
    skip_special_tokens: bool = True
    grammar: Grammar | None = None
    grammar_after_token: int | None = None
    grammar_wait_opener: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise EngineError.bad_field(
                "max_new_tokens", f"must be an integer, got {self.max_new_tokens!r}"
            )
        if self.max_new_tokens < 1:
            raise EngineError.bad_field(
                "max_new_tokens", f"must be at least 1, got {self.max_new_tokens}"
            )
        if not _is_finite(self.temperature):
            raise EngineError.bad_field(
                "temperature", f"must be a finite number, got {self.temperature!r}"
            )
        if not 0 <= self.temperature <= FP32_MAX:
            raise EngineError.bad_field(
                "temperature", f"must be in [0, {FP32_MAX:.4g}], got {self.temperature}"
            )
        if self.temperature < GREEDY_BELOW:
            object.__setattr__(self, "temperature", 0.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise EngineError.bad_field(
                "top_k", f"must be a non-negative integer (0 = off), got {self.top_k!r}"
            )
        if not (_is_finite(self.top_p) and 0 < self.top_p <= 1):
            raise EngineError.bad_field("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise EngineError.bad_field("seed", f"must be an integer or None, got {self.seed!r}")
        if isinstance(self.stop_token_ids, list | tuple | set):  # vLLM's is a list
            object.__setattr__(self, "stop_token_ids", frozenset(self.stop_token_ids))
        if not isinstance(self.stop_token_ids, frozenset) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise EngineError.bad_field(
                "stop_token_ids", f"must be a frozenset of token ids, got {self.stop_token_ids!r}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (
                isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOGPROBS
            ):
                raise EngineError.bad_field(
                    name, f"must be None or in 0..{MAX_LOGPROBS}, got {k!r}"
                )
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise EngineError.bad_field(
                "n", f"must be an integer from 1 to {MAX_N}, got {self.n!r}"
            )
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise EngineError.bad_field(
                "grammar", f"must be a Grammar or None, got {self.grammar!r}"
            )
        self._check_grammar_wait()
        self._check_logit_processing()

    def _check_grammar_wait(self) -> None:
        for name in ("grammar_after_token", "grammar_wait_opener"):
            token = getattr(self, name)
            if token is not None and not (_is_int(token) and token >= 0):
                raise EngineError.bad_field(name, f"must be a token id or None, got {token!r}")
        if self.grammar_after_token is not None and self.grammar is None:
            raise EngineError("grammar_after_token needs a grammar to start after it")
        if self.grammar_wait_opener is not None and self.grammar_after_token is None:
            raise EngineError("grammar_wait_opener needs a grammar_after_token to wait for")

    def _check_logit_processing(self) -> None:
        self._check_allowed_token_ids()
        self._check_bad_words()
        if isinstance(self.logit_bias, Mapping):
            # A copy of its own: the steps read it while the request runs, and a caller's dict
            # changed after the check (reused for the next request) reached them unchecked.
            # (A dict, not a read-only view: SamplingParams stays picklable and deep-copyable.)
            object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        if not isinstance(self.logit_bias, Mapping) or not all(
            _is_int(t) and t >= 0 and _is_finite(v) and abs(v) <= FP32_MAX
            for t, v in self.logit_bias.items()
        ):
            raise EngineError.bad_field(
                "logit_bias",
                f"must map token ids to numbers FP32 holds (|value| <= {FP32_MAX:.4g}), "
                f"got {self.logit_bias!r}",
            )
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_new_tokens:
            raise EngineError.bad_field(
                "min_tokens",
                f"must be an integer from 0 to the output-token limit ({self.max_new_tokens}), "
                f"got {self.min_tokens!r}",
            )
        r = self.repetition_penalty
        # Past these bounds a logit multiplied or divided by it leaves FP32's range (1e-38
        # turned every logit of the default model into the same token).
        if not (_is_finite(r) and 1 / MAX_REPETITION_PENALTY <= r <= MAX_REPETITION_PENALTY):
            raise EngineError.bad_field(
                "repetition_penalty", f"must be in [1e-30, 1e30], got {r!r}"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            # OpenAI's and vLLM's range; past FP32's range a penalty turns logits into NaN.
            value = getattr(self, name)
            if not (_is_finite(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
                raise EngineError.bad_field(
                    name, f"must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value!r}"
                )
        if not (_is_finite(self.min_p) and 0 <= self.min_p <= 1):
            raise EngineError.bad_field("min_p", f"must be in [0, 1], got {self.min_p!r}")
        if not isinstance(self.ignore_eos, bool):
            raise EngineError.bad_field(
                "ignore_eos", f"must be true or false, got {self.ignore_eos!r}"
            )
        if not isinstance(self.skip_special_tokens, bool):
            raise EngineError.bad_field(
                "skip_special_tokens", f"must be true or false, got {self.skip_special_tokens!r}"
            )

    def _check_allowed_token_ids(self) -> None:
        if isinstance(self.allowed_token_ids, list | tuple | set):  # vLLM's is a list
            object.__setattr__(self, "allowed_token_ids", frozenset(self.allowed_token_ids))
        allowed = self.allowed_token_ids
        if allowed is None:
            return
        if not isinstance(allowed, frozenset) or not all(_is_int(t) and t >= 0 for t in allowed):
            raise EngineError.bad_field(
                "allowed_token_ids", f"must be None or a set of token ids, got {allowed!r}"
            )
        if not allowed:  # nothing could be generated
            raise EngineError.bad_field("allowed_token_ids", "must not be empty")

    def _check_bad_words(self) -> None:
        if isinstance(self.bad_words, list):  # vLLM's is a list
            object.__setattr__(self, "bad_words", tuple(self.bad_words))
        words = self.bad_words
        if not isinstance(words, tuple) or not all(isinstance(w, str) for w in words):
            raise EngineError.bad_field("bad_words", f"must be a list of strings, got {words!r}")
        if any(not w.strip() for w in words):  # it would tokenize to nothing
            raise EngineError.bad_field("bad_words", "must not hold an empty or blank string")
        if len(words) > MAX_BAD_WORDS:
            raise EngineError.bad_field(
                "bad_words", f"must hold at most {MAX_BAD_WORDS} words, got {len(words)}"
            )

    @property
    def uses_token_counts(self) -> bool:
        """Whether a penalty reads the tokens seen so far."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    @property
    def processes_logits(self) -> bool:
        """Whether the sampler draws from processed logits, not the raw ones."""
        return (
            self.uses_token_counts
            or self.allowed_token_ids is not None
            or bool(self.bad_words)
            or bool(self.logit_bias)
            or self.min_tokens > 0
            or self.min_p > 0
        )

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


def sampler_seed(seed: int) -> int:
    """The 32-bit seed the sampler hashes (`sv_kernels.reference.uniform_noise`) for a request's
    seed, which may be any Python int (64-bit in vLLM and OpenAI). Below 2^32 a seed is its own;
    the bits above are mixed into the low 32 rather than dropped, so that seeds a multiple of
    2^32 apart (1 and 2^32 + 1) draw differently. A negative seed is read as 64-bit two's
    complement. (With 32 bits of state, some pairs of seeds still share a stream.)"""
    bits = seed % 2**64
    low, high = bits & 0xFFFFFFFF, bits >> 32
    return low ^ (_mix(high, 0) & 0xFFFFFFFF) if high else low


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class TokenLogprob:
    """One token's log-probability under the model (FP32 log-softmax of its raw logits), and
    the `top` alternatives at its position: (token id, log-probability), most likely first.
    `rank` (a prompt token's, with SamplingParams.prompt_logprobs; else None): how many tokens
    at its position are at least as likely as it, as vLLM's prompt logprobs rank it (the
    most likely is 1).

    The engine makes one per generated token and leaves its alternatives in the step's arrays
    (`of_row`) until `top` is first read: building 20 tuples per token on every step cost more
    host time than the rest of a 256-row step (on the CPU, BENCHMARKS.md), and most tokens'
    alternatives are read once, if ever. Reading `top` from two threads at once is safe (both
    build the same tuple). Equality, hash and repr are those of the (token_id, logprob, top)
    values (a rank is what they imply, where it is known)."""

    __slots__ = ("_k", "_row", "_rows", "_top", "logprob", "rank", "token_id")

    token_id: int
    logprob: float
    rank: int | None

    def __init__(
        self,
        token_id: int,
        logprob: float,
        top: tuple[tuple[int, float], ...],
        rank: int | None = None,
    ) -> None:
        self.token_id = token_id
        self.logprob = logprob
        self.rank = rank
        self._top: tuple[tuple[int, float], ...] | None = top
        self._rows: TopRows | None = None
        self._row = self._k = 0

    @classmethod
    def of_row(
        cls,
        token_id: int,
        logprob: float,
        rows: TopRows,
        row: int,
        k: int,
        rank: int | None = None,
    ) -> TokenLogprob:
        """The token whose top `k` alternatives are row `row` of `rows`, read when needed."""
        made = cls.__new__(cls)
        made.token_id = token_id
        made.logprob = logprob
        made.rank = rank
        made._top = None
        made._rows, made._row, made._k = rows, row, k
        return made

    @property
    def top(self) -> tuple[tuple[int, float], ...]:
        if self._top is None:
            assert self._rows is not None
            ids = self._rows.top_ids[self._row, : self._k].tolist()
            values = self._rows.top_values[self._row, : self._k].tolist()
            self._top = tuple(zip(ids, values, strict=True))
        return self._top

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenLogprob):
            return NotImplemented
        return (self.token_id, self.logprob, self.top) == (other.token_id, other.logprob, other.top)

    def __hash__(self) -> int:
        return hash((self.token_id, self.logprob, self.top))

    def __repr__(self) -> str:
        return (
            f"TokenLogprob(token_id={self.token_id!r}, logprob={self.logprob!r}, top={self.top!r})"
        )


class TopRows(Protocol):
    """Where a step's alternatives wait (sv_model.Logprobs): [N, K] ids and log-probabilities,
    most likely first."""

    @property
    def top_ids(self) -> np.ndarray: ...

    @property
    def top_values(self) -> np.ndarray: ...


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
    # With SamplingParams.logprobs: one per output id (a sequence that makes each item as it
    # is read, sv_engine.logprobs.OutputLogprobs). With prompt_logprobs: one per prompt id,
    # None for the first (nothing precedes it); a request cancelled before its prefill ended
    # has those of the prompt ids scored by then.
    logprobs: Sequence[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    error: str | None = None  # finish_reason "error": why its output constraint failed


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
    logprob: TokenLogprob | None = None  # with SamplingParams.logprobs, of token_id
    # With SamplingParams.prompt_logprobs, on the request's first event: the prompt's scores
    # (as Completion.prompt_logprobs), there before any stop string can end the request.
    prompt_logprobs: list[TokenLogprob | None] | None = None
