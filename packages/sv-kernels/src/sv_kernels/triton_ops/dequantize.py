# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""A quantized weight's matrix, data * scale per row, in a 16- or 32-bit type: the values of
`quantized.dequantize` (each product in FP32, rounded once), in one pass at copy bandwidth.

A quantized weight met by more rows than the 8-bit-weight matmul takes (a prompt), or whose
plan chose cuBLAS, is dequantized for cuBLAS on every call. torch's elementwise multiply of int8 or FP8 data by FP32
scales into a 16-bit output ran at ~0.7 TB/s on the H200 (BENCHMARKS.md run 121), several times
slower than the copy its 3 bytes per weight need. Program (r, c) here converts a tile of
BLOCK_R rows by BLOCK_C columns, each row's scale loaded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quantized import QuantizedWeight
from ._common import cdiv, unit_last_stride, use_pdl, wait_for_prior_kernels

_BLOCK_R, _BLOCK_C = 4, 1024


@triton.jit
def _dequantize_kernel(
    data_ptr,
    scale_ptr,
    out_ptr,
    N,
    K,
    stride_dn,
    stride_on,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < N)[:, None] & (cols < K)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    # Weights and scales are never written by a kernel of the step: read before the wait.
    data = tl.load(data_ptr + rows64 * stride_dn + cols[None, :], mask=mask, other=0.0)
    scale = tl.load(scale_ptr + rows, mask=rows < N, other=0.0)
    wait_for_prior_kernels(USE_PDL)
    out = (data.to(tl.float32) * scale[:, None]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows64 * stride_on + cols[None, :], out, mask=mask)


def dequantize(weight: QuantizedWeight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`quantized.dequantize(weight, dtype)`, computed by one Triton kernel."""
    data = unit_last_stride(weight.data)
    n, k = data.shape
    out = torch.empty((n, k), dtype=dtype or weight.dtype, device=data.device)
    if out.numel() == 0:
        return out
    pdl = use_pdl(data.device)
    _dequantize_kernel[(cdiv(n, _BLOCK_R), cdiv(k, _BLOCK_C))](
        data,
        weight.scale.contiguous(),
        out,
        n,
        k,
        data.stride(0),
        out.stride(0),
        BLOCK_R=_BLOCK_R,
        BLOCK_C=_BLOCK_C,
        USE_PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )
    return out
