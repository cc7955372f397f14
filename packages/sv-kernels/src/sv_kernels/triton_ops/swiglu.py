# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""SwiGLU on the packed gate/up projection: out = silu(gate) * up.

With `fp8_rows` a program owns a whole row and writes it as the down projection's FP8
activations (`quantized.FP8Rows`): the rounded products quantized with `quantize_rows`'
operations in its order, so the bits of `quantize_rows_fp8` applied to the plain output."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelError
from ..quantized import MAX_VALUE, FP8Rows
from ._common import cdiv, next_pow2, rows_2d, store_fp8_row, use_pdl, wait_for_prior_kernels

# 1024 bf16 per program: 4 warps x 32 threads x one 16-byte vector of gate and one of up.
_BLOCK = 1024


@triton.jit
def _swiglu_kernel(
    gate_up_ptr,
    out_ptr,
    fp8_scale_ptr,
    inter,
    stride_in,
    stride_out,
    FP8_ROWS: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < inter
    base = gate_up_ptr + row * stride_in
    gate = tl.load(base + cols, mask=in_row, other=0.0).to(tl.float32)
    up = tl.load(base + inter + cols, mask=in_row, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    if FP8_ROWS:  # the whole row (one program): e4m3 values to out_ptr, its scale beside
        y = (silu * up).to(gate_up_ptr.dtype.element_ty).to(tl.float32)
        out = out_ptr + row * stride_out + cols
        store_fp8_row(y, out, fp8_scale_ptr + row, in_row, FP8_MAX)
    else:
        y = (silu * up).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * stride_out + cols, y, mask=in_row)


def swiglu(gate_up: torch.Tensor, fp8_rows: bool = False) -> torch.Tensor | FP8Rows:
    """silu(gate) * up on a packed [..., 2I] projection -> [..., I]. See `reference.swiglu`.
    With `fp8_rows` (gate_up [T, 2I]) the result comes as `FP8Rows`."""
    inter = gate_up.shape[-1] // 2
    x2 = rows_2d(gate_up)
    num_rows = x2.shape[0]
    fp8_scale = x2  # unused without fp8_rows; any pointer will do
    out_dtype = gate_up.dtype
    if fp8_rows:
        if gate_up.dim() != 2:
            raise KernelError(f"swiglu: FP8 rows need gate_up [T, 2I], got {list(gate_up.shape)}")
        out_dtype = torch.float8_e4m3fn
        fp8_scale = torch.empty((num_rows, 1), dtype=torch.float32, device=gate_up.device)
    out = torch.empty((num_rows, inter), dtype=out_dtype, device=gate_up.device)
    if num_rows > 0 and inter > 0:
        # FP8 rows: a program per row, which takes the row's absolute maximum.
        block = next_pow2(inter) if fp8_rows else min(_BLOCK, next_pow2(inter))
        pdl = use_pdl(gate_up.device)
        _swiglu_kernel[(num_rows, cdiv(inter, block))](
            x2,
            out,
            fp8_scale,
            inter,
            x2.stride(0),
            out.stride(0),
            FP8_ROWS=fp8_rows,
            FP8_MAX=MAX_VALUE["fp8"],
            BLOCK=block,
            USE_PDL=pdl,
            num_warps=max(1, min(8 if fp8_rows else 4, block // 256)),
            launch_pdl=pdl,
        )
    if fp8_rows:
        return FP8Rows(out, fp8_scale, gate_up.dtype)
    return out.view(*gate_up.shape[:-1], inter)
