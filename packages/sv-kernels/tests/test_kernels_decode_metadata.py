"""decode_metadata: a decode step's block-table rows, cache slots and context lengths."""

from __future__ import annotations

import pytest
import torch
from kernels_testing import DEVICE, GPU
from sv_kernels import KernelError, ops, reference, triton_ops


def test_reference_on_a_hand_computed_case() -> None:
    tables = torch.tensor([[7, 3, 9], [4, 0, 0], [5, 6, 1]], dtype=torch.int32)
    table_rows = torch.tensor([2, 0], dtype=torch.int32)
    positions = torch.tensor([17, 40], dtype=torch.int32)  # page 1 of row 2; page 2 of row 0
    rows, slot_mapping, seq_lens = reference.decode_metadata(tables, table_rows, positions, 16)
    assert rows.tolist() == [[5, 6, 1], [7, 3, 9]]
    assert slot_mapping.tolist() == [6 * 16 + 1, 9 * 16 + 8]
    assert seq_lens.tolist() == [18, 41]
    assert rows.dtype == slot_mapping.dtype == seq_lens.dtype == torch.int32


@pytest.mark.parametrize(
    ("num_table_rows", "max_pages", "batch"),
    [(5, 3, 2), (9, 37, 9), (4, 1, 1), pytest.param(257, 8192, 256, marks=GPU)],
)
def test_kernel_equals_reference(num_table_rows: int, max_pages: int, batch: int) -> None:
    """Every row gathered whole (including a row longer than one program's tile), every slot
    and length exact; repeated table rows (padding rows share the scratch table row) are fine."""
    g = torch.Generator().manual_seed(num_table_rows * 1000 + max_pages)
    page_size = 16
    tables = torch.randint(0, 100_000, (num_table_rows, max_pages), generator=g, dtype=torch.int32)
    table_rows = torch.randint(0, num_table_rows, (batch,), generator=g, dtype=torch.int32)
    positions = torch.randint(0, max_pages * page_size, (batch,), generator=g, dtype=torch.int32)
    want = reference.decode_metadata(tables, table_rows, positions, page_size)
    got = triton_ops.decode_metadata(
        tables.to(DEVICE), table_rows.to(DEVICE), positions.to(DEVICE), page_size
    )
    for name, w, o in zip(("rows", "slot_mapping", "seq_lens"), want, got, strict=True):
        assert torch.equal(o.cpu(), w), name


def test_ops_rejects_mismatched_inputs() -> None:
    tables = torch.zeros((3, 4), dtype=torch.int32)
    with pytest.raises(KernelError, match="positions"):
        ops.decode_metadata(tables, torch.zeros(2, dtype=torch.int32), torch.zeros(3), 16)
    with pytest.raises(KernelError, match="page_size"):
        ops.decode_metadata(
            tables, torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), 0
        )
