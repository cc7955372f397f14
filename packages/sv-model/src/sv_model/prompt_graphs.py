"""CUDA graphs of one-prompt steps: one sequence's prompt chunk, by token-count bucket.

An eager prompt step launches ~170 Triton kernels and cuBLAS calls from Python, ~90 us each
on the H200's host: ~15 ms before the GPU has all its work, where a 128-token prompt needs
about 1 ms of GPU (BENCHMARKS.md run 165: decode-b1's first TTFT 14.9 ms). So a step that
feeds one sequence's chunk of more than `DECODE_ROWS_MAX_CHUNK` and at most `BUCKETS[-1]`
tokens (a request arriving alone, the common case of interactive use) replays the graph of
the smallest bucket that holds it. Rows past the chunk are padding: token 0 at position 0,
their K/V written nowhere (slot -1) and their results never read. That holds because every
op of the forward pass works row by row except attention, which computes only the chunk's
rows, and the LM head, which reads only the chunk's last row. A step of several sequences
(the throughput case), with prompt log-probabilities or with a token still on the device
runs eagerly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from sv_kernels import graphs
from torch import Tensor

from sv_model.decode_graphs import BucketedGraphs, GraphInputs
from sv_model.decoder import AttentionMetadata
from sv_model.step import StepInputs
from sv_model.step_packing import DECODE_ROWS_MAX_CHUNK

# Padding costs a bucket at most half its rows again; above 2,048 tokens a prompt step's GPU
# time (~10 ms) outweighs its launches, and padding would cost more than the graph saves.
BUCKETS = (32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)

# The forward pass of a packed step on device tensors: (token ids, positions, attention
# metadata, logits rows) -> FP32 logits.
PromptForward = Callable[[Tensor, Tensor, AttentionMetadata, Tensor], Tensor]


def graph_tokens(step: StepInputs) -> int | None:
    """The tokens of `step` if a prompt graph can run it (see the module doc), else None."""
    tokens = len(step.token_ids)
    if (
        len(step.table_rows) != 1
        or not DECODE_ROWS_MAX_CHUNK < tokens <= BUCKETS[-1]
        or step.prompt_logprobs
        or step.feed
        or step.logits_at is not None
        or len(step.sample_rows) > 1
    ):
        return None
    return tokens


class PromptGraph:
    """A one-sequence prompt step of up to `bucket` tokens, captured once and replayed.

    Inputs: the chunk's token ids and positions, padded to the bucket, and [table row,
    context length after the chunk, chunk length]. `logits` is its output buffer [1, V]: the
    chunk's last row."""

    def __init__(
        self,
        bucket: int,
        forward: PromptForward,
        tables: Tensor,
        page_size: int,
        scratch_table_row: int,
        pool: Any,
    ) -> None:
        self.bucket = bucket
        self._forward = forward
        self._tables = tables
        self._page_size = page_size
        device = tables.device
        self.inputs = GraphInputs(
            [torch.zeros((2, bucket), dtype=torch.int32), torch.zeros(3, dtype=torch.int32)],
            device,
        )
        self._rows = torch.arange(bucket, dtype=torch.int32, device=device)
        self._zero = torch.zeros(1, dtype=torch.int32, device=device)
        # Captured on one token of the scratch table row, which writes only the scratch page
        # (the graph's launches do not depend on the values).
        self._fill([0], [0], scratch_table_row, 1)
        self.inputs.upload()
        self._graph, self.logits = graphs.capture(self._run, warmups=2, pool=pool)

    def _run(self) -> Tensor:
        rows, meta = self.inputs.dev
        positions = rows[1]
        tables = self._tables.index_select(0, meta[0:1])
        pages = tables[0, positions // self._page_size]
        slots = pages * self._page_size + positions % self._page_size
        q_len = meta[2:3]
        attn = AttentionMetadata(
            slot_mapping=torch.where(self._rows < q_len, slots, -1),
            seq_lens=meta[1:2],
            block_tables=tables,
            cu_seqlens_q=torch.cat([self._zero, q_len]),
            max_seqlen_q=self.bucket,
        )
        return self._forward(rows[0], positions, attn, q_len - 1)

    def memory_pool(self) -> Any:
        return self._graph.pool()

    def _fill(
        self, token_ids: list[int], positions: list[int], table_row: int, seq_len: int
    ) -> None:
        rows, meta = self.inputs.to_fill()
        n = len(token_ids)
        rows[0, :n] = token_ids
        rows[1, :n] = positions
        rows[:, n:] = 0
        meta[:] = (table_row, seq_len, n)

    def replay(self, step: StepInputs) -> Tensor:
        """The logits of `step` (one the graph can run: `graph_tokens`), [len(sample_rows), V]."""
        self._fill(list(step.token_ids), list(step.positions), step.table_rows[0], step.seq_lens[0])
        self.inputs.upload()
        self._graph.replay()
        return self.logits[: len(step.sample_rows)]


class PromptGraphs(BucketedGraphs[PromptGraph]):
    """The prompt graph of every bucket up to `max_tokens` (the context limit); `for_size`
    gives the one for a chunk of that many tokens, None past the largest bucket."""

    def __init__(
        self,
        forward: PromptForward,
        tables: Tensor,
        page_size: int,
        scratch_table_row: int,
        max_tokens: int,
    ) -> None:
        super().__init__(
            [b for b in BUCKETS if b <= max_tokens],
            lambda bucket, pool: PromptGraph(
                bucket, forward, tables, page_size, scratch_table_row, pool
            ),
        )
