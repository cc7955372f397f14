"""Byte-pair merging of one pre-token's bytes into token ids.

Two rule sets exist, and both merge the best adjacent pair until none is left, taking the
leftmost pair on ties:

- `RankMerger` (tiktoken's rule): any adjacent pair whose concatenated bytes is a token may
  merge, best = lowest rank of that concatenation. A piece that is a whole token is that token.
- `PairMerger` (HF tokenizer.json's rule): only the listed merges `(left, right)` apply,
  best = listed earliest.

Short pieces (almost all of them) use a list of parts and a parallel list of pair ranks: each
step is one C-speed `min()` and `index()` plus two dictionary look-ups. That is quadratic in the
piece length, so pieces longer than `LONG_PIECE_BYTES` go through `_merge_with_heap`: a
linked list of parts and a heap of candidate pairs, O(n log n), so a 100k-character word
still takes well under a second.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import TypeVar

NO_MERGE = 1 << 62
"""The pair rank of a pair that cannot merge: larger than any real rank."""

LONG_PIECE_BYTES = 256
"""From this length on the heap path is faster than re-scanning the pair list each step."""

Part = TypeVar("Part", bytes, int)


class RankMerger:
    """tiktoken's BPE: merge ranks are the ranks of the concatenated bytes."""

    def __init__(self, ranks: dict[bytes, int]) -> None:
        self.ranks = ranks

    def encode(self, data: bytes) -> list[int]:
        ranks = self.ranks
        whole = ranks.get(data)
        if whole is not None:
            return [whole]
        if len(data) > LONG_PIECE_BYTES:
            parts = _merge_with_heap(
                [data[i : i + 1] for i in range(len(data))], self._pair_rank, _concat
            )
            return [ranks[part] for part in parts]
        get = ranks.get
        parts = [data[i : i + 1] for i in range(len(data))]
        pair_ranks = [get(data[i : i + 2], NO_MERGE) for i in range(len(data) - 1)]
        while pair_ranks:
            best = min(pair_ranks)
            if best == NO_MERGE:
                break
            i = pair_ranks.index(best)
            merged = parts[i] + parts[i + 1]
            parts[i] = merged
            del parts[i + 1]
            del pair_ranks[i]
            if i > 0:
                pair_ranks[i - 1] = get(parts[i - 1] + merged, NO_MERGE)
            if i < len(pair_ranks):
                pair_ranks[i] = get(merged + parts[i + 1], NO_MERGE)
        return [ranks[part] for part in parts]

    def _pair_rank(self, left: bytes, right: bytes) -> int:
        return self.ranks.get(left + right, NO_MERGE)


def _concat(left: bytes, right: bytes, rank: int) -> bytes:
    return left + right


