"""From each request's SamplingParams to the runner's `LogitControls` of a step.

Only built when some row of the step processes its logits; every other row gets the "off"
values. Penalties read token counts that the device keeps per table row: a sequence that is
new on its table row (admitted, or resumed after a preemption) has that row reset first, from
the prompt and the output known so far (plus a token still on the device, if one is). Bad words
ban a word's last token outright when the host knows the tokens before it, or on the device's
check of the token still there (sv_engine.bad_words).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from sv_model import LogitControls
from sv_scheduler import Sequence as Seq

from sv_engine import bad_words
from sv_engine.params import SamplingParams


@dataclass
class RowControls:
    """A request's logit processing. `counts_at`: the (table row, preemptions) its token
    counts were last reset for. `allowed_ids`: its allowed_token_ids as the step uploads
    them, made once rather than every step. `bad_words`: its bad words' token ids
    (bad_words.word_ids); `bad_reach` how many output tokens their matching reads."""

    params: SamplingParams
    stop_ids: frozenset[int]
    prompt_ids: Sequence[int]
    bad_words: tuple[tuple[int, ...], ...] = ()
    counts_at: tuple[int, int] | None = None
    allowed_ids: np.ndarray | None = field(init=False)
    bad_reach: int = field(init=False)

    def __post_init__(self) -> None:
        allowed = self.params.allowed_token_ids
        self.allowed_ids = None if allowed is None else np.fromiter(sorted(allowed), np.int64)
        self.bad_reach = max((len(w) for w in self.bad_words), default=1) - 1


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
    pending_bans: list[tuple[int, int, int, int]] = []
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
        if controls.bad_words:
            _ban_bad_words(row, seq, controls, i, pending_row, bias, pending_bans)
        bias.extend((row, token, float(value)) for token, value in p.logit_bias.items())
        if seq.num_output_tokens + i < p.min_tokens:
            bias.extend((row, token, float("-inf")) for token in sorted(controls.stop_ids))
        at = (seq.table_row, seq.num_preemptions)
        if i == 0 and p.uses_token_counts and controls.counts_at != at:
            controls.counts_at = at
            pending = pending_row(seq) if seq.num_pending else -1
            resets.append((seq.table_row, controls.prompt_ids, seq.output_ids, pending))
    return LogitControls(
        presence, frequency, repetition, min_p, bias, allowed, resets, pending_bans
    )


def _ban_bad_words(
    row: int,
    seq: Seq,
    controls: RowControls,
    i: int,
    pending_row: Callable[[Seq], int],
    bias: list[tuple[int, int, float]],
    pending_bans: list[tuple[int, int, int, int]],
) -> None:
    """Choice `row` (choice i of seq)'s bad-word bans: outright ones as -inf biases, those that
    wait on seq's token still on the device as pending bans."""
    drafts = seq.draft[:i] if i else ()
    history = bad_words.history_tail(
        seq.token_ids, seq.num_prompt_tokens, controls.bad_reach, seq.num_pending > 0, drafts
    )
    for token, condition in bad_words.bans(controls.bad_words, history):
        if condition is None:
            bias.append((row, token, float("-inf")))
        else:
            pending_bans.append((row, token, pending_row(seq), condition))
