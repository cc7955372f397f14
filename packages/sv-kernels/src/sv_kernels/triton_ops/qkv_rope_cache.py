# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""The q/k/v projection with RoPE and the KV-cache write in its epilogue: one kernel.

A decode step otherwise runs the q/k/v matmul, then `rope_cache_write` on its output: a
second launch per layer whose work is a few KiB, so its cost is launch and dependency latency.
Here the matmul's programs finish the job themselves. A program streams BLOCK_N rows of the
packed [q; k; v] weight as the plain kernel does, but its rows are chosen in RoPE's pairs:
BLOCK_N / 2 features j of one head and the features j + D/2 that rotate with them (as the
SwiGLU epilogues pair gate rows with up rows). With the dot products done,
`rope_cache.rope_cache_epilogue` rotates a query head's pairs and writes them to q, rotates a
key head's and writes them into the tokens' cache slots, and writes a value head's to the slots
as they are. Every value is rounded as the unfused path rounds it (the projection to x's dtype,
the rotated k to x's dtype, then to the cache's): one row under the interpreter gives the
same bits; compiled, each kernel may contract the rotation's multiply-adds into FMAs its own
way, and a matmul of several rows may add its products in another order, so a rare value (1 of
32,768 in a GPU test) rounds the other way.

One token (a batch-1 decode step) runs the GEMV below, with the tile tuned for the plain GEMV
of the same weight: the programs stream the same rows, only in another order. 2 to 16 tokens
(a verify step, a small decode batch) run the few-row kernel (`few_rows_linear(rope=...)`) with
its tuned tile, whose last program per tile applies the same epilogue. A tile's BLOCK_N must
hold whole pairs of one head (`fits`). On the H200 at Llama 3.2 1B shapes (BENCHMARKS.md run
99, one process, the two paths in turn) a batch-1 decode step took 780 against 809 us in BF16,
585 against 602 with FP8 weights and 640 against 671 with int8 ones.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelError
from ..linear_plan import FewRowsTile, GemvTile
from . import few_rows
from ._common import unit_last_stride, use_pdl
from .gemv import _dot_rows, _paired_halves
from .rope_cache import RopeCache, rope_cache_epilogue


@triton.jit
def _qkv_rope_cache_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    scale_ptr,
    N,
    K,
    stride_wn,
    rope_cache,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SCALED: tl.constexpr,
    ONE_BYTE: tl.constexpr,
    INT8: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    HALF_BLOCK: tl.constexpr = BLOCK_N // 2
    # The program's pairs: features j .. j + HALF_BLOCK - 1 of one head (HALF_BLOCK divides
    # HALF, so they never straddle two heads) and their partners D/2 further on.
    first = tl.program_id(0) * HALF_BLOCK
    head = first // HALF
    j = first % HALF + tl.arange(0, HALF_BLOCK)
    r = tl.arange(0, BLOCK_N)
    rows = head * HEAD_DIM + first % HALF + r % HALF_BLOCK + (r // HALF_BLOCK) * HALF
    row_mask = rows < N
    y = _dot_rows(
        x_ptr, w_ptr, rows, row_mask, K, stride_wn, BLOCK_N, BLOCK_K, USE_PDL, ONE_BYTE, INT8
    )
    if SCALED:  # a quantized weight: row r stands for data[r] * scale[r]
        y = y * tl.load(scale_ptr + rows)
        if HAS_BIAS:  # `quantized_ops.linear` adds the bias to the rounded product
            y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows).to(tl.float32)
    # The projection's output as `linear` stores it (x's dtype), then its two halves.
    y1, y2 = _paired_halves(y.to(x_ptr.dtype.element_ty).to(tl.float32), HALF_BLOCK)
    one = tl.arange(0, 1)  # the one token, as a tile of one row
    rope_cache_epilogue(
        y1[None, :],
        y2[None, :],
        one,
        one < 1,
        head,
        j,
        rope_cache,
        NUM_Q_HEADS,
        NUM_KV_HEADS,
        HEAD_DIM,
        PAGE_SIZE,
        FP8_CACHE,
    )


def fits(block_n: int, head_dim: int) -> bool:
    """Whether a tile of BLOCK_N weight rows holds whole RoPE pairs of one head (BLOCK_N even,
    BLOCK_N / 2 dividing D / 2): the GEMV's and the few-row kernel's condition for the
    epilogue."""
    return block_n % 2 == 0 and head_dim % 2 == 0 and (head_dim // 2) % (block_n // 2) == 0


def qkv_rope_cache(
    x: torch.Tensor,
    w: torch.Tensor,
    tile: GemvTile | FewRowsTile,
    num_q_heads: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_scales: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ w [(Hq + 2 Hkv) D, K]^T (+ bias), then RoPE and the cache write of
    `rope_cache_write` as the kernel's epilogue; returns the rotated q [M, Hq, D] in x's dtype.
    One row runs the GEMV with a `GemvTile`, 2 to FEW_ROWS rows the few-row kernel with a
    `FewRowsTile` (unquantized weights only).

    `scale` [N] (FP32) marks w as quantized (row n stands for w[n] * scale[n]), as in `gemv`.
    The caller (`ops.qkv_rope_cache`) has checked the shapes; the tile must `fits` D.
    """
    rope = RopeCache(num_q_heads, positions, cos, sin, k_cache, v_cache, slot_mapping, kv_scales)
    if not fits(tile[0], rope.head_dim):
        raise KernelError(
            f"qkv_rope_cache: tile {tile} does not hold whole RoPE pairs of head dim "
            f"{rope.head_dim}"
        )
    if x.shape[0] != 1:
        if scale is not None or len(tile) != 5:
            raise KernelError(
                "qkv_rope_cache: 2 or more rows take an unquantized weight and a few-row tile"
            )
        return few_rows.few_rows_linear(x, w, tile, bias=bias, rope=rope)
    if len(tile) != 3:
        raise KernelError(f"qkv_rope_cache: one row takes a GEMV tile, got {tile}")
    block_n, block_k, warps = tile
    n, k = w.shape
    x, w = x.contiguous(), unit_last_stride(w)
    q = torch.empty((1, rope.num_q_heads, rope.head_dim), dtype=x.dtype, device=x.device)
    pdl = use_pdl(x.device)
    _qkv_rope_cache_kernel[(n // block_n,)](
        x,
        w,
        q if bias is None else bias.contiguous(),  # unread without a bias
        w if scale is None else scale,  # unread when unscaled
        n,
        k,
        w.stride(0),
        rope.args(q),
        **rope.constexprs(),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        USE_PDL=pdl,
        HAS_BIAS=bias is not None,
        SCALED=scale is not None,
        ONE_BYTE=w.element_size() == 1,
        INT8=w.dtype == torch.int8,
        num_warps=warps,
        launch_pdl=pdl,
    )
    return q
