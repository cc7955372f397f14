# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""The batch-1 q/k/v projection with RoPE and the KV-cache write in its epilogue: one kernel.

A decode step of one sequence otherwise runs the q/k/v GEMV (`gemv`), then `rope_cache_write`
on its output: a second launch per layer whose work is a few KiB, so its cost is launch and
dependency latency. Here the GEMV's programs finish the job themselves. A program streams
BLOCK_N rows of the packed [q; k; v] weight as the plain GEMV does, but its rows are chosen in
RoPE's pairs: BLOCK_N / 2 features j of one head and the features j + D/2 that rotate with them
(as the SwiGLU epilogue pairs gate rows with up rows). With the dot products done, a program
of a query head rotates its pairs and writes them to q; one of a key head rotates them and
writes them into the token's cache slot; one of a value head writes them to the slot as they are.
Every value is rounded as the unfused path rounds it (the projection to x's dtype, the rotated
k to x's dtype, then to the cache's), so both give the same bits.

It uses the tile tuned for the plain GEMV of the same weight: the programs stream the same
rows, only in another order. The tile's BLOCK_N must be even and at most the head dim.
On the H200 at Llama 3.2 1B shapes (BENCHMARKS.md run 99, one process, the two paths in turn)
a batch-1 decode step took 780 against 809 us in BF16, 585 against 602 with FP8 weights and
640 against 671 with int8 ones.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelError
from ..linear_plan import GemvTile
from ._common import use_pdl
from .gemv import _dot_rows, _paired_halves
from .rope_cache import _saturate


@triton.jit
def _qkv_rope_cache_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    scale_ptr,
    q_out_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    slots_ptr,
    k_cache_ptr,
    v_cache_ptr,
    kv_scales_ptr,
    N,
    K,
    stride_wn,
    stride_cos,
    num_positions,
    stride_kc_page,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_page,
    stride_vc_slot,
    stride_vc_head,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SCALED: tl.constexpr,
    ONE_BYTE: tl.constexpr,
    INT8: tl.constexpr,
    FP8_CACHE: tl.constexpr,
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
    x1, x2 = _paired_halves(y.to(x_ptr.dtype.element_ty).to(tl.float32), HALF_BLOCK)
    if head < NUM_Q_HEADS + NUM_KV_HEADS:  # q or k: rotate (see rope_cache_write)
        position = tl.load(positions_ptr).to(tl.int64)
        # Outside the table: cos = sin = 0, as `rope_cache_write` reads it.
        in_table = (position >= 0) & (position < num_positions)
        cos = tl.load(cos_ptr + position * stride_cos + j, mask=in_table, other=0.0)
        sin = tl.load(sin_ptr + position * stride_cos + j, mask=in_table, other=0.0)
        x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if head < NUM_Q_HEADS:
        q_out = q_out_ptr + head * HEAD_DIM + j
        tl.store(q_out, x1.to(q_out_ptr.dtype.element_ty))
        tl.store(q_out + HALF, x2.to(q_out_ptr.dtype.element_ty))
    else:
        slot = tl.load(slots_ptr).to(tl.int64)
        if slot >= 0:  # a negative slot is padding: nothing to write
            page = slot // PAGE_SIZE
            in_page = slot % PAGE_SIZE
            if head < NUM_Q_HEADS + NUM_KV_HEADS:
                kv_head = head - NUM_Q_HEADS
                k_slot = k_cache_ptr + page * stride_kc_page + in_page * stride_kc_slot
                k_slot += kv_head * stride_kc_head
                # The rotated k is rounded to x's dtype first, as the unfused path stores it.
                x1 = x1.to(x_ptr.dtype.element_ty).to(tl.float32)
                x2 = x2.to(x_ptr.dtype.element_ty).to(tl.float32)
                _write_slot(k_slot + j, x1, x2, kv_scales_ptr + kv_head, HALF, FP8_CACHE)
            else:
                kv_head = head - NUM_Q_HEADS - NUM_KV_HEADS
                v_slot = v_cache_ptr + page * stride_vc_page + in_page * stride_vc_slot
                v_slot += kv_head * stride_vc_head
                v_scale = kv_scales_ptr + NUM_KV_HEADS + kv_head
                _write_slot(v_slot + j, x1, x2, v_scale, HALF, FP8_CACHE)


@triton.jit
def _write_slot(cache, x1, x2, scale_ptr, HALF: tl.constexpr, FP8_CACHE: tl.constexpr):
    """Store a pair's halves at `cache` and `cache + HALF`; an FP8 cache takes x / its head's
    scale, saturated (see reference.quantize_kv)."""
    if FP8_CACHE:
        kv_scale = tl.load(scale_ptr)
        x1 = _saturate(x1 / kv_scale)
        x2 = _saturate(x2 / kv_scale)
    tl.store(cache, x1.to(cache.dtype.element_ty))
    tl.store(cache + HALF, x2.to(cache.dtype.element_ty))


def fits(config: GemvTile, head_dim: int) -> bool:
    """Whether a GEMV tile can run this kernel: its rows must be whole RoPE pairs of one head
    (BLOCK_N even, BLOCK_N / 2 dividing D / 2)."""
    block_n = config[0]
    return block_n % 2 == 0 and head_dim % 2 == 0 and (head_dim // 2) % (block_n // 2) == 0


def qkv_rope_cache(
    x: torch.Tensor,
    w: torch.Tensor,
    config: GemvTile,
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
    """x [1, K] @ w [(Hq + 2 Hkv) D, K]^T (+ bias), then RoPE and the cache write of
    `rope_cache_write`, in one kernel; returns the rotated q [1, Hq, D] in x's dtype.

    `scale` [N] (FP32) marks w as quantized (row n stands for w[n] * scale[n]), as in `gemv`.
    The caller (`ops.qkv_rope_cache`) has checked the shapes; `config` must `fits` D.
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    n, k = w.shape
    if not fits(config, head_dim):
        raise KernelError(
            f"qkv_rope_cache: tile {config} does not hold whole RoPE pairs of head dim {head_dim}"
        )
    block_n, block_k, warps = config
    x = x.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    if cos.stride(0) != sin.stride(0) or cos.stride(1) != 1 or sin.stride(1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    q = torch.empty((1, num_q_heads, head_dim), dtype=x.dtype, device=x.device)
    pdl = use_pdl(x.device)
    _qkv_rope_cache_kernel[(n // block_n,)](
        x,
        w,
        q if bias is None else bias.contiguous(),  # unread without a bias
        w if scale is None else scale,  # unread when unscaled
        q,
        positions,
        cos,
        sin,
        slot_mapping,
        k_cache,
        v_cache,
        kv_scales if kv_scales is not None else slot_mapping,  # unread without an FP8 cache
        n,
        k,
        w.stride(0),
        cos.stride(0),
        cos.shape[0],
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE_SIZE=k_cache.shape[1],
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        USE_PDL=pdl,
        HAS_BIAS=bias is not None,
        SCALED=scale is not None,
        ONE_BYTE=w.element_size() == 1,
        INT8=w.dtype == torch.int8,
        FP8_CACHE=kv_scales is not None,
        num_warps=warps,
        launch_pdl=pdl,
    )
    return q
