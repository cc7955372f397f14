"""apply_token_bitmask: a grammar's allowed tokens kept, every other logit -inf, in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernels_testing import DEVICE, GPU
from sv_kernels import KernelError, ops, reference, triton_ops


def _allowed_by_numpy(bitmask: torch.Tensor, vocab: int) -> np.ndarray:
    """The oracle: numpy's own bit unpacking (little-endian bits of little-endian int32 words)."""
    raw = bitmask.numpy().astype("<i4").view(np.uint8)
    return np.unpackbits(raw, axis=1, bitorder="little")[:, :vocab].astype(bool)


def test_reference_on_a_hand_computed_case() -> None:
    logits = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    # Row 2 may take tokens 1 and 3 (bits 0b1010); row 0 only token 0; row 1 is not masked.
    bitmask = torch.tensor([[0b1010], [0b0001]], dtype=torch.int32)
    reference.apply_token_bitmask(logits, bitmask, torch.tensor([2, 0]))
    inf = float("-inf")
    assert logits.tolist() == [[0, inf, inf, inf], [4, 5, 6, 7], [inf, 9, inf, 11]]


@pytest.mark.parametrize(
    ("batch", "vocab", "dtype"),
    [
        (3, 70, torch.float32),
        (4, 4096 + 33, torch.float32),
        (2, 1000, torch.bfloat16),
        pytest.param(64, 128256, torch.float32, marks=GPU),
        pytest.param(64, 128256, torch.bfloat16, marks=GPU),
    ],
)
def test_kernel_equals_reference_and_numpy(batch: int, vocab: int, dtype: torch.dtype) -> None:
    """Random words (the sign bit included) on a subset of rows, in any order."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(batch, vocab, generator=g).to(dtype)
    words = (vocab + 31) // 32
    rows = torch.randperm(batch, generator=g)[: max(1, batch // 2)]
    bitmask = torch.randint(-(2**31), 2**31, (rows.shape[0], words), generator=g, dtype=torch.int64)
    bitmask = bitmask.to(torch.int32)
    want = logits.clone()
    reference.apply_token_bitmask(want, bitmask, rows)
    got = logits.to(DEVICE)
    triton_ops.apply_token_bitmask(got, bitmask.to(DEVICE), rows.to(DEVICE))
    assert torch.equal(got.cpu(), want)
    allowed = _allowed_by_numpy(bitmask, vocab)
    for i, row in enumerate(rows.tolist()):
        kept = torch.isfinite(want[row]).numpy()
        assert (kept == allowed[i]).all()
        assert torch.equal(want[row][kept], logits[row][kept])
    untouched = sorted(set(range(batch)) - set(rows.tolist()))
    assert torch.equal(want[untouched], logits[untouched])


def test_ops_rejects_bad_inputs() -> None:
    logits = torch.zeros(2, 64)
    rows = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(KernelError, match="bitmask must be int32"):
        ops.apply_token_bitmask(logits, torch.zeros(1, 2, dtype=torch.int64), rows)
    with pytest.raises(KernelError, match="32 tokens a word"):
        ops.apply_token_bitmask(logits, torch.zeros(1, 3, dtype=torch.int32), rows)
    with pytest.raises(KernelError, match="one per bitmask row"):
        ops.apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int32), rows)
