"""Counters for `sv generate --stats` and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot of the scheduler's counters (`Scheduler.stats` builds a fresh one).

    pool_pages:              pages in the KV-cache pool.
    peak_running:            most sequences running (admitted, not finished) after any schedule().
    largest_decode_batch:    most decodes in one step.
    peak_assigned_pages:     most pages held by sequences at once (shared pages counted once).
    admission_waits:         schedule() calls in which the head of the queue could not start for
                             want of room: its credits (preemptive: its prompt's pages) did not fit,
                             or (static) the running group has not finished. Counted once per call,
                             not per waiting request; a head held back by max_num_seqs or by the
                             step's token budget is not counted.
    waited_requests:         distinct requests that were such a blocked head at least once.
    prefix_cache_hit_tokens: tokens taken from the prefix cache instead of computed, at every
                             admission: a preempted sequence's own pages found again on resuming
                             count too (a request's `num_cached_tokens` is its first admission's).
    preemptions:             sequences sent back to the queue (preemptive policy only).
    recomputed_tokens:       tokens whose KV a preempted sequence had computed and computed again
                             on resuming (those the prefix cache still held are not counted).
    steps:                   completed steps.
    finished_requests:       requests finished by "stop" or "length".
    cancelled_requests:      requests cancelled.
    free_pages:              pages `allocate` could hand out now: free plus cached-but-unheld
                             (the prefix cache gives those back on demand). Equals pool_pages once
                             every request has finished.
    cached_pages:            of free_pages, those still holding prefix-cache KV.
    assigned_pages:          pages held by sequences now.
    free_credits:            credits not reserved by running requests (conservative policy;
                             equals pool_pages under the preemptive policy, which reserves none).
    drafted_tokens:          draft tokens verified (speculation).
    accepted_tokens:         of those, the ones the model accepted.
    verifications:           (sequence, step) pairs that verified a draft: each produced
                             1 + its accepted tokens, so tokens per verify step is
                             1 + accepted_tokens / verifications.
    """

    pool_pages: int
    peak_running: int
    largest_decode_batch: int
    peak_assigned_pages: int
    admission_waits: int
    waited_requests: int
    prefix_cache_hit_tokens: int
    preemptions: int
    recomputed_tokens: int
    steps: int
    finished_requests: int
    cancelled_requests: int
    free_pages: int
    cached_pages: int
    assigned_pages: int
    free_credits: int
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verifications: int = 0
