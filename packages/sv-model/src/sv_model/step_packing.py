"""From a `StepInputs` (host lists) to the device tensors the model's forward pass reads.

A prefill step (at least one multi-token chunk) is packed into one int32 array and uploaded
with a single copy; the slot mapping (where each token's K/V goes) is computed on the device
from the block tables. A decode step has one token per sequence: its attention metadata comes
from `ops.decode_metadata` on device tensors alone, which is what a CUDA graph captures.
Tokens still on the device (`StepInputs.feed`) are read from the previous launch's sampled ids
by `ops.feed_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from sv_kernels import ops
from torch import Tensor

from sv_model import logprob_rows
from sv_model.block_tables import DeviceBlockTables
from sv_model.decoder import AttentionMetadata
from sv_model.step import StepInputs
from sv_model.uploads import upload, upload_packed


@dataclass
class PackedStep:
    """A step's forward-pass inputs on the device (`DecoderModel.forward`'s arguments)."""

    token_ids: Tensor
    positions: Tensor
    attn: AttentionMetadata
    logits_indices: Tensor | None = None  # None: every row (a decode step)


def source_rows(step: StepInputs, length: int) -> np.ndarray:
    """Per fed token: the row of the last sampled ids holding its value, or -1 (see
    `StepInputs.feed`)."""
    rows = np.full(length, -1, dtype=np.int32)
    if step.feed:
        index, source = zip(*step.feed, strict=True)
        rows[list(index)] = source
    return rows


def pack_prefill(
    step: StepInputs,
    block_tables: DeviceBlockTables,
    page_size: int,
    last_ids: Tensor,
    every_token: bool = False,
) -> PackedStep:
    """A step with at least one multi-token chunk, as a packed varlen batch. Logits are asked
    for at each sampled sequence's last token (or at `step.logits_at`), then at the tokens of
    `step.prompt_logprobs`; or with `every_token` at every token."""
    num_seqs = len(step.table_rows)
    num_tokens = len(step.token_ids)
    query_lens = np.asarray(step.query_lens, dtype=np.int32)
    cu = np.zeros(num_seqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=cu[1:])
    sample_rows = np.asarray(step.sample_rows, dtype=np.int32)
    if every_token:
        logits_rows = np.arange(num_tokens, dtype=np.int32)
    elif step.logits_at is not None:
        logits_rows = np.asarray(step.logits_at, dtype=np.int32)
    else:
        logits_rows = cu[1:][sample_rows] - 1
    if step.prompt_logprobs and not every_token:
        logits_rows = np.concatenate([logits_rows, logprob_rows.logits_rows(step, cu)])
    token_ids, positions, token_seq, cu_q, seq_lens, table_rows, logits_idx, sources = (
        upload_packed(
            [
                np.asarray(step.token_ids, dtype=np.int32),
                np.asarray(step.positions, dtype=np.int32),
                np.repeat(np.arange(num_seqs, dtype=np.int32), query_lens),
                cu,
                np.asarray(step.seq_lens, dtype=np.int32),
                np.asarray(step.table_rows, dtype=np.int32),
                logits_rows,
                source_rows(step, num_tokens if step.feed else 0),
            ],
            block_tables.device,
        )
    )
    if step.feed:
        token_ids = ops.feed_tokens(token_ids, sources, last_ids)
    tables = block_tables.tensor.index_select(0, table_rows)
    pages = tables[token_seq, positions // page_size]
    attn = AttentionMetadata(
        slot_mapping=pages * page_size + positions % page_size,
        seq_lens=seq_lens,
        block_tables=tables,
        cu_seqlens_q=cu_q,
        max_seqlen_q=int(query_lens.max()),
    )
    return PackedStep(token_ids, positions, attn, logits_idx)


def decode_attention(
    block_tables: DeviceBlockTables, table_rows: Tensor, positions: Tensor, page_size: int
) -> AttentionMetadata:
    """Attention metadata of a decode step from device tensors only (capturable)."""
    tables, slot_mapping, seq_lens = ops.decode_metadata(
        block_tables.tensor, table_rows, positions, page_size
    )
    return AttentionMetadata(slot_mapping=slot_mapping, seq_lens=seq_lens, block_tables=tables)


def upload_decode(step: StepInputs, device: torch.device, last_ids: Tensor) -> list[Tensor]:
    """A decode step's (token ids, positions, table rows) on the device in one copy, for running it
    without a CUDA graph; fed tokens already read from `last_ids`."""
    dev = upload(
        np.stack(
            [
                np.asarray(step.token_ids, dtype=np.int32),
                np.asarray(step.positions, dtype=np.int32),
                np.asarray(step.table_rows, dtype=np.int32),
                source_rows(step, len(step.table_rows)),
            ]
        ),
        device,
    )
    token_ids = ops.feed_tokens(dev[0], dev[3], last_ids) if step.feed else dev[0]
    return [token_ids, dev[1], dev[2]]


def fill_decode_rows(host: np.ndarray, step: StepInputs) -> None:
    """Write a decode step into a graph's pinned input rows (token ids, positions, table
    rows, source rows), columns 0 to batch - 1."""
    batch = len(step.table_rows)
    host[0, :batch] = step.token_ids
    host[1, :batch] = step.positions
    host[2, :batch] = step.table_rows
    host[3, :batch] = source_rows(step, batch)
