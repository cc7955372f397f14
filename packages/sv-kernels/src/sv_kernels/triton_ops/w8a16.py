# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""y = x @ (W * s)^T with 8-bit weights W (int8 or FP8 e4m3, one FP32 scale per output row) and
16-bit activations x, for calls of more than one row.

Without it a quantized weight met by a decode batch or a verify step was dequantized to a BF16
copy for cuBLAS on every call: the copy's write and read cost more than the 8-bit weights
saved, and int8's 256-row decode step took 3x BF16's (BENCHMARKS.md, run 121). Here each
program loads a tile of the 8-bit weights, widens it to x's dtype in registers (every int8 and
every e4m3 value is exact in BF16 and FP16) and multiplies on the 16-bit tensor cores; the row
scales multiply the FP32 sums once, in the epilogue, and the result is rounded once to x's dtype.

x's tile is the MMA's left operand and the widened weight tile its right one, which Triton
stages through shared memory. From 64 rows a tile on, both operands come from shared memory and
the asynchronous MMAs of successive K slices overlap (one wait per loop, compiled for sm_90);
16-row tiles, below the asynchronous MMA's 64, run the synchronous one. The other order,
weights as the left operand straight from registers (which sm_90's MMA allows), made Triton
wait for each MMA before the next: 1.2-1.7x slower at 16 rows (q/k/v 10.0 against 8.1 µs,
gate/up 27.3 against 16.1; BENCHMARKS.md run 123), and ahead only on q/k/v at 256 rows.
Programs are ordered with the row blocks of x fastest, so the programs that read one weight
tile run together and share it through L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelError
from ..linear_plan import W8A16_MAX_ROWS
from ._common import (
    cdiv,
    dot_dtype,
    dot_precision,
    unit_last_stride,
    use_pdl,
    wait_for_prior_kernels,
)

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, stages) of a launch.
W8A16Tile = tuple[int, int, int, int, int]


@triton.jit
def _w8a16_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = m < M
    n_mask = n < N
    x_rows = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    wait_for_prior_kernels(USE_PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc, input_precision=PRECISION)
    scale = tl.load(scale_ptr + n, mask=n_mask, other=0.0)
    y = (acc * scale[None, :]).to(out_ptr.dtype.element_ty)
    out = out_ptr + m.to(tl.int64)[:, None] * stride_om + n[None, :]
    tl.store(out, y, mask=m_mask[:, None] & n_mask[None, :])


# (most rows, tile): the launch shape of a call, by its row count (the first entry that holds
# it). From sweeps over Llama 3.2 1B's matrices, int8 weights, on the H200 (BENCHMARKS.md runs
# 123-124), µs against dequantize + cuBLAS and BF16's own cuBLAS:
# - 16 rows: q/k/v 8.4 (11.4, BF16 6.9), o 8.0 (10.1, 6.6), gate/up 16.0 (46.4, 18.7), down
#   24.5 (22.7, 14.2), LM head 80.5 (339, 127);
# - 64 rows: q/k/v 14.8 (11.8, 7.1), gate/up 19.4 (47.2, 19.7), down 47.0 (23.9, 14.8);
# - 256 rows: gate/up 41.4 (55.9, 26.5); q/k/v and down at their best tiles 16.4 (13.1, 8.3)
#   and 56.5 (33.4, 18.8).
# Where dequantizing wins at 64 and 256 rows, the tuner's plan keeps the weight off this kernel.
TILES: tuple[tuple[int, W8A16Tile], ...] = (
    (16, (16, 64, 128, 8, 4)),
    (64, (64, 64, 128, 4, 3)),
    (W8A16_MAX_ROWS, (128, 128, 64, 4, 3)),
)


def default_tile(rows: int) -> W8A16Tile:
    """The launch shape for a call of `rows` rows (see TILES; past W8A16_MAX_ROWS, the last)."""
    return next((tile for most, tile in TILES if rows <= most), TILES[-1][1])


def w8a16_matmul(
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor,
    tile: W8A16Tile | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [M, K] (BF16/FP16; FP32 under the interpreter) times the 8-bit weight `data` [N, K]
    (int8 or float8_e4m3fn) whose row n stands for data[n] * scale[n] (`scale` FP32 [N]):
    returns [M, N] in out_dtype (default x's), rounded once from the FP32 sums. `tile` forces
    a launch shape (for sweeps)."""
    if x.dim() != 2 or data.dim() != 2 or x.shape[1] != data.shape[1]:
        raise KernelError(
            f"w8a16_matmul: x {list(x.shape)} and weight {list(data.shape)} must be [M, K], [N, K]"
        )
    if data.dtype not in (torch.int8, torch.float8_e4m3fn):
        raise KernelError(f"w8a16_matmul: the weight is {data.dtype}, expected int8 or e4m3")
    if scale.shape != (data.shape[0],) or scale.dtype != torch.float32:
        raise KernelError(
            f"w8a16_matmul: scale is {scale.dtype} {list(scale.shape)}, expected FP32 "
            f"[{data.shape[0]}]"
        )
    x, data = unit_last_stride(x), unit_last_stride(data)
    scale = scale.contiguous()
    rows, n, k = x.shape[0], data.shape[0], data.shape[1]
    out = torch.empty((rows, n), dtype=out_dtype or x.dtype, device=x.device)
    if rows == 0:
        return out
    block_m, block_n, block_k, warps, stages = tile or default_tile(rows)
    pdl = use_pdl(x.device)
    _w8a16_kernel[(cdiv(rows, block_m), cdiv(n, block_n))](
        x,
        data,
        scale,
        out,
        rows,
        n,
        k,
        x.stride(0),
        data.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        STAGES=stages,
        DOT_DTYPE=dot_dtype(x.dtype),
        PRECISION=dot_precision(x.dtype),
        USE_PDL=pdl,
        num_warps=warps,
        launch_pdl=pdl,
    )
    return out
