# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""RMSNorm fused with the residual add: one read of x and residual, one write of each result.

x may be an FP8 matmul's unscaled product (`quantized.ScaledProduct`): its row and column
scales are applied as it is read, `scale_product`'s operations rounded to the residual's dtype,
so the sum is the bits of `scale_product` followed by this kernel.

With `fp8_rows` the normalized row is written as the FP8 matmul's activations instead
(`quantized.FP8Rows`): its e4m3 values and scale, computed from the rounded normalized values
with `quantize_rows`' operations in its order, so the bits are those of `quantize_rows_fp8`
applied to the plain output."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelError
from ..quantized import MAX_VALUE, FP8Rows, ScaledProduct
from ._common import (
    next_pow2,
    rows_2d,
    store_fp8_row,
    unit_last_stride,
    use_pdl,
    wait_for_prior_kernels,
)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    fp8_scale_ptr,
    row_scale_ptr,
    col_scale_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    HAS_RESIDUAL: tl.constexpr,
    SCALED: tl.constexpr,
    FP8_ROWS: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    in_row = cols < hidden
    w = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)  # a weight: no wait
    wait_for_prior_kernels(USE_PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=in_row, other=0.0)
    s = x.to(tl.float32)
    if SCALED:  # an FP32 product: scale_product's operations, rounded to the sum's dtype
        c = tl.load(col_scale_ptr + cols, mask=in_row, other=0.0)
        s = ((s * tl.load(row_scale_ptr + row)) * c).to(sum_ptr.dtype.element_ty).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=in_row, other=0.0)
        # The sum is the residual stream: stored in x's dtype, and the norm sees the rounded value.
        s_stored = (s + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_s + cols, s_stored, mask=in_row)
        s = s_stored.to(tl.float32)
    mean_square = tl.sum(s * s, axis=0) / hidden
    inv_rms = 1.0 / tl.sqrt_rn(mean_square + eps)
    # Round to x's dtype (the sum's) before the weight multiply, as Hugging Face Llama does.
    normed = (s * inv_rms).to(sum_ptr.dtype.element_ty).to(tl.float32)
    if FP8_ROWS:  # out_ptr takes e4m3 values, fp8_scale_ptr the row's scale (x's dtype out)
        y = (w * normed).to(sum_ptr.dtype.element_ty).to(tl.float32)
        store_fp8_row(y, out_ptr + row * stride_o + cols, fp8_scale_ptr + row, in_row, FP8_MAX)
    else:
        y = (w * normed).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * stride_o + cols, y, mask=in_row)


def rms_norm(
    x: torch.Tensor | ScaledProduct,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    fp8_rows: bool = False,
) -> tuple[torch.Tensor | FP8Rows, torch.Tensor]:
    """RMSNorm of (x + residual) times weight; returns (normalized, sum). See `reference.rms_norm`.
    With `fp8_rows` (x 2-D, weight of x's dtype) the normalized rows come as `FP8Rows`. x may
    be a `ScaledProduct` (with a residual), scaled as it is read."""
    scales: tuple[torch.Tensor, torch.Tensor] | None = None
    if isinstance(x, ScaledProduct):
        if residual is None:
            raise KernelError("rms_norm: a scaled product needs a residual")
        scales = (x.row_scale.contiguous(), x.col_scale.contiguous())
        x2, dtype = unit_last_stride(x.product), x.dtype
    else:
        x2, dtype = rows_2d(x), x.dtype
    hidden = x.shape[-1]
    num_rows = x2.shape[0]
    # torch's `weight * normed` promotes (bf16 weight, bf16 x -> bf16; fp32 weight -> fp32).
    out_dtype = torch.promote_types(weight.dtype, dtype)
    fp8_scale = x2  # unused without fp8_rows; any pointer will do
    if fp8_rows:
        if len(x.shape) != 2 or out_dtype != dtype:
            raise KernelError(
                f"rms_norm: FP8 rows need x [T, H] and a weight of x's dtype, got x "
                f"{list(x.shape)} {dtype}, weight {weight.dtype}"
            )
        out_dtype = torch.float8_e4m3fn
        fp8_scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    out = torch.empty((num_rows, hidden), dtype=out_dtype, device=x.device)
    if residual is None:
        s2 = x2
        r2 = x2  # unused (HAS_RESIDUAL=False); any pointer will do
    else:
        r2 = rows_2d(residual)
        s2 = torch.empty((num_rows, hidden), dtype=dtype, device=x.device)
    if num_rows > 0 and hidden > 0:
        block_h = next_pow2(hidden)
        pdl = use_pdl(x.device)
        _rms_norm_kernel[(num_rows,)](
            x2,
            r2,
            weight.contiguous(),
            out,
            s2,
            fp8_scale,
            *(scales or (x2, x2)),  # unread without a scaled product
            hidden,
            eps,
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            s2.stride(0),
            HAS_RESIDUAL=residual is not None,
            SCALED=scales is not None,
            FP8_ROWS=fp8_rows,
            FP8_MAX=MAX_VALUE["fp8"],
            BLOCK_H=block_h,
            USE_PDL=pdl,
            num_warps=max(1, min(16, block_h // 256)),
            launch_pdl=pdl,
        )
    if residual is None:
        assert isinstance(x, torch.Tensor)  # a scaled product was refused above
        s = x
    else:
        s = s2.view(x.shape)
    if fp8_rows:
        return FP8Rows(out, fp8_scale, dtype), s
    return out.view(x.shape), s
