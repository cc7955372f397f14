# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""A grammar's token bitmask applied to the logits: disallowed tokens get -inf, in place.

The host computes one bitmask row per constrained request (bit t % 32 of word t // 32 set:
token t may come next) while the GPU runs the step's forward pass; this kernel, just before
sampling, writes -inf into the logits of every disallowed token of those rows. One program per
(masked row, tile of the vocabulary): each reads its words once and writes only the disallowed
entries, so an almost free grammar position (a JSON string) costs little more than the read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, use_pdl, wait_for_prior_kernels

_TILE = 4096  # vocabulary entries per program: 128 words of the bitmask


@triton.jit
def _token_bitmask_kernel(
    logits_ptr,
    logits_stride,
    bitmask_ptr,
    words,
    rows_ptr,
    vocab,
    TILE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    masked = tl.program_id(0)
    offs = tl.program_id(1) * TILE + tl.arange(0, TILE)
    inside = offs < vocab
    row = tl.load(rows_ptr + masked).to(tl.int64)
    word = tl.load(bitmask_ptr + masked.to(tl.int64) * words + offs // 32, mask=inside, other=-1)
    allowed = ((word >> (offs % 32)) & 1) != 0
    tl.store(
        logits_ptr + row * logits_stride + offs,
        tl.full((TILE,), float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty),
        mask=inside & ~allowed,
    )


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """Row rows[i] of logits [B, V] keeps only the tokens bitmask[i] allows; see
    `reference.apply_token_bitmask`."""
    num_masked = bitmask.shape[0]
    vocab = logits.shape[1]
    if num_masked == 0 or vocab == 0:
        return
    pdl = use_pdl(logits.device)
    _token_bitmask_kernel[(num_masked, cdiv(vocab, _TILE))](
        logits,
        logits.stride(0),
        bitmask.contiguous(),
        bitmask.shape[1],
        rows.contiguous(),
        vocab,
        TILE=_TILE,
        USE_PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )
