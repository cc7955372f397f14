"""A verify step's choice rows (sv_model.draft_rows) against the scheduler's acceptance rule,
written out here as a plain loop, and a hand-made case."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from sv_model import StepInputs
from sv_model.draft_rows import drafted_before, kept_draft_choices, table_rows


def verify_step(table: list[int], drafts: list[tuple[int, list[int]]]) -> StepInputs:
    """Only what draft_rows reads: one sampled row per sequence, and the drafts."""
    n = len(table)
    return StepInputs(
        token_ids=[0] * n,
        positions=[0] * n,
        table_rows=table,
        query_lens=[1] * n,
        seq_lens=[1] * n,
        sample_rows=list(range(n)),
        drafts=drafts,
    )


def test_a_hand_made_verify_step() -> None:
    # Three sequences on table rows 7, 3, 5; the second drafts 4 5 6, the third drafts 9.
    step = verify_step([7, 3, 5], [(1, [4, 5, 6]), (2, [9])])
    # Choices: heads 11, 4, 8; at 4, 5, 6: 5, 0, 12; at 9: 13. The second keeps 4 = d0 (so the
    # choice at d0), then 5 = d1 (the choice at d1), then 0 != 6 stops it; the third's 8 != 9.
    ids = torch.tensor([11, 4, 8, 5, 0, 12, 13])
    assert kept_draft_choices(step, ids).tolist() == [1, 1, 0, 0]
    assert table_rows(step).tolist() == [7, 3, 5, 3, 3, 3, 5]
    rows, tokens = drafted_before(step)
    assert rows.tolist() == [3, 4, 4, 5, 5, 5, 6]
    assert tokens.tolist() == [4, 4, 5, 4, 5, 6, 9]


@given(
    drafts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_kept_choices_follow_the_acceptance_rule(drafts: list[list[int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    heads = len(drafts) + 1  # one sampled row without a draft first
    step = verify_step(list(range(heads)), [(1 + i, d) for i, d in enumerate(drafts)])
    ids = rng.integers(0, 4, heads + sum(map(len, drafts)))
    want = []
    at = heads
    for i, draft in enumerate(drafts):
        choices = [int(ids[1 + i]), *(int(c) for c in ids[at : at + len(draft)])]
        accepted = 0
        while accepted < len(draft) and choices[accepted] == draft[accepted]:
            accepted += 1
        want += [1] * accepted + [0] * (len(draft) - accepted)
        at += len(draft)
    assert kept_draft_choices(step, torch.from_numpy(ids)).tolist() == want
