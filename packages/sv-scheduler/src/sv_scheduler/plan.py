"""What one model step must compute: the scheduler's answer to the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .sequence import Sequence

# Why the head of the queue did not start in a schedule() call. The first three are the
# admission waits that `SchedulerStats.admission_waits` counts; the others hold the head back
# without counting (see SchedulerStats).
WaitReason = Literal[
    "credits",  # conservative: its credits do not fit the credits left
    "pages",  # preemptive: its prompt's pages do not fit the pages available
    "static_group",  # static batching: the running group has not finished
    "max_num_seqs",  # every table row is taken
    "token_budget",  # continuous: this step's token budget is spent
    "shared_prefix",  # another prompt is computing the page it would share
]
COUNTED_WAITS: frozenset[WaitReason] = frozenset({"credits", "pages", "static_group"})


class PrefillChunk:
    """Feed `seq.token_ids[start:end]` at positions start..end-1.

    `samples` is True when the chunk reaches the end of the tokens to prefill: the model's logits
    at position end-1 give the sequence's next token.
    """

    __slots__ = ("end", "samples", "seq", "start")

    def __init__(self, seq: Sequence, start: int, end: int, samples: bool) -> None:
        self.seq = seq
        self.start = start
        self.end = end
        self.samples = samples

    def __repr__(self) -> str:
        return f"PrefillChunk({self.seq.request_id!r}, {self.start}:{self.end}, samples={self.samples})"


@dataclass(slots=True)
class StepPlan:
    """One step. Every sequence here has pages for every position it writes this step.

    prefills:            prompt chunks, oldest admission first.
    decodes:             sequences feeding their newest token at position len(token_ids) - 1,
                         followed by their `draft` (usually empty) at the positions after it.
    sampling:            who gets a sampled token, in the order `complete_step` expects the tokens:
                         the prefill chunks that sample, then the decodes. After those, one more
                         token per draft token: the choices at each decode's draft positions, in
                         the order of `decodes` (see `num_draft_tokens`).
    num_prefill_samples: how many of `sampling` come from prefill chunks (the rest are decodes).
    block_table_changed: sequences whose block table (or table row) changed since the previous plan:
                         newly admitted or resumed, or given a page. Update only these rows.
    preempted:           sequences sent back to the queue by this plan (preemptive policy only).
    num_draft_tokens:    draft tokens fed this step (the sum of the decodes' draft lengths).
    head_wait:           the head of the queue and why it did not start, if it did not.

    The plan is the engine's to read until it calls `resolve` (or `complete_step`) with it.
    """

    step: int
    prefills: list[PrefillChunk]
    decodes: list[Sequence]
    sampling: list[Sequence]
    num_prefill_samples: int
    block_table_changed: list[Sequence]
    preempted: list[Sequence]
    num_draft_tokens: int = 0
    head_wait: tuple[Sequence, WaitReason] | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens fed to the model this step."""
        fed = len(self.decodes) + self.num_draft_tokens
        return fed + sum(chunk.end - chunk.start for chunk in self.prefills)

    @property
    def num_sampled(self) -> int:
        """Tokens the model chooses this step: one per `sampling` entry, one per draft token."""
        return len(self.sampling) + self.num_draft_tokens

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes
