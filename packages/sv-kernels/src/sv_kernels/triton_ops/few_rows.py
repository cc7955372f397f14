# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""y = x @ W^T for 2 to 16 rows x: a verify step of speculative decoding, or a small decode batch.

At a few rows a linear layer still reads every weight once for very little arithmetic, so like
the batch-1 GEMV it is bound by how many weight bytes the GPU keeps in flight. cuBLAS runs it
on GEMM tiles whose grids for Llama 3.2 1B's small matrices (q/k/v, o, down) are a few hundred
programs each walking all of K: ~6 us for q/k/v and o where the batch-1 GEMV takes 3.3-4.6, and
a verify step of 2-16 rows paid ~0.15-0.18 ms more than a batch-1 step for it (BENCHMARKS.md,
runs 77-78 and 88).

This kernel multiplies on the tensor cores (`tl.dot`, all rows padded to BLOCK_M = 16) and cuts
K as well as N: program (n, s) owns BLOCK_N output features and the s-th of SPLIT_K slices of
K, so a small matrix gets a thousand programs, as the GEMV's grid has. Its first tile of
weights is loaded before waiting for the kernel that writes x (PDL, see `_common`): weights are
never written in a step. With SPLIT_K > 1 each program writes its FP32 partial sums to a
scratch buffer and counts itself in a per-tile counter; the program that counts last adds the
SPLIT_K partials in order (so the result does not depend on which finished first), writes the
output and sets the counter back to 0 for the next call. The counters are one zeroed buffer
per device (`_counters`), made before any graph capture by the tuner; every kernel leaves
them zero, and a kernel touches them only after its PDL wait, when the previous kernel on the
stream has finished. Two streams must not run split kernels on one device at the same time.

