"""What one model step must compute: the scheduler's answer to the engine."""

from __future__ import annotations

from dataclasses import dataclass

from .sequence import Sequence


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
