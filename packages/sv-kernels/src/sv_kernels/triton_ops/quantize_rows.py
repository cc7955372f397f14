# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""Each row of x quantized to FP8 e4m3 with its own scale, in one kernel: the activations of
an FP8 tensor-core matmul (`quantized_ops.scaled_mm`).

`reference.quantize_rows_fp8` is six torch kernels (widen, abs, row max, clamp, divide, cast);
before every FP8 matmul of a decode step at batch 256 those launches cost more than the matmul
saves. Here a program owns one row: it loads the row once, takes its absolute maximum, and
writes the e4m3 values and the scale, the same IEEE operations in the same order (the
division rounded to nearest), so the result is the reference's bit for bit. It launches under
PDL like the step's other Triton kernels, so its launch overlaps the kernel before it (the
RMSNorm, attention or SwiGLU that wrote x).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quantized import MAX_VALUE
from ._common import (
    next_pow2,
    store_fp8_row,
    unit_last_stride,
    use_pdl,
    wait_for_prior_kernels,
)


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    out_ptr,
    scale_ptr,
    K,
    stride_x,
    stride_o,
    MAX: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    mask = cols < K
    wait_for_prior_kernels(USE_PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    store_fp8_row(x, out_ptr + row * stride_o + cols, scale_ptr + row, mask, MAX)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (e4m3 values [T, K], FP32 scales [T, 1]); see `reference.quantize_rows_fp8`."""
    x = unit_last_stride(x)
    rows, k = x.shape
    out = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows == 0:
        return out, scale
    block = max(16, next_pow2(k))
    pdl = use_pdl(x.device)
    _quantize_rows_kernel[(rows,)](
        x,
        out,
        scale,
        k,
        x.stride(0),
        out.stride(0),
        MAX=MAX_VALUE["fp8"],
        BLOCK_K=block,
        USE_PDL=pdl,
        num_warps=8 if block >= 4096 else 4,
        launch_pdl=pdl,
    )
    return out, scale
