"""A verify step's choices, as the penalties see them.

A sequence that verifies a draft d_0..d_{m-1} gets m + 1 choices: c_0 at its newest token (its
row among the first len(sample_rows)) and c_{j+1} at d_j's position (the draft rows, after every
sequence's own; `StepInputs.drafts`). Choice c_i is what plain decoding would make once
d_0..d_{i-1} had been generated, so the penalties there count those drafts as output (on top of
the table row's counts, which hold the output so far). Once sampled, c_{i+1} is kept iff
c_0..c_i equal d_0..d_i, the scheduler's rule at resolve; the device applies the same rule to
the ids so that its counts grow by the kept choices only, with no wait for the host.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from sv_model.step import StepInputs
from sv_model.uploads import upload_packed


def table_rows(step: StepInputs) -> np.ndarray:
    """The table row of each choice (int64): a draft row's is its sequence's."""
    heads = np.asarray(step.table_rows, dtype=np.int64)[list(step.sample_rows)]
    if not step.drafts:
        return heads
    return np.concatenate(
        [heads, *(np.full(len(draft), heads[head], dtype=np.int64) for head, draft in step.drafts)]
    )


def drafted_before(step: StepInputs) -> tuple[np.ndarray, np.ndarray]:
    """(choice row, token) pairs: each draft row with every draft token up to its own, which
    its penalties count as generated output (an empty pair of arrays without drafts)."""
    rows: list[int] = []
    tokens: list[int] = []
    at = len(step.sample_rows)
    for _, draft in step.drafts:
        for j in range(len(draft)):
            rows.extend([at + j] * (j + 1))
            tokens.extend(draft[: j + 1])
        at += len(draft)
    return np.asarray(rows, dtype=np.int64), np.asarray(tokens, dtype=np.int64)


def kept_draft_choices(step: StepInputs, ids: Tensor) -> Tensor:
    """int32 [number of draft rows]: 1 where that draft row's choice is kept, from the step's
    `ids` (one per choice), on the device. The choice at d_j is kept iff every choice before
    it in its sequence equals the draft token after it: no mismatch up to d_j in its segment."""
    num_heads = len(step.sample_rows)
    previous: list[int] = []  # the choice each draft token must equal
    drafts: list[int] = []
    starts: list[int] = []  # per draft row, its sequence's first draft row (from 0)
    at = 0
    for head, draft in step.drafts:
        previous.append(head)
        previous.extend(range(num_heads + at, num_heads + at + len(draft) - 1))
        drafts.extend(draft)
        starts.extend([at] * len(draft))
        at += len(draft)
    prev, want, start = upload_packed(
        [np.asarray(a, dtype=np.int32) for a in (previous, drafts, starts)], ids.device
    )
    miss = (ids.index_select(0, prev.long()) != want.long()).to(torch.int32)
    misses = miss.cumsum(0)
    first = start.long()
    before = misses.index_select(0, first) - miss.index_select(0, first)
    return (misses == before).to(torch.int32)