class PairMerger:
    """HF BPE: `pair_ranks[(left_id, right_id)]` is the merge's line in `model.merges`.

    A byte whose character is missing from the vocabulary (SmolLM2 lacks a few control bytes)
    is handled as HF does: its `byte_fallback` tokens if it has them, else the `unk` token
    (consecutive ones fused into one with `fuse_unk`), else it is dropped.
    """

    def __init__(
        self,
        byte_ids: list[int],
        pair_ranks: dict[tuple[int, int], int],
        merged_ids: list[int],
        whole_tokens: dict[bytes, int] | None = None,
        *,
        fallback_ids: Sequence[list[int] | None] | None = None,
        unk_id: int | None = None,
        fuse_unk: bool = False,
    ) -> None:
        self.byte_ids = byte_ids  # the token id of each single byte, -1 if it has none
        self.pair_ranks = pair_ranks
        self.merged_ids = merged_ids  # merged_ids[rank]: the token that merge produces
        # With HF's `ignore_merges`, a piece that is a whole vocabulary entry is taken as is.
        self.whole_tokens = whole_tokens
        self.fallback_ids = fallback_ids or [None] * 256  # byte_fallback tokens, None if none
        self.unk_id = unk_id
        self.fuse_unk = fuse_unk

    def encode(self, data: bytes) -> list[int]:
        if self.whole_tokens is not None:
            whole = self.whole_tokens.get(data)
            if whole is not None:
                return [whole]
        byte_ids = self.byte_ids
        ids = [byte_ids[b] for b in data]
        if -1 in ids:
            ids = self._ids_with_unknown_bytes(data)
        return self.merge(ids)

    def merge(self, ids: list[int]) -> list[int]:
        """Apply the listed merges to a piece's initial token ids, best first."""
        if len(ids) > LONG_PIECE_BYTES:
            return _merge_with_heap(ids, self._pair_rank, self._merged)
        get = self.pair_ranks.get
        merged_ids = self.merged_ids
        pair_ranks = [get((ids[i], ids[i + 1]), NO_MERGE) for i in range(len(ids) - 1)]
        while pair_ranks:
            best = min(pair_ranks)
            if best == NO_MERGE:
                break
            i = pair_ranks.index(best)
            merged = merged_ids[best]
            ids[i] = merged
            del ids[i + 1]
            del pair_ranks[i]
            if i > 0:
                pair_ranks[i - 1] = get((ids[i - 1], merged), NO_MERGE)
            if i < len(pair_ranks):
                pair_ranks[i] = get((merged, ids[i + 1]), NO_MERGE)
        return ids

    def _ids_with_unknown_bytes(self, data: bytes) -> list[int]:
        ids: list[int] = []
        previous_was_unk = False
        for byte in data:
            token_id = self.byte_ids[byte]
            fallback = self.fallback_ids[byte]
            if token_id >= 0:
                ids.append(token_id)
                previous_was_unk = False
            elif fallback is not None:
                ids += fallback
                previous_was_unk = False
            elif self.unk_id is not None:
                if not (self.fuse_unk and previous_was_unk):
                    ids.append(self.unk_id)
                previous_was_unk = True
        return ids

    def _pair_rank(self, left: int, right: int) -> int:
        return self.pair_ranks.get((left, right), NO_MERGE)

    def _merged(self, left: int, right: int, rank: int) -> int:
        return self.merged_ids[rank]


def _merge_with_heap(
    parts: list[Part],
    pair_rank: Callable[[Part, Part], int],
    merge: Callable[[Part, Part, int], Part],
) -> list[Part]:
    """Merge best-first with a heap of (rank, position) over a linked list of parts.

    A heap entry goes stale when a neighbour merges first; it is recognised on pop by looking
    the pair's rank up again (a rank names one pair, so an equal rank means the same pair).
    (rank, position) order pops the leftmost of equal ranks first, as the plain loop does.
    """
    n = len(parts)
    alive = [True] * n
    next_part = list(range(1, n + 1))
    prev_part = list(range(-1, n - 1))
    heap = [
        (rank, i) for i in range(n - 1) if (rank := pair_rank(parts[i], parts[i + 1])) != NO_MERGE
    ]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        if not alive[i]:
            continue
        j = next_part[i]
        if j >= n or pair_rank(parts[i], parts[j]) != rank:
            continue
        parts[i] = merge(parts[i], parts[j], rank)
        alive[j] = False
        k = next_part[j]
        next_part[i] = k
        if k < n:
            prev_part[k] = i
            right_rank = pair_rank(parts[i], parts[k])
            if right_rank != NO_MERGE:
                heapq.heappush(heap, (right_rank, i))
        p = prev_part[i]
        if p >= 0:
            left_rank = pair_rank(parts[p], parts[i])
            if left_rank != NO_MERGE:
                heapq.heappush(heap, (left_rank, p))
    return [part for part, is_alive in zip(parts, alive, strict=True) if is_alive]


UTF8_BYTES = frozenset(range(256)) - {0xC0, 0xC1, *range(0xF5, 0x100)}
"""The byte values that can occur in UTF-8 text: every one needs a single-byte token."""
