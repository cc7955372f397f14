"""Log-probabilities from the runner's rows to each request's `TokenLogprob`s.

The runner returns the top MAX_LOGPROBS of every row of a step that asks; each request keeps
the K it asked for. Prompt log-probabilities (for echo) are asked for chunk by chunk as the
prompt is prefilled: position p's logits score prompt token p + 1, and rank it too.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, overload

from sv_model import Logprobs
from sv_scheduler import PrefillChunk

from sv_engine.params import TokenLogprob

T = TypeVar("T")


class OutputLogprobs(Sequence[TokenLogprob]):
    """A request's output log-probabilities, one `TokenLogprob` per output token, kept without
    an object per token: each token's id, its own log-probability and the step rows holding its
    alternatives, in flat arrays. Its items are made when read (each event gets its token's);
    the completion's `logprobs` is this sequence itself, which compares equal to a list of the
    same items.

    Why not a list of `TokenLogprob`s: it lives as long as its request, 131,072 objects in the
    benchmark of 256 requests of 512 tokens, and Python's garbage collector walks every live
    object in each full collection. On the H200 two of those took 120-180 ms each, the whole
    gap of that benchmark's top-20 throughput to plain (BENCHMARKS.md, run 83); made all at
    once at the requests' ends, they still set off two (run 84)."""

    __slots__ = ("_chosen", "_row", "_steps", "_token_id", "k")

    def __init__(self, k: int) -> None:
        self.k = k  # the alternatives kept per token (SamplingParams.logprobs)
        self._token_id = array("q")
        self._chosen = array("d")
        self._row = array("q")
        self._steps: list[Logprobs] = []  # each token's step rows (shared by the step's tokens)

    def add(self, token_id: int, rows: Logprobs, row: int) -> TokenLogprob:
        """Keeps row `row` of `rows` as the next token's; returns its `TokenLogprob`."""
        chosen = rows.chosen[row]
        self._token_id.append(token_id)
        self._chosen.append(chosen)
        self._row.append(row)
        self._steps.append(rows)
        return TokenLogprob.of_row(token_id, chosen, rows, row, self.k)

    def truncate(self, n: int) -> OutputLogprobs:
        """Keeps the first `n` tokens' (a verified draft's run may go past the last output
        token); returns itself."""
        for kept in (self._token_id, self._chosen, self._row, self._steps):
            del kept[n:]
        return self

    def __len__(self) -> int:
        return len(self._token_id)

    @overload
    def __getitem__(self, index: int) -> TokenLogprob: ...

    @overload
    def __getitem__(self, index: slice) -> list[TokenLogprob]: ...

    def __getitem__(self, index: int | slice) -> TokenLogprob | list[TokenLogprob]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]  # negative indices, and IndexError past the end
        rows = self._steps[i]
        return TokenLogprob.of_row(self._token_id[i], self._chosen[i], rows, self._row[i], self.k)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # it grows while its request runs

    def __repr__(self) -> str:
        return f"OutputLogprobs({list(self)!r})"


@dataclass
class PromptLogprobs:
    """A request's prompt log-probabilities, as they come in: `scored` entries so far (the
    first prompt token has none); `planned`: prompt tokens covered by launched steps.

    Live requests of the same prompt and K share one (`LiveRequests.prompt_scores`: the n
    choices of a prompt): each of their chunks scores only the tokens none has planned yet,
    so the prompt is scored once between them."""

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
        ranks = rows.ranks
        for i, token_id in enumerate(targets):
            row = first_row + i
            rank = None if ranks is None else ranks[row]
            self.scored.append(
                TokenLogprob.of_row(token_id, rows.chosen[row], rows, row, self.k, rank)
            )


def with_first_rows(
    entries: Sequence[tuple[T, Sequence[int]]],
) -> list[tuple[T, int, Sequence[int]]]:
    """(scores, targets) entries of a step, each with the row its targets start at among the
    step's prompt log-probability rows (they follow one another)."""
    out, first = [], 0
    for scores, targets in entries:
        out.append((scores, first, targets))
        first += len(targets)
    return out
