"""Log-probabilities from the runner's rows to each request's `TokenLogprob`s.

The runner returns the top MAX_LOGPROBS of every row of a step that asks; each request keeps
the K it asked for. Prompt log-probabilities (for echo) are asked for chunk by chunk as the
prompt is prefilled: position p's logits score prompt token p + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sv_model import Logprobs
from sv_scheduler import PrefillChunk, RequestId

from sv_engine.params import TokenLogprob


@dataclass
class PromptLogprobs:
    """A request's prompt log-probabilities, as they come in: `scored` entries so far (the
    first prompt token has none); `planned`: prompt tokens covered by launched steps."""

    prompt_ids: Sequence[int]
    k: int
    scored: list[TokenLogprob | None]
    planned: int = 1

    def targets(self, chunk: PrefillChunk) -> tuple[int, list[int]] | None:
        """(offset in the chunk, prompt ids to score) for a chunk of this request's prefill,
        or None when it scores nothing new (a recomputed prefix, or output tokens only)."""
        first = max(chunk.start, self.planned - 1)
        end = min(chunk.end, len(self.prompt_ids) - 1)
        if end <= first:
            return None
        self.planned = end + 1
        return first - chunk.start, list(self.prompt_ids[first + 1 : end + 1])

    def add(self, rows: Logprobs, first_row: int, targets: Sequence[int]) -> None:
        for i, token_id in enumerate(targets):
            row = first_row + i
            self.scored.append(TokenLogprob.of_row(token_id, rows.chosen[row], rows, row, self.k))


def with_first_rows(
    entries: Sequence[tuple[RequestId, Sequence[int]]],
) -> list[tuple[RequestId, int, Sequence[int]]]:
    """(request, targets) entries of a step, each with the row its targets start at among the
    step's prompt log-probability rows (they follow one another)."""
    out, first = [], 0
    for request_id, targets in entries:
        out.append((request_id, first, targets))
        first += len(targets)
    return out
