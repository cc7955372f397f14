"""feed_tokens: a step's input ids, with the pending ones read from the previous step's ids."""

from __future__ import annotations

import pytest
import torch
from kernels_testing import DEVICE, GPU
from sv_kernels import KernelError, ops, reference, triton_ops


def test_reference_on_a_hand_computed_case() -> None:
    token_ids = torch.tensor([11, -1, 13, -1, 15], dtype=torch.int32)
    source_rows = torch.tensor([-1, 2, -1, 0, -1], dtype=torch.int32)
    sampled = torch.tensor([700, 800, 900], dtype=torch.int64)
    out = reference.feed_tokens(token_ids, source_rows, sampled)
    assert out.tolist() == [11, 900, 13, 700, 15]
    assert out.dtype == torch.int32


@pytest.mark.parametrize("n", [1, 5, 1000, 1025, pytest.param(8192, marks=GPU)])
def test_kernel_equals_reference(n: int) -> None:
    """Every entry: pending ones from any row of `sampled` (a row read twice is fine), the
    others unchanged; int32 ids with int64 sampled ids, as the runner calls it."""
    g = torch.Generator().manual_seed(n)
    token_ids = torch.randint(0, 128_000, (n,), generator=g, dtype=torch.int32)
    sampled = torch.randint(0, 128_000, (300,), generator=g, dtype=torch.int64)
    source_rows = torch.randint(-300, 300, (n,), generator=g, dtype=torch.int32).clamp(min=-1)
    want = reference.feed_tokens(token_ids, source_rows, sampled)
    got = triton_ops.feed_tokens(token_ids.to(DEVICE), source_rows.to(DEVICE), sampled.to(DEVICE))
    assert torch.equal(got.cpu(), want)
    if n > 1:  # the case mixes both kinds of entry
        assert (source_rows >= 0).any() and (source_rows < 0).any()


def test_ops_rejects_mismatched_inputs() -> None:
    ids = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(KernelError, match="source_rows"):
        ops.feed_tokens(ids, torch.zeros(2, dtype=torch.int32), ids)
    with pytest.raises(KernelError, match="sampled"):
        ops.feed_tokens(ids, ids, torch.zeros(3))