The epilogues are the GEMV's: a bias added to the FP32 sums, results rounded to x's dtype
before the output dtype (so a verify step's logits round as a batch-1 step's do), and
`swiglu=True` for the packed gate/up projection (a tile's rows are gate and up features
interleaved, and it writes silu(gate) * up), and `rope=` for the packed q/k/v projection (a
tile's rows are RoPE pairs of one head interleaved, and it writes the rotated q and the
tokens' K/V cache slots: see `qkv_rope_cache`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelError
from ..linear_plan import FEW_ROWS, FewRowsTile
from ._common import cdiv, dot_dtype, dot_precision, use_pdl, wait_for_prior_kernels
from .rope_cache import RopeCache, rope_cache_epilogue


@triton.jit
def _finish(
    acc,
    x_ptr,
    bias_ptr,
    out_ptr,
    pid_n,
    M,
    N,
    stride_om,
    rope_cache,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GATED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    ROPE: tl.constexpr,
):
    """Write one tile's sums acc [BLOCK_M, BLOCK_N] (FP32) as `gemv`'s epilogue does, or with
    ROPE as `qkv_rope_cache`'s (the tile's even rows features j of one head, its odd rows
    j + D/2: out is q [M, Hq, D])."""
    m = tl.arange(0, BLOCK_M)
    m_mask = m < M
    if ROPE:
        PAIRS: tl.constexpr = BLOCK_N // 2
        if HAS_BIAS:
            r = tl.arange(0, BLOCK_N)
            first = pid_n * PAIRS
            rows = (first // (HEAD_DIM // 2)) * HEAD_DIM + first % (HEAD_DIM // 2) + r // 2
            rows += (r % 2) * (HEAD_DIM // 2)
            acc += tl.load(bias_ptr + rows).to(tl.float32)[None, :]
        rounded = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
        y1, y2 = tl.split(tl.reshape(rounded, (BLOCK_M, PAIRS, 2)))
        first = pid_n * PAIRS
        j = first % (HEAD_DIM // 2) + tl.arange(0, PAIRS)
        rope_cache_epilogue(
            y1,
            y2,
            m,
            m_mask,
            first // (HEAD_DIM // 2),
            j,
            rope_cache,
            NUM_Q_HEADS,
            NUM_KV_HEADS,
            HEAD_DIM,
            PAGE_SIZE,
            FP8_CACHE,
        )
    elif GATED:
        HALF: tl.constexpr = BLOCK_N // 2
        rounded = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
        gate, up = tl.split(tl.reshape(rounded, (BLOCK_M, HALF, 2)))
        features = pid_n * HALF + tl.arange(0, HALF)
        silu = gate / (1.0 + tl.exp(-gate))
        mask = m_mask[:, None] & (features < N // 2)[None, :]
        ptrs = out_ptr + m[:, None] * stride_om + features[None, :]
        tl.store(ptrs, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        out = acc.to(x_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty)
        ptrs = out_ptr + m[:, None] * stride_om + cols[None, :]
        tl.store(ptrs, out, mask=m_mask[:, None] & col_mask[None, :])


@triton.jit
def _few_rows_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    partial_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    K_PER_SPLIT,
    rope_cache,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    STAGES: tl.constexpr,
    USE_PDL: tl.constexpr,
    GATED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    ROPE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = tl.arange(0, BLOCK_N)
    if ROPE:  # W is [q; k; v]: even tile rows are features j of one head, odd ones j + D/2
        HALF: tl.constexpr = HEAD_DIM // 2
        first = pid_n * (BLOCK_N // 2)
        rows = (first // HALF) * HEAD_DIM + first % HALF + r // 2 + (r % 2) * HALF
        row_mask = rows < N
    elif GATED:  # W is [gate; up]: even tile rows are gate features, odd ones the same up's
        features = pid_n * (BLOCK_N // 2) + r // 2
        rows = features + (r % 2) * (N // 2)
        row_mask = features < N // 2
    else:
        rows = pid_n * BLOCK_N + r
        row_mask = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    k_start = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    m = tl.arange(0, BLOCK_M)
    x_rows = x_ptr + m[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # The split's first slice of weights is requested before the PDL wait; the rest (none
    # when one slice covers the split) go through Triton's software pipeline of STAGES stages.
    cols = k_start + tl.arange(0, BLOCK_K)
    w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & (cols < k_end)[None, :], other=0.0)
    wait_for_prior_kernels(USE_PDL)
    x = tl.load(x_rows + cols[None, :], mask=(m < M)[:, None] & (cols < k_end)[None, :], other=0.0)
    acc = tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc, input_precision=PRECISION)
    for k0 in tl.range(k_start + BLOCK_K, k_end, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        w_mask = row_mask[:, None] & (cols < k_end)[None, :]
        w = tl.load(w_rows + cols[None, :], mask=w_mask, other=0.0)
        x_mask = (m < M)[:, None] & (cols < k_end)[None, :]
        x = tl.load(x_rows + cols[None, :], mask=x_mask, other=0.0)
        acc = tl.dot(x.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc, input_precision=PRECISION)
    last = True  # this program writes the tile: always, unless K is split
    if SPLIT:
        tile = m[:, None] * BLOCK_N + r[None, :]
        tiles = tl.num_programs(0)
        splits = tl.num_programs(1)
        tl.store(partial_ptr + (pid_k * tiles + pid_n) * (BLOCK_M * BLOCK_N) + tile, acc)
        tl.debug_barrier()  # every thread's partial stored before the count is released
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        last = arrived == splits - 1  # the last of this tile's programs adds the partials
        if last:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(splits):
                at = partial_ptr + (s * tiles + pid_n) * (BLOCK_M * BLOCK_N) + tile
                acc += tl.load(at, cache_modifier=".cg")
    if last:
        _finish(
            acc,
            x_ptr,
            bias_ptr,
            out_ptr,
            pid_n,
            M,
            N,
            stride_om,
            rope_cache,
            BLOCK_M,
            BLOCK_N,
            GATED,
            HAS_BIAS,
            NUM_Q_HEADS,
            NUM_KV_HEADS,
            HEAD_DIM,
            PAGE_SIZE,
            FP8_CACHE,
            ROPE,
        )
        if SPLIT:
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")


# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, STAGES) candidates; the tuner keeps the fastest per
# shape, or cuBLAS. From a sweep of 462 tiles over Llama 3.2 1B's matrices at 16 rows on the
# H200 (BENCHMARKS.md run 91), the best two or three of each: q/k/v and o (K = 2048) one
# 512-wide slice per program in 4 splits, or 256-wide in 8; gate/up and the LM head (many
# rows) no split, pipelined; down (K = 8192) 8 splits, pipelined. One small-K tile besides.
CONFIGS: tuple[FewRowsTile, ...] = (
    (32, 512, 4, 4, 1),
    (64, 256, 8, 4, 1),
    (64, 256, 8, 8, 1),
    (32, 256, 8, 4, 1),
    (64, 256, 1, 4, 3),
    (32, 256, 1, 4, 3),
    (32, 256, 8, 4, 3),
    (64, 256, 8, 4, 3),
    (64, 128, 1, 4, 3),
    (32, 128, 1, 4, 3),
    (16, 128, 4, 4, 1),
)

# A device's split counters (int32, zero between kernels). Grown only outside a CUDA graph
# capture (a capture would record the allocation's fill into its graph). A buffer outgrown is
# kept, never freed: graphs captured before the growth still hold its address.
_COUNTERS: dict[torch.device, torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []


def _counters(device: torch.device, tiles: int) -> torch.Tensor:
    held = _COUNTERS.get(device)
    if held is not None and held.numel() >= tiles:
        return held
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise KernelError(
            "few_rows_linear: the split-K counters for this weight were not made before the "
            "CUDA graph capture; call prepare_counters (the tuner does) before capturing"
        )
    grown = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
    if held is not None:
        _OUTGROWN.append(held)
    _COUNTERS[device] = grown
    return grown


def _tiles(n: int, block_n: int, swiglu: bool) -> int:
    return cdiv(n // 2, block_n // 2) if swiglu else cdiv(n, block_n)


def prepare_counters(w: torch.Tensor, tile: FewRowsTile, swiglu: bool = False) -> None:
    """Make the split counters weight w needs with `tile`, before a graph captures its calls."""
    block_n, _, split_k, _, _ = tile
    if split_k > 1:
        _counters(w.device, _tiles(w.shape[0], block_n, swiglu))


def few_rows_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    tile: FewRowsTile,
    swiglu: bool = False,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
    rope: RopeCache | None = None,
) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T (+ bias [N]) -> [M, N] in x's dtype (out_dtype if given, rounded to
    x's dtype first), for 1 <= M <= FEW_ROWS; `tile` = (BLOCK_N, BLOCK_K, SPLIT_K, num_warps,
    STAGES): a program's first BLOCK_K slice is loaded before the PDL wait, the rest of its
    split through a software pipeline of STAGES stages (1: none).

    swiglu=True: w is a packed [gate; up] projection [2I, K]; the result is silu(gate) * up
    [M, I], gate and up rounded to x's dtype first (as `swiglu(few_rows_linear(...))`).

    rope: w is a packed [q; k; v] projection and the result is `qkv_rope_cache`'s, the rotated
    q [M, Hq, D], with k and v written to the tokens' cache slots (the tile's BLOCK_N must hold
    whole RoPE pairs, see `qkv_rope_cache.fits`)."""
    rows, k = x.shape
    n = w.shape[0]
    block_n, block_k, split_k, warps, stages = tile
    if not 1 <= rows <= FEW_ROWS:
        raise KernelError(f"few_rows_linear takes 1 to {FEW_ROWS} rows of x, got {rows}")
    if w.shape[1] != k:
        raise KernelError(
            f"few_rows_linear: x has {k} columns but w {list(w.shape)} has {w.shape[1]}"
        )
    if swiglu and (n % 2 or block_n % 2):
        raise KernelError(
            f"few_rows_linear(swiglu=True): w must have an even row count ([gate; up]) and the "
            f"tile an even BLOCK_N; got {n} rows and BLOCK_N {block_n}"
        )
    if swiglu and (bias is not None or out_dtype not in (None, x.dtype)):
        raise KernelError("few_rows_linear(swiglu=True) takes no bias and writes x's dtype")
    if rope is not None and (swiglu or out_dtype not in (None, x.dtype)):
        raise KernelError("few_rows_linear(rope=...) is no SwiGLU and writes x's dtype")
    x = x if x.stride(1) == 1 else x.contiguous()
    w = w if w.stride(1) == 1 else w.contiguous()
    if rope is not None:
        out = torch.empty((rows, rope.num_q_heads, rope.head_dim), dtype=x.dtype, device=x.device)
        rope_args, rope_constexprs = rope.args(out), rope.constexprs()
    else:
        out = torch.empty(
            (rows, n // 2 if swiglu else n), dtype=out_dtype or x.dtype, device=x.device
        )
        rope_args, rope_constexprs = RopeCache.none(out)
    tiles = _tiles(n, block_n, swiglu)
    k_per_split = cdiv(cdiv(k, split_k), block_k) * block_k
    if split_k > 1:
        partials = torch.empty(
            (split_k, tiles, FEW_ROWS, block_n), dtype=torch.float32, device=x.device
        )
        counts = _counters(x.device, tiles)
    else:
        partials = counts = out  # never read
    pdl = use_pdl(x.device)
    _few_rows_kernel[(tiles, split_k)](
        x,
        w,
        out if bias is None else bias.contiguous(),  # unread without a bias
        out,
        partials,
        counts,
        rows,
        n,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        k_per_split,
        rope_args,
        **rope_constexprs,
        BLOCK_M=FEW_ROWS,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT=split_k > 1,
        STAGES=stages,
        USE_PDL=pdl,
        GATED=swiglu,
        HAS_BIAS=bias is not None,
        DOT_DTYPE=dot_dtype(x.dtype),
        PRECISION=dot_precision(x.dtype),
        ROPE=rope is not None,
        num_warps=warps,
        launch_pdl=pdl,
    )
    return out
