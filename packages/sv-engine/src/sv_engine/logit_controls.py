"""From each request's SamplingParams to the runner's `LogitControls` of a step.

Only built when some row of the step processes its logits; every other row gets the "off"
values. Penalties read token counts that the device keeps per table row: a sequence that is
new on its table row (admitted, or resumed after a preemption) has that row reset first, from
the prompt and the output known so far (plus a token still on the device, if one is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from sv_model import LogitControls
from sv_scheduler import Sequence as Seq

from sv_engine.params import SamplingParams


@dataclass
class RowControls:
    """A request's logit processing. `counts_at`: the (table row, preemptions) its token
    counts were last reset for. `allowed_ids`: its allowed_token_ids as the step uploads
    them, made once rather than every step."""

    params: SamplingParams
    stop_ids: frozenset[int]
    prompt_ids: Sequence[int]
    counts_at: tuple[int, int] | None = None
    allowed_ids: np.ndarray | None = field(init=False)

    def __post_init__(self) -> None:
        allowed = self.params.allowed_token_ids
        self.allowed_ids = None if allowed is None else np.fromiter(sorted(allowed), np.int64)


def step_controls(
    rows: Sequence[tuple[Seq, RowControls | None, int]], pending_row: Callable[[Seq], int]
) -> LogitControls | None:
    """The controls of a step's choices, in order: (sequence, its controls, i) for its choice
    i, which makes its output token num_output_tokens + i (i > 0: a verify step's draft
    positions; see draft_choices). None when no row has any. `pending_row(seq)`: the row of
    the previous launch's sampled ids holding seq's token still on the device (called only
    when seq has one)."""
    if all(c is None for _, c, _ in rows):
        return None
    presence, frequency, repetition, min_p = [], [], [], []
    bias: list[tuple[int, int, float]] = []
    allowed: list[tuple[int, np.ndarray]] = []
    resets: list[tuple[int, Sequence[int], Sequence[int], int]] = []
    for row, (seq, controls, i) in enumerate(rows):
        if controls is None:
            presence.append(0.0)
            frequency.append(0.0)
            repetition.append(1.0)
            min_p.append(0.0)
            continue
        p = controls.params
        presence.append(p.presence_penalty)
        frequency.append(p.frequency_penalty)
        repetition.append(p.repetition_penalty)
        min_p.append(p.min_p)
        if controls.allowed_ids is not None:
            allowed.append((row, controls.allowed_ids))
        bias.extend((row, token, float(value)) for token, value in p.logit_bias.items())
        if seq.num_output_tokens + i < p.min_tokens:
            bias.extend((row, token, float("-inf")) for token in sorted(controls.stop_ids))
        at = (seq.table_row, seq.num_preemptions)
        if i == 0 and p.uses_token_counts and controls.counts_at != at:
            controls.counts_at = at
            pending = pending_row(seq) if seq.num_pending else -1
            resets.append((seq.table_row, controls.prompt_ids, seq.output_ids, pending))
    return LogitControls(presence, frequency, repetition, min_p, bias, allowed, resets)
