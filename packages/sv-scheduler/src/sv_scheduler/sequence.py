"""A request while the scheduler holds it: its tokens, pages, table row and progress."""

from __future__ import annotations

import enum

from sv_kvcache import BlockTable, PagePool

from .request import FinishReason, Request
from .speculation import DraftState


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued (or preempted, back at the front of the queue)
    RUNNING = "running"  # admitted: holds a table row, credits and pages
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

    token_ids holds real ids only. While a step is advanced and not resolved, each sequence
    that step samples has one token more than token_ids shows: `num_pending` is 1 and
    `num_tokens` counts it (its value is still on the GPU; see `Scheduler.advance`).

    A decoder advances by 1 + accepted tokens per step: `draft` holds the tokens the step being
    planned or run verifies after the newest one (empty for a plain decode; see speculation.py),
    `drafter` its prompt-lookup state when speculation is on.

    `due_step` is the step after which the scheduler must look at a decoder again: when its next
    token needs a new page, or when it reaches its length limit. A plain decode advances exactly
    one token, so that step is known in advance and the step loop need not check each sequence
    every step (see `Scheduler._file_due`); a step that verifies a draft files it again once the
    accepted count is known.
    """

    __slots__ = (
        "admit_index",
        "changed_at_step",
        "computing_key",
        "credits",
        "decoding",
        "draft",
        "drafter",
        "due_step",
        "finish_len",
        "finish_reason",
        "ignore_eos",
        "max_new_tokens",
        "num_cached_tokens",
        "num_computed_at_preemption",
        "num_pending",
        "num_preemptions",
        "num_prompt_tokens",
        "prefilled_tokens",
        "prompt_cached_tokens",
        "request_id",
        "reuse_cached_prefix",
        "status",
        "stop_ids",
        "table",
        "table_row",
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
    ) -> None:
        self.request_id = request.request_id
        self.token_ids: list[int] = list(request.prompt_ids)
        self.num_pending = 0  # sampled, counted, value not yet known (0 or 1)
        self.num_prompt_tokens = len(self.token_ids)
        self.max_new_tokens = max_new_tokens  # already clamped to the context limit
        self.ignore_eos = request.ignore_eos
        self.reuse_cached_prefix = request.reuse_cached_prefix
        self.stop_ids: frozenset[int] = frozenset() if request.ignore_eos else request.stop_ids
        self.credits = credits
        self.finish_len = self.num_prompt_tokens + max_new_tokens
        self.table = BlockTable(pool)
        self.table_row = -1  # in [0, max_num_seqs) while running
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.decoding = False
        self.draft: tuple[int, ...] = ()
        self.drafter: DraftState | None = None
        self.due_step = -1
        self.prefilled_tokens = 0  # tokens with KV written, counted in the prefill phase only
        self.num_cached_tokens = 0  # tokens its table took from the prefix cache (this admission)
        self.prompt_cached_tokens = 0  # prompt tokens the cache served at its first admission
        self.admit_index = -1  # order of first admission
        self.changed_at_step = -1
        # while prefilling: the prefix-cache key of the first page it computes itself, if
        # requests arriving behind it may wait for that page (see Scheduler._admit)
        self.computing_key: int | None = None
        self.num_preemptions = 0
        self.num_computed_at_preemption = 0  # KV computed when last preempted (recompute stat)
        self.waited = False

    @property
    def block_table(self) -> list[int]:
        """Physical page ids, in position order (the engine copies this row to the GPU)."""
        return self.table.pages

    @property
    def num_tokens(self) -> int:
        """Prompt plus sampled tokens, the pending one included."""
        return len(self.token_ids) + self.num_pending

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is in the cache. In the decode phase that is every token but the newest
        one, derived rather than counted so the step loop does not update it 256 times a step."""
        if self.decoding:
            return len(self.token_ids) + self.num_pending - 1
        return self.prefilled_tokens

    @property
    def output_ids(self) -> list[int]:
        """The tokens sampled so far whose values are known (a copy)."""
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        """Tokens sampled so far, the pending one included."""
        return len(self.token_ids) + self.num_pending - self.num_prompt_tokens

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, table_row={self.table_row}, "
            f"tokens={self.num_tokens} (prompt {self.num_prompt_tokens}), "
            f"computed={self.num_computed_tokens}, pages={self.table.pages})"
        )
