"""Where a step's choices are, when it verifies drafts: the engine's side of sv_model.draft_rows.

A step returns one choice (sampled id, and log-probabilities when asked) per `plan.sampling`
entry, in order, and then one per draft token: the choices at each drafting decode's draft
positions, decode after decode. A decode with draft d_0..d_{m-1} thus has its choice 0 at its
own row and its choice j + 1 (made once d_0..d_j are generated) at its first draft row + j.
Choice i makes output token `num_output_tokens + i` of its sequence: that index decides its
sampling noise, its min_tokens bans and, with the drafts before it, its penalties.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sv_scheduler import RequestId, Sequence, StepPlan


@dataclass(frozen=True, slots=True)
class DraftChoices:
    """One drafting decode of a step: the row of its choice 0 and of its choice 1."""

    head: int
    first: int
    draft: tuple[int, ...]

    def row(self, i: int) -> int:
        """The row of choice i (0..len(draft))."""
        return self.head if i == 0 else self.first + i - 1


def drafting(plan: StepPlan) -> dict[int, DraftChoices]:
    """id(seq) -> its choices, for each decode of `plan` with a draft (read before resolve,
    which clears the drafts)."""
    if not plan.num_draft_tokens:
        return {}
    out = {}
    first = len(plan.sampling)
    for i, seq in enumerate(plan.decodes):
        if seq.draft:
            out[id(seq)] = DraftChoices(plan.num_prefill_samples + i, first, seq.draft)
            first += len(seq.draft)
    return out


def kept_runs(
    runs: Mapping[int, tuple[int, DraftChoices]], plan: StepPlan
) -> dict[RequestId, list[tuple[int, int]]]:
    """Request id -> (token, its choice's row) for each token a verified draft kept (its
    first choice, then the accepted run), once the scheduler has appended them. `runs`:
    id(seq) -> (its length before the step, its choices), as the engine's _resolve keeps it."""
    if not runs:
        return {}
    out = {}
    for seq in plan.decodes:
        run = runs.get(id(seq))
        if run is not None:
            start, choice = run
            out[seq.request_id] = [
                (token, choice.row(i)) for i, token in enumerate(seq.token_ids[start:])
            ]
    return out


def choices(plan: StepPlan) -> Iterator[tuple[Sequence, int]]:
    """(sequence, i) for each choice of `plan`, in row order: choice i of that sequence."""
    yield from zip(plan.sampling, itertools.repeat(0))
    if plan.num_draft_tokens:
        for seq in plan.decodes:
            yield from ((seq, 1 + j) for j in range(len(seq.draft)))
