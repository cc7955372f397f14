"""One step as the engine describes it to the runner: host-side lists, no tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
    logits_at: Sequence[int] | None = None

    @property
    def one_token_each(self) -> bool:
        """Whether every sequence feeds exactly one token (a decode step: graphs can run it)."""
        return len(self.token_ids) == len(self.table_rows) and self.logits_at is None
