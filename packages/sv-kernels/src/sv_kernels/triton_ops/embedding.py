# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""Embedding gather: out[t] = weight[ids[t]].

A quantized matrix (a tied LM head quantized at load) is gathered and dequantized in the same
kernel, row value times row scale in FP32 as `quantized.dequantize_rows` computes it: the torch
reference is five kernels (two gathers, a widening, a multiply, a narrowing) per decode step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quantized import LinearWeight, QuantizedWeight
from ._common import cdiv, next_pow2, unit_last_stride, use_pdl, wait_for_prior_kernels

# Elements per program along the hidden dim: 2048 bf16 = 4 KiB, one 16-byte vector per thread
# with 8 warps. Wider rows are split over a second grid axis.
_MAX_BLOCK_H = 2048


@triton.jit
def _embedding_kernel(
    ids_ptr,
    weight_ptr,
    out_ptr,
    vocab,
    hidden,
    stride_w,
    stride_o,
    scale_ptr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
    SCALED: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_row = cols < hidden
    row = tl.load(ids_ptr + token).to(tl.int64)
    # An id outside the vocabulary cannot be reported without a host sync; it reads as a zero
    # row instead of faulting (ops-level callers pass tokenizer ids, always in range).
    valid = (row >= 0) & (row < vocab)
    if SCALED:  # 1-byte values; row `row` stands for values * scale[row]
        stored = tl.load(weight_ptr + row * stride_w + cols, mask=in_row & valid, other=0.0)
        scale = tl.load(scale_ptr + row, mask=valid, other=0.0)
        values = (stored.to(tl.float32) * scale).to(out_ptr.dtype.element_ty)
    else:
        values = tl.load(weight_ptr + row * stride_w + cols, mask=in_row & valid, other=0)
    tl.store(out_ptr + token * stride_o + cols, values, mask=in_row)


def embedding(ids: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    """Gather rows of `weight` [V, H] for `ids` [T] -> [T, H] (same as `reference.embedding`;
    a quantized matrix's rows dequantized, in its dtype)."""
    scale = None
    if isinstance(weight, QuantizedWeight):
        out_dtype, scale, weight = weight.dtype, weight.scale, weight.data
    else:
        out_dtype = weight.dtype
    weight, ids = unit_last_stride(weight), ids.contiguous()
    num_tokens, (vocab, hidden) = ids.shape[0], weight.shape
    out = torch.empty((num_tokens, hidden), dtype=out_dtype, device=weight.device)
    if num_tokens == 0 or hidden == 0:
        return out
    block_h = min(next_pow2(hidden), _MAX_BLOCK_H)
    grid = (num_tokens, cdiv(hidden, block_h))
    pdl = use_pdl(weight.device)
    _embedding_kernel[grid](
        ids,
        weight,
        out,
        vocab,
        hidden,
        weight.stride(0),
        out.stride(0),
        weight if scale is None else scale,  # any pointer when unscaled: never read
        BLOCK_H=block_h,
        USE_PDL=pdl,
        SCALED=scale is not None,
        num_warps=max(1, min(8, block_h // 256)),
        launch_pdl=pdl,
    )
    return out
