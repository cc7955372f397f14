"""The one place where a step's logits are processed before sampling.

vLLM's order: the allowed_token_ids mask, bad words (-inf where the token still on the device
completes a word's other tokens; those the host decided are -inf biases), additive biases
(logit_bias, min_tokens' banned stop ids), then the repetition, frequency and presence penalties (they read each table row's
output-token counts and prompt tokens, kept on the device; a verify step's draft positions
count the drafts before them too, see draft_rows), then min_p. A step without
`StepInputs.controls` samples its raw logits. The result is a new tensor: the raw logits stay
for the log-probabilities.

Runs eagerly (a handful of torch ops, no host sync): a step with controls samples through
`ops.sample`, not a captured sampling graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from sv_kernels import ops
from torch import Tensor

from sv_model import draft_rows
from sv_model.step import LogitControls, StepInputs
from sv_model.uploads import upload


class TokenCounts:
    """Per table row, on the device: how often each token was generated (int32 [R, V]) and
    which tokens its prompt holds (bool [R, V]). A table row's entries are valid for the
    sequence last reset on it."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.output = torch.zeros((num_rows, vocab_size), dtype=torch.int32, device=device)
        self.prompt = torch.zeros((num_rows, vocab_size), dtype=torch.bool, device=device)

    def reset(self, controls: LogitControls, last_ids: Tensor) -> None:
        device = self.output.device
        for table_row, prompt_ids, output_ids, pending_row in controls.resets:
            self.output[table_row].zero_()
            self.prompt[table_row].zero_()
            self.prompt[table_row, upload(np.asarray(prompt_ids, dtype=np.int64), device)] = True
            if output_ids:
                out = upload(np.asarray(output_ids, dtype=np.int64), device)
                self.output[table_row].index_add_(0, out, torch.ones_like(out, dtype=torch.int32))
            if pending_row >= 0:  # its value is on the device only
                self.output[table_row].index_add_(
                    0, last_ids[pending_row : pending_row + 1], self._one
                )

    @property
    def _one(self) -> Tensor:
        return torch.ones(1, dtype=torch.int32, device=self.output.device)

    def count(self, table_rows: Tensor, ids: Tensor, weights: Tensor | None = None) -> None:
        """Add `weights` (int32; None: one each) at (table row, id) of each entry."""
        add_counts(self.output, table_rows, ids, weights)


def add_counts(counts: Tensor, rows: Tensor, ids: Tensor, weights: Tensor | None = None) -> None:
    """counts[rows[i], ids[i]] += weights[i] (int32; None: 1), in place; repeats add up."""
    ones = weights if weights is not None else torch.ones_like(ids, dtype=torch.int32)
    counts.index_put_((rows, ids), ones, accumulate=True)


class LogitProcessor:
    """Applies `StepInputs.controls`; keeps the token counts (allocated on first need) for
    `num_rows` table rows."""

    def __init__(
        self, num_rows: int, vocab_size: int, device: torch.device, last_ids: Tensor
    ) -> None:
        self._num_rows = num_rows
        self._vocab_size = vocab_size
        self._device = device
        self._last_ids = last_ids
        self._counts: TokenCounts | None = None
        self._table_rows: Tensor | None = None  # of the current step's choices
        self._step: StepInputs | None = None  # the step `process` saw, when it verifies drafts

    def process(self, step: StepInputs, logits: Tensor) -> Tensor:
        """The logits to sample `step`'s choices from, one row each (`logits` itself without
        controls)."""
        controls = step.controls
        self._table_rows = None
        self._step = step if step.drafts else None
        if controls is None:
            return logits
        x = logits
        if controls.allowed:
            x = self._keep_allowed(x, controls.allowed)
        if controls.pending_bans:
            x = self._ban_on_pending(x, controls.pending_bans)
        if controls.bias:
            rows, tokens, values = zip(*controls.bias, strict=True)
            x = ops.apply_logit_bias(
                x,
                upload(np.asarray(rows, dtype=np.int64), self._device),
                upload(np.asarray(tokens, dtype=np.int64), self._device),
                upload(np.asarray(values, dtype=np.float32), self._device),
            )
        floats = upload(
            np.asarray(
                [controls.presence, controls.frequency, controls.repetition, controls.min_p],
                dtype=np.float32,
            ),
            self._device,
        )
        if controls.any_penalty() or controls.resets:
            counts = self._ensure_counts()
            counts.reset(controls, self._last_ids)
            self._table_rows = upload(draft_rows.table_rows(step), self._device)
            if controls.any_penalty():
                output = counts.output.index_select(0, self._table_rows)
                if step.drafts:  # a draft position counts the drafts before it as output
                    at, drafted = draft_rows.drafted_before(step)
                    add_counts(output, upload(at, self._device), upload(drafted, self._device))
                x = ops.apply_penalties(
                    x,
                    output,
                    counts.prompt.index_select(0, self._table_rows),
                    floats[0],
                    floats[1],
                    floats[2],
                )
        if controls.any_min_p() and step.sampling is not None:
            # The sampled rows' temperatures (a verify step's draft choices follow them).
            sampled = step.sampling.temperature[: x.shape[0]]
            temperature = upload(np.asarray(sampled, np.float32), self._device)
            x = ops.apply_min_p(x, temperature, floats[3])
        return x

    def _keep_allowed(self, logits: Tensor, allowed: Sequence[tuple[int, np.ndarray]]) -> Tensor:
        restricted = np.asarray([row for row, _ in allowed], dtype=np.int64)
        rows = np.repeat(restricted, [len(ids) for _, ids in allowed])
        tokens = np.concatenate([ids for _, ids in allowed])
        return ops.apply_allowed_tokens(
            logits,
            upload(rows, self._device),
            upload(tokens, self._device),
            upload(restricted, self._device),
        )

    def _ban_on_pending(self, logits: Tensor, bans: Sequence[tuple[int, int, int, int]]) -> Tensor:
        """-inf at (row, token) of each ban whose sampled id, still on the device, is its id: a
        comparison and a sparse add, no host sync."""
        rows, tokens, pending, expected = np.asarray(bans, dtype=np.int64).T
        seen = self._last_ids.index_select(0, upload(np.ascontiguousarray(pending), self._device))
        hit = seen == upload(np.ascontiguousarray(expected), self._device)
        values = torch.zeros(hit.shape, dtype=torch.float32, device=self._device)
        return ops.apply_logit_bias(
            logits,
            upload(np.ascontiguousarray(rows), self._device),
            upload(np.ascontiguousarray(tokens), self._device),
            values.masked_fill(hit, float("-inf")),
        )

    def count(self, ids: Tensor) -> None:
        """Count the sampled `ids` (one per choice) of the step `process` just saw, for the
        penalties: a verify step's draft-position choices only where they are kept."""
        counts, table_rows, step = self._counts, self._table_rows, self._step
        if counts is None or table_rows is None:
            return
        if step is None:
            counts.count(table_rows, ids)
            return
        heads = len(step.sample_rows)
        counts.count(table_rows[:heads], ids[:heads])
        kept = draft_rows.kept_draft_choices(step, ids)
        counts.count(table_rows[heads:], ids[heads:], kept)

    def _ensure_counts(self) -> TokenCounts:
        if self._counts is None:
            self._counts = TokenCounts(self._num_rows, self._vocab_size, self._device)
        return self._counts
