# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""SwiGLU on the packed gate/up projection: out = silu(gate) * up."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, next_pow2, rows_2d, use_pdl, wait_for_prior_kernels

# 1024 bf16 per program: 4 warps x 32 threads x one 16-byte vector of gate and one of up.
_BLOCK = 1024


@triton.jit
def _swiglu_kernel(
    gate_up_ptr, out_ptr, inter, stride_in, stride_out, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    wait_for_prior_kernels(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < inter
    base = gate_up_ptr + row * stride_in
    gate = tl.load(base + cols, mask=in_row, other=0.0).to(tl.float32)
    up = tl.load(base + inter + cols, mask=in_row, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(
        out_ptr + row * stride_out + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=in_row
    )


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up on a packed [..., 2I] projection -> [..., I]. See `reference.swiglu`."""
    inter = gate_up.shape[-1] // 2
    x2 = rows_2d(gate_up)
    num_rows = x2.shape[0]
    out = torch.empty((num_rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    if num_rows > 0 and inter > 0:
        block = min(_BLOCK, next_pow2(inter))
        pdl = use_pdl(gate_up.device)
        _swiglu_kernel[(num_rows, cdiv(inter, block))](
            x2,
            out,
            inter,
            x2.stride(0),
            out.stride(0),
            BLOCK=block,
            USE_PDL=pdl,
            num_warps=max(1, min(4, block // 256)),
            launch_pdl=pdl,
        )
    return out.view(*gate_up.shape[:-1], inter)
