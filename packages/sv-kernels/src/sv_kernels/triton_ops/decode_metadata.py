# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""The decode step's attention metadata in one kernel: block-table rows, cache slots, lengths.

Written with torch ops this is eight small kernels at the head of every decode step (a row
gather, an arange, a floor-divide, an index, a multiply, a modulo, an add, and `positions + 1`),
each a couple of microseconds of launch and drain in the graph for a few kilobytes of work.
Grid (B, row tiles): program (b, j) copies tile j of sequence b's block-table row; program
(b, 0) also writes its token's cache slot and its context length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, next_pow2, use_pdl, wait_for_prior_kernels

_TILE = 1024


@triton.jit
def _decode_metadata_kernel(
    tables_ptr,
    table_rows_ptr,
    positions_ptr,
    rows_out_ptr,
    slot_mapping_ptr,
    seq_lens_ptr,
    max_pages,
    stride_table,
    stride_rows_out,
    PAGE_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    row = tl.load(table_rows_ptr + b).to(tl.int64)
    cols = tile * TILE + tl.arange(0, TILE)
    in_row = cols < max_pages
    pages = tl.load(tables_ptr + row * stride_table + cols, mask=in_row)
    tl.store(rows_out_ptr + b * stride_rows_out + cols, pages, mask=in_row)
    if tile == 0:
        position = tl.load(positions_ptr + b).to(seq_lens_ptr.dtype.element_ty)
        page = tl.load(tables_ptr + row * stride_table + position // PAGE_SIZE)
        tl.store(slot_mapping_ptr + b, page * PAGE_SIZE + position % PAGE_SIZE)
        tl.store(seq_lens_ptr + b, position + 1)


def decode_metadata(
    block_tables: torch.Tensor, table_rows: torch.Tensor, positions: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(block-table rows [B, max_pages], cache slots [B], context lengths [B]) for a decode
    step; see `reference.decode_metadata`."""
    batch = table_rows.shape[0]
    max_pages = block_tables.shape[1]
    tables = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
    rows = torch.empty((batch, max_pages), dtype=tables.dtype, device=tables.device)
    slot_mapping = torch.empty((batch,), dtype=tables.dtype, device=tables.device)
    seq_lens = torch.empty((batch,), dtype=tables.dtype, device=tables.device)
    if batch == 0 or max_pages == 0:
        return rows, slot_mapping, seq_lens
    tile = min(_TILE, next_pow2(max_pages))
    pdl = use_pdl(tables.device)
    _decode_metadata_kernel[(batch, cdiv(max_pages, tile))](
        tables,
        table_rows.contiguous(),
        positions.contiguous(),
        rows,
        slot_mapping,
        seq_lens,
        max_pages,
        tables.stride(0),
        rows.stride(0),
        PAGE_SIZE=page_size,
        TILE=tile,
        USE_PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )
    return rows, slot_mapping, seq_lens
