"""Admission arithmetic: how many pages ("credits") a request may ever need.

A request writes KV for every prompt token and for every output token except the last one (the
last sampled token is returned, never fed back). With the output budget clamped to the context
limit,

    max_new' = min(max_new_tokens, max_model_len - prompt_tokens)
    credits  = ceil((prompt_tokens + max_new' - 1) / page_size)

The conservative policy reserves all of them at admission, so a running request can never run out
of pages: no preemption, no deadlock. Physical pages are still assigned lazily as it grows.
"""

from __future__ import annotations

from .config import SchedulerConfig
from .errors import AdmissionError
from .request import Request


def clamp_max_new_tokens(prompt_tokens: int, max_new_tokens: int, max_model_len: int) -> int:
    """The output budget after the context limit: min(max_new_tokens, max_model_len - prompt)."""
    return min(max_new_tokens, max_model_len - prompt_tokens)


def credits_for(prompt_tokens: int, max_new_tokens: int, page_size: int) -> int:
    """Pages a request may ever write: ceil((prompt + max_new - 1) / page_size)."""
    return -(-(prompt_tokens + max_new_tokens - 1) // page_size)


def check_request(request: Request, config: SchedulerConfig) -> tuple[int, int]:
    """Validate `request` against `config`; returns (max_new', credits) or raises AdmissionError."""
    rid = request.request_id
    prompt = request.prompt_ids
    if len(prompt) == 0:
        raise AdmissionError(f"request {rid!r} rejected: the prompt is empty")
    for i, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise AdmissionError(
                f"request {rid!r} rejected: prompt_ids[{i}] is {token!r}, not a token id (int >= 0)"
            )
    max_new = request.max_new_tokens
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise AdmissionError(
            f"request {rid!r} rejected: max_new_tokens must be an integer >= 1, got {max_new!r}"
        )
    if not isinstance(request.stop_ids, frozenset) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in request.stop_ids
    ):
        raise AdmissionError(f"request {rid!r} rejected: stop_ids must be a frozenset of ints")
    prompt_len = len(prompt)
    if prompt_len >= config.max_model_len:
        raise AdmissionError(
            f"request {rid!r} rejected: the prompt has {prompt_len} tokens but max_model_len is "
            f"{config.max_model_len}, leaving no room for an output token"
        )
    clamped = clamp_max_new_tokens(prompt_len, max_new, config.max_model_len)
    credits = credits_for(prompt_len, clamped, config.page_size)
    if credits > config.num_pages:
        raise AdmissionError(
            f"request {rid!r} rejected: it needs {credits} pages (prompt {prompt_len} + "
            f"max_new_tokens {clamped} - 1 = {prompt_len + clamped - 1} tokens, "
            f"{config.page_size} per page) but the KV-cache pool has only {config.num_pages} pages; "
            f"shorten the prompt or max_new_tokens, or give the KV cache more memory"
        )
    return clamped, credits
