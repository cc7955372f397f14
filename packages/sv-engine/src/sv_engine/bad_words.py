"""vLLM's bad_words: from a request's words to the token ids each step bans.

A word becomes token-id sequences once, when the request is added (`word_ids`). Each step, a
word w_0..w_k bans w_k in a choice whose output so far ends with w_0..w_{k-1} (k = 0: always;
only output tokens count, not the prompt, as vLLM's). With the overlapped step loop the
newest output token may still be on the device when the host builds the next step: a word
whose other tokens match the known ones then bans w_k on the condition that the pending
token is w_{k-1}, which the device checks (sv_model.logit_processing) — no host sync, no
lost step. A verify step's draft position knows every token before it (the drafts are on the
host, and a step that verifies drafts never follows an unresolved one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sv_engine.errors import EngineError

MAX_TOKENS = 1024  # of a request's words, variants included (vLLM's MAX_BAD_WORDS_TOTAL_TOKENS)

# The history of a choice as the host knows it: token ids, None for the one still pending.
History = Sequence[int | None]


def word_ids(
    encode: Callable[[str], list[int]], words: Sequence[str]
) -> tuple[tuple[int, ...], ...]:
    """Each word's token ids as vLLM's `update_from_tokenizer` makes them: the word without
    its leading whitespace, then " " + that, the second kept only when it starts with another
    token than the first and has as many tokens (a word at the start of the text, and the same
    word inside it). `encode` adds no special tokens. At most MAX_TOKENS in all: each step
    reads the output's tail as long as the longest."""
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(encode(word.lstrip()))
        if not plain:
            raise EngineError.bad_field("bad_words", f"{word!r} encodes to no tokens")
        out.append(plain)
        spaced = tuple(encode(" " + word.lstrip()))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    total = sum(len(w) for w in out)
    if total > MAX_TOKENS:
        raise EngineError.bad_field(
            "bad_words", f"must encode to at most {MAX_TOKENS} tokens in all, got {total}"
        )
    return tuple(out)


def bans(words: Sequence[tuple[int, ...]], history: History) -> list[tuple[int, int | None]]:
    """The tokens to ban after `history` (the output so far, or at least its last
    max(len(word)) - 1 tokens; None marks the pending one): (token, None) banned outright,
    (token, t) banned when the pending token turns out to be t."""
    out: list[tuple[int, int | None]] = []
    n = len(history)
    for word in words:
        k = len(word) - 1
        if k > n:  # longer than the output so far and the token to come
            continue
        condition: int | None = None
        for expected, seen in zip(word[:k], history[n - k :], strict=True):
            if seen is None:
                condition = expected
            elif seen != expected:
                break
        else:
            out.append((word[k], condition))
    return out


def history_tail(
    known: Sequence[int], num_prompt: int, reach: int, pending: bool, drafts: Sequence[int]
) -> list[int | None]:
    """The last `reach` tokens of a choice's output: the known output tokens (`known` is the
    prompt then the output, of which the first `num_prompt` are the prompt), the pending one
    (None) if any, then the drafts before the choice."""
    if reach <= 0:
        return []
    start = max(num_prompt, len(known) - reach)
    tail: list[int | None] = list(known[start:])
    if pending:
        tail.append(None)
    tail.extend(drafts)
    return tail[-reach:]
