"""What comes in (`Request`) and what goes out (`FinishedRequest`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

RequestId = str | int

# "rejected" is for the engine, to report a request that `Scheduler.add` refused with
# AdmissionError, and "error" for one whose output constraint failed (its grammar matcher's
# error state); the scheduler itself finishes requests with "stop", "length" or "cancelled".
FinishReason = Literal["stop", "length", "cancelled", "rejected", "error"]


@dataclass(frozen=True, slots=True)
class Request:
    """One generation request, already tokenized.

    stop_ids:   generation stops after any of these ids is sampled (EOS/EOT/EOM from the
                tokenizer); the stop token is part of the output.
    ignore_eos: ignore stop_ids and always generate up to the limit (benchmarks).
    reuse_cached_prefix: start on prefix-cache pages when they match (False: compute every
                prompt token, for a caller that wants the logits of each).
    """

    request_id: RequestId
    prompt_ids: Sequence[int]
    max_new_tokens: int
    stop_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    reuse_cached_prefix: bool = True


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that left the scheduler, with everything it generated.

    num_cached_tokens: prompt tokens taken from the prefix cache instead of computed, at its
    first admission (as vLLM reports them: a resume after preemption may take its own pages,
    output included, from the cache, which says nothing of the prompt's).
    """

    request_id: RequestId
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: FinishReason
    num_cached_tokens: int = 0
