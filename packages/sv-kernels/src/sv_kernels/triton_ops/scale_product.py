# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""An FP32 product scaled by a scale per row and a scale per column, in one kernel: the
epilogue of `quantized_ops.scaled_mm_tensorwise`, whose FP8 tensor-core matmul runs with unit
scales (cuBLAS's per-tensor kernels) and leaves the per-token and per-channel scales to this.

A program owns BLOCK_N columns of one row and computes (product * row scale) * column scale in
FP32, the reference's operations in its order, so the result is the reference's bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, unit_last_stride, use_pdl, wait_for_prior_kernels

_BLOCK_N = 1024


@triton.jit
def _scale_product_kernel(
    product_ptr,
    row_scale_ptr,
    col_scale_ptr,
    out_ptr,
    N,
    stride_p,
    stride_o,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    wait_for_prior_kernels(USE_PDL)
    p = tl.load(product_ptr + row * stride_p + cols, mask=mask, other=0.0)
    r = tl.load(row_scale_ptr + row)
    c = tl.load(col_scale_ptr + cols, mask=mask, other=0.0)
    y = (p * r) * c
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def scale_product(
    product: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """See `reference.scale_product`."""
    product = unit_last_stride(product)
    row_scale, col_scale = row_scale.contiguous(), col_scale.contiguous()
    rows, n = product.shape
    out = torch.empty((rows, n), dtype=dtype, device=product.device)
    if rows == 0 or n == 0:
        return out
    pdl = use_pdl(product.device)
    _scale_product_kernel[(rows, cdiv(n, _BLOCK_N))](
        product,
        row_scale,
        col_scale,
        out,
        n,
        product.stride(0),
        out.stride(0),
        BLOCK_N=_BLOCK_N,
        USE_PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )
    return out
