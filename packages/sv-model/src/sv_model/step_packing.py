"""From a `StepInputs` (host lists) to the device tensors the model's forward pass reads.

Two shapes of step:
- decode rows (`decode_rows`): every chunk is short (a decoding sequence's one token, a verify
  step's newest token and its draft, the last few tokens of a prompt), so each token runs as a
  row of its own, attending to its sequence's pages up to its own position. The attention
  metadata then comes from `ops.decode_metadata` on device tensors alone, which is what a CUDA
  graph captures. Rows that choose a token come first, in the order of the step's choices, so
  the first rows of a graph's logits buffer are the step's choices and its sampling and
  log-probability graphs serve them as they are.
- packed (`pack_prefill`): a step with a long chunk, as one varlen batch in one int32 array
  uploaded with a single copy; the slot mapping (where each token's K/V goes) is computed on
  the device from the block tables.
Rows of one sequence may run in any order in either shape: every layer writes the K/V of all
the step's tokens before its attention reads any. Tokens still on the device
(`StepInputs.feed`) are read from the previous launch's sampled ids by `ops.feed_tokens`.
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
        # Arrays, not the tuples: numpy converts a sequence of ints one element at a time.
        rows[np.asarray(index, dtype=np.intp)] = np.asarray(source, dtype=np.int32)
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
    seq_lens_host = np.asarray(step.seq_lens, dtype=np.int32)
    table_rows_host = np.asarray(step.table_rows, dtype=np.int32)
    decodes = decode_tail_length(query_lens)
    (
        token_ids,
        positions,
        token_seq,
        cu_q,
        seq_lens,
        table_rows,
        logits_idx,
        sources,
        tail_lens,
        tail_rows,
    ) = upload_packed(
        [
            np.asarray(step.token_ids, dtype=np.int32),
            np.asarray(step.positions, dtype=np.int32),
            np.repeat(np.arange(num_seqs, dtype=np.int32), query_lens),
            cu,
            seq_lens_host,
            table_rows_host,
            logits_rows,
            source_rows(step, num_tokens if step.feed else 0),
            # The decode tail's lengths and table rows again, each on a 16-byte boundary
            # of its own (see upload_packed), as a decode step's are.
            seq_lens_host[num_seqs - decodes :],
            table_rows_host[num_seqs - decodes :],
        ],
        block_tables.device,
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
    if decodes:
        tail_tables = block_tables.tensor.index_select(0, tail_rows)
        attn.decode_tail = ops.DecodeTail(tail_lens, tail_tables)
    return PackedStep(token_ids, positions, attn, logits_idx)


def decode_tail_length(query_lens: np.ndarray) -> int:
    """How many of a packed step's last sequences feed one token each: its decodes, which the
    engine packs after the prompt chunks (`AttentionMetadata.decode_tail`)."""
    longer = np.flatnonzero(query_lens != 1)
    return len(query_lens) - (int(longer[-1]) + 1 if len(longer) else 0)


def decode_attention(
    block_tables: DeviceBlockTables, table_rows: Tensor, positions: Tensor, page_size: int
) -> AttentionMetadata:
    """Attention metadata of a decode step from device tensors only (capturable)."""
    tables, slot_mapping, seq_lens = ops.decode_metadata(
        block_tables.tensor, table_rows, positions, page_size
    )
    return AttentionMetadata(slot_mapping=slot_mapping, seq_lens=seq_lens, block_tables=tables)


# The longest chunk that runs as decode rows: each row's attention reads its sequence's
# pages on its own, so a longer chunk (a prompt) is cheaper packed. It covers verify runs of
# the newest token and up to 15 draft tokens.
DECODE_ROWS_MAX_CHUNK = 16


@dataclass
class DecodeRows:
    """A step as one row per token (int32 arrays in row order): the rows of its choices first,
    in the order its ids are returned, then its other tokens. `sources`: see `source_rows`."""

    token_ids: np.ndarray
    positions: np.ndarray
    table_rows: np.ndarray
    sources: np.ndarray
    num_choices: int

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)


def decode_rows(step: StepInputs, max_rows: int) -> DecodeRows | None:
    """The step as decode rows, or None when it must run packed: it scores prompt tokens,
    feeds more than `max_rows` tokens or has a chunk longer than DECODE_ROWS_MAX_CHUNK."""
    num_tokens = len(step.token_ids)
    if step.prompt_logprobs or num_tokens > max_rows:
        return None
    sample_rows = np.asarray(step.sample_rows, dtype=np.int32)
    # One token per sequence, each choosing in token order (every sequence chooses one, at
    # its last token): a plain decode step, whose rows are its tokens as they are. The
    # common step, spared the general reordering below.
    one_each = (
        step.logits_at is None
        and len(step.table_rows) == num_tokens
        and np.array_equal(sample_rows, np.arange(num_tokens))
    )
    if not one_each and max(step.query_lens) > DECODE_ROWS_MAX_CHUNK:
        return None
    token_ids = np.asarray(step.token_ids, dtype=np.int32)
    positions = np.asarray(step.positions, dtype=np.int32)
    sources = source_rows(step, num_tokens)
    if one_each:
        table_rows = np.asarray(step.table_rows, dtype=np.int32)
        return DecodeRows(token_ids, positions, table_rows, sources, num_tokens)
    query_lens = np.asarray(step.query_lens, dtype=np.int32)
    if step.logits_at is not None:
        choices = np.asarray(step.logits_at, dtype=np.int32)
    else:
        choices = np.cumsum(query_lens, dtype=np.int32)[sample_rows] - 1
    table_rows = np.repeat(np.asarray(step.table_rows, dtype=np.int32), query_lens)
    if len(choices) != num_tokens or np.any(choices != np.arange(num_tokens)):
        others = np.ones(num_tokens, dtype=bool)
        others[choices] = False
        order = np.concatenate([choices, np.flatnonzero(others).astype(np.int32)])
        token_ids, positions, table_rows, sources = (
            a[order] for a in (token_ids, positions, table_rows, sources)
        )
    return DecodeRows(token_ids, positions, table_rows, sources, len(choices))


def upload_decode(rows: DecodeRows, device: torch.device, last_ids: Tensor) -> list[Tensor]:
    """Decode rows' (token ids, positions, table rows) on the device in one copy, for running
    them without a CUDA graph; fed tokens already read from `last_ids`."""
    dev = upload(np.stack([rows.token_ids, rows.positions, rows.table_rows, rows.sources]), device)
    token_ids = ops.feed_tokens(dev[0], dev[3], last_ids) if np.any(rows.sources >= 0) else dev[0]
    return [token_ids, dev[1], dev[2]]


def fill_decode_rows(host: np.ndarray, rows: DecodeRows) -> None:
    """Write decode rows into a graph's pinned input rows (token ids, positions, table rows,
    source rows), columns 0 to num_rows - 1."""
    n = rows.num_rows
    host[0, :n] = rows.token_ids
    host[1, :n] = rows.positions
    host[2, :n] = rows.table_rows
    host[3, :n] = rows.sources
