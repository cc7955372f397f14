# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""y = (x_q * x_scale) @ (w_q * w_scale)^T on FP8 tensor cores, for decode batches.

An FP8 weight (`QuantizedWeight`, one scale per output channel) multiplied by many rows of
activations, each row quantized to e4m3 with its own scale (`quantize_rows_fp8`): both scales
factor out of every dot product, so a tile's FP32 sums are scaled once in the epilogue.
`torch._scaled_mm` does the same, and at prefill's thousands of rows it is the faster one. At
a decode batch of 64-256 rows its fixed tiles leave the small matrices of Llama 3.2 1B slower
than BF16's cuBLAS (BENCHMARKS.md run 76: q/k/v 8.3 against 6.7 us at 256 rows): too few
output tiles for 132 SMs, each walking all of K. Here the tile is a tuning choice
(`Fp8Tile`, timed per weight by `tune_gemv`), so q/k/v and o can run on small tiles and
the MLP matrices on large ones.

Program p owns output rows [m0, m0 + BLOCK_M) and features [n0, n0 + BLOCK_N); programs that
share a weight tile are neighbours in launch order (the row blocks vary fastest), so the
second reads it from L2. The products accumulate in FP32: Hopper's FP8 tensor cores keep fewer
bits in their running sums than FP32 (Triton lets them run on over all of K by default on
sm_90, as `scaled_mm`'s `use_fast_accum` does), so each BLOCK_K slice's sums are added to the
FP32 accumulator by the kernel, as `scaled_mm` without fast accumulation does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelError
from ..linear_plan import Fp8Tile
from ._common import INTERPRET, cdiv, use_pdl, wait_for_prior_kernels

# The tiles `tune_gemv` times for an FP8 weight's decode batches (scripts/fp8_gemm_sweep.py).
CANDIDATES: tuple[Fp8Tile, ...] = (
    (64, 64, 128, 4, 3),
    (64, 64, 128, 4, 4),
    (64, 128, 128, 4, 4),
    (128, 64, 128, 4, 4),
    (128, 128, 128, 8, 4),
    (128, 128, 64, 8, 4),
)


@triton.jit
def _fp8_gemm_kernel(
    x_ptr,
    x_scale_ptr,
    w_ptr,
    w_scale_ptr,
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
    WIDEN: tl.constexpr,
    IMPRECISE_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    pid = tl.program_id(0)
    row_blocks = tl.cdiv(M, BLOCK_M)
    pid_m = pid % row_blocks
    pid_n = pid // row_blocks
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows < M
    col_mask = cols < N
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k_mask = ks < K - k0
        a = tl.load(x_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=col_mask[:, None] & k_mask[None, :], other=0.0)
        if WIDEN:  # the interpreter has no FP8 dot; every e4m3 value and product is exact in FP32
            a = a.to(tl.float32)
            b = b.to(tl.float32)
            acc += tl.dot(a, tl.trans(b), input_precision="ieee")
        else:  # FP32 sums: each slice's products are added to acc in full FP32 (see above)
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=IMPRECISE_K)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    x_scale = tl.load(x_scale_ptr + rows, mask=row_mask, other=0.0)
    w_scale = tl.load(w_scale_ptr + cols, mask=col_mask, other=0.0)
    out = acc * x_scale[:, None] * w_scale[None, :]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def fp8_gemm(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    tile: Fp8Tile,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    fast_accum: bool = False,
) -> torch.Tensor:
    """(x_q * x_scale) @ (w_q * w_scale)^T: x_q [M, K] and w_q [N, K] e4m3 with unit last
    strides, x_scale [M] or [M, 1] and w_scale [N] FP32; the result [M, N] in `out_dtype`.
    `fast_accum`: let the tensor cores sum all of K in their own precision (for comparisons)."""
    if x_q.dtype != torch.float8_e4m3fn or w_q.dtype != torch.float8_e4m3fn:
        raise KernelError(f"fp8_gemm: operands must be float8_e4m3fn, got {x_q.dtype}, {w_q.dtype}")
    if x_q.dim() != 2 or w_q.dim() != 2 or x_q.shape[1] != w_q.shape[1]:
        raise KernelError(
            f"fp8_gemm: x [M, K] and w [N, K] must agree on K, got {list(x_q.shape)} and "
            f"{list(w_q.shape)}"
        )
    if x_q.stride(1) != 1 or w_q.stride(1) != 1:
        raise KernelError("fp8_gemm: x and w need a unit stride along K")
    m, n, k = x_q.shape[0], w_q.shape[0], x_q.shape[1]
    if x_scale.numel() != m or w_scale.numel() != n:
        raise KernelError(
            f"fp8_gemm: {x_scale.numel()} row scales for {m} rows, {w_scale.numel()} channel "
            f"scales for {n} features"
        )
    block_m, block_n, block_k, warps, stages = tile
    out = torch.empty((m, n), dtype=out_dtype, device=x_q.device)
    if m == 0:
        return out
    pdl = use_pdl(x_q.device)
    _fp8_gemm_kernel[(cdiv(m, block_m) * cdiv(n, block_n),)](
        x_q,
        x_scale,
        w_q,
        w_scale,
        out,
        m,
        n,
        k,
        x_q.stride(0),
        w_q.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        STAGES=stages,
        WIDEN=INTERPRET,
        IMPRECISE_K=1 << 30 if fast_accum else block_k,
        USE_PDL=pdl,
        num_warps=warps,
        launch_pdl=pdl,
    )
    return out
