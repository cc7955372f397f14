"""One step as the engine describes it to the runner: host-side lists, no tensors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingRows:
    """Sampling parameters of the rows that get a token this step (one entry per row)."""

    temperature: Sequence[float]
    top_k: Sequence[int]
    top_p: Sequence[float]
    seeds: Sequence[int]
    steps: Sequence[int]

    def all_greedy(self) -> bool:
        return all(t <= 0 for t in self.temperature)

    def any_top_k(self) -> bool:
        """Whether any sampled (non-greedy) row may use top-k (a superset of the kernel's test)."""
        return any(t > 0 and k > 0 for t, k in zip(self.temperature, self.top_k, strict=True))

    def any_top_p(self) -> bool:
        """Whether any sampled row may use top-p (top_p < 1)."""
        return any(t > 0 and p < 1.0 for t, p in zip(self.temperature, self.top_p, strict=True))


@dataclass
class LogitControls:
    """How the logits of the step's choices are processed before sampling (one entry per
    choice, a verify step's draft positions included; off: presence 0, frequency 0,
    repetition 1, min_p 0).

    bias: (row, token id, value added to its logit; -inf bans it): logit_bias, and min_tokens'
    stop ids. allowed: (row, the only token ids it may take, int64): allowed_token_ids, a
    mask (a list of bias entries would name nearly the whole vocabulary every step).
    resets: (table row, prompt ids, output ids known so far, row of the previous launch's
    sampled ids holding one more output token still on the device, or -1): the penalties'
    token counts of that table row start afresh (a sequence new on it).
    pending_bans: (row, token id, row of the previous launch's sampled ids, id): the token is
    banned (-inf) in that row when the sampled id still on the device there is that id (a bad
    word whose tokens before its last end with that token; those known on the host ban through
    `bias`).
    """

    presence: Sequence[float]
    frequency: Sequence[float]
    repetition: Sequence[float]
    min_p: Sequence[float]
    bias: Sequence[tuple[int, int, float]] = ()
    allowed: Sequence[tuple[int, np.ndarray]] = ()
    resets: Sequence[tuple[int, Sequence[int], Sequence[int], int]] = ()
    pending_bans: Sequence[tuple[int, int, int, int]] = ()

    def any_penalty(self) -> bool:
        return any(self.presence) or any(self.frequency) or any(r != 1.0 for r in self.repetition)

    def any_min_p(self) -> bool:
        return any(self.min_p)


@dataclass
class TokenBitmask:
    """Grammar constraints on some of a step's choices: the choice `rows[i]` (an index into the
    step's returned ids: see `StepInputs.logits_at`) may take token t only when bit t % 32 of
    `words[i, t // 32]` is set."""

    rows: Sequence[int]
    words: np.ndarray  # [len(rows), ceil(vocab / 32)] int32


@dataclass
class StepInputs:
    """One step, as the engine describes it (host-side lists).

    Sequence b feeds `query_lens[b]` tokens (its slice of `token_ids` / `positions`, in order)
    and ends the step with `seq_lens[b]` tokens of context. `table_rows[b]` is its table row
    (the row of the device block tables that holds its block table). `sample_rows` lists the b that need a next token, in the order
    the sampled ids are returned; a prompt chunk that does not finish its prompt gets none.

    `logits_at`, when given, names the tokens (indices into token_ids) whose logits choose a
    token, in the order the ids are returned, instead of the last token of each `sample_rows`
    entry: a step that verifies drafts chooses at every draft position too (`sampling` then has
    one entry per index). Only the first len(sample_rows) ids are kept for the next step's
    `feed`; the engine resolves such a step before planning the next, so nothing feeds the rest.
    """

    token_ids: Sequence[int]
    positions: Sequence[int]
    table_rows: Sequence[int]
    query_lens: Sequence[int]
    seq_lens: Sequence[int]
    sample_rows: Sequence[int]
    sampling: SamplingRows | None = None  # None: greedy for every row
    # (index into token_ids, row of the previous launch's sampled ids): tokens whose value is
    # still on the device; their token_ids entries are placeholders.
    feed: Sequence[tuple[int, int]] = ()
    # Whether the sampled tokens' log-probabilities (and the top MAX_LOGPROBS) come back too.
    logprobs: bool = False
    # (prefill row b, offset in its chunk, target ids): the log-probability of each target
    # given the tokens of the chunk up to offset + i (the prompt's own next tokens, for echo).
    prompt_logprobs: Sequence[tuple[int, int, Sequence[int]]] = ()
    controls: LogitControls | None = None  # None: the raw logits are sampled
    # Called once the forward pass is queued, before sampling: the grammar constraints of the
    # rows, computed on the host while the device runs the forward (None: no row constrained).
    token_bitmask: Callable[[], TokenBitmask | None] | None = None
    # A verify step's rows to compute logits for (each sampled row's, then each draft
    # position's); None: each sampled row's last token.
    logits_at: Sequence[int] | None = None
    # A verify step's drafts: (the choice row of the sequence's newest token, its draft), in
    # the order their draft positions' choices follow the first len(sample_rows) ids. Choice
    # j + 1 of such a sequence is made at draft[j], as if draft[:j + 1] had been generated
    # (its penalties count them; see sv_model.draft_rows).
    drafts: Sequence[tuple[int, Sequence[int]]] = ()
