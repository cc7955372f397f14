"""A request while the scheduler holds it: its tokens, pages, slot and progress."""

from __future__ import annotations

import enum

from sv_kvcache import BlockTable, PagePool

from .request import FinishReason, Request

# The value a sampled token has in `Sequence.token_ids` between `Scheduler.advance` and
# `Scheduler.resolve`: counted, not yet known (still on the GPU). Never a real token id.
PENDING_TOKEN = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued (or preempted, back at the front of the queue)
    RUNNING = "running"  # admitted: holds a slot, credits and pages
    FINISHED = "finished"  # done; finish_reason says why ("stop", "length", "cancelled")


class Sequence:
    """One request inside the scheduler.

    token_ids holds the prompt followed by every token sampled so far. A running sequence is in
    one of two phases:

    - prefill: `num_computed_tokens < len(token_ids)`; the scheduler feeds it chunks of
      token_ids, and the chunk that reaches the end samples the first new token. A preempted
      sequence that resumes prefills its prompt *and* its output so far (recompute).
    - decode (`decoding` is True): every token but the newest has its KV in the cache, so
      `num_computed_tokens == len(token_ids) - 1`; each step feeds the newest token.

    While a step is advanced and not resolved, the newest entry of token_ids of each sequence
    that step samples is PENDING_TOKEN (see `Scheduler.advance`).

    `due_step` is the step after which the scheduler must look at a decoder again: when its next
    token needs a new page, or when it reaches its length limit. Every decoder advances exactly one
    token per step, so that step is known in advance and the step loop need not check each
    sequence every step (see `Scheduler._file_due`).
    """

    __slots__ = (
        "admit_index",
        "arrival_index",
        "changed_at_step",
        "credits",
        "decoding",
        "due_step",
        "finish_len",
        "finish_reason",
        "ignore_eos",
        "max_new_tokens",
        "num_cached_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "prefilled_tokens",
        "request_id",
        "slot",
        "status",
        "stop_ids",
        "table",
        "token_ids",
        "waited",
    )

    def __init__(
        self,
        request: Request,
        *,
        max_new_tokens: int,
        credits: int,
        pool: PagePool,
        arrival_index: int,
    ) -> None:
        self.request_id = request.request_id
        self.token_ids: list[int] = list(request.prompt_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.max_new_tokens = max_new_tokens  # already clamped to the context limit
        self.ignore_eos = request.ignore_eos
        self.stop_ids: frozenset[int] = frozenset() if request.ignore_eos else request.stop_ids
        self.credits = credits
        self.finish_len = self.num_prompt_tokens + max_new_tokens
        self.table = BlockTable(pool)
        self.slot = -1  # in [0, max_num_seqs) while running
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.decoding = False
        self.due_step = -1
        self.prefilled_tokens = 0  # tokens with KV written, counted in the prefill phase only
        self.num_cached_tokens = 0
        self.arrival_index = arrival_index  # order of Scheduler.add
        self.admit_index = -1  # order of first admission
        self.changed_at_step = -1
        self.num_preemptions = 0
        self.waited = False

    @property
    def block_table(self) -> list[int]:
        """Physical page ids, in position order (the engine copies this row to the GPU)."""
        return self.table.pages

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache. In the decode phase that is every token but the newest
        one, derived rather than counted so the step loop does not update it 256 times a step."""
        if self.decoding:
            return len(self.token_ids) - 1
        return self.prefilled_tokens

    @property
    def output_ids(self) -> list[int]:
        """The tokens sampled so far (a copy)."""
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, slot={self.slot}, "
            f"tokens={len(self.token_ids)} (prompt {self.num_prompt_tokens}), "
            f"computed={self.num_computed_tokens}, pages={self.table.pages})"
        )
