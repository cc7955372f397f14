# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""Paged decode attention: one query token per sequence, K/V read page by page from the cache.

Grid (B, Hkv, splits). A program owns one sequence, one KV head and one slice of the context:
the query heads that share that KV head (the GQA group) are the M rows of `tl.dot`, so each K/V
page is read once for the whole group. Softmax is online (running max and sum, FP32).

Flash-decoding: when B * Hkv programs would leave SMs idle (small batches, long contexts), the
context is cut into `num_splits` slices; each program writes an unnormalized partial result with
its max and sum, and a second kernel merges the slices. The split count depends only on shapes
(so a CUDA graph can capture it); each program finds its own slice from `seq_lens` on the device.
A context shorter than the split count allows leaves the last splits empty: they write nothing,
and the merge reads only the splits that hold tokens (at decode-b1's few hundred tokens, 3 of
64), so a graph sized for the longest context costs a short one little.

A sliding window of W positions starts the context at `seq_len - W`: the splits share out the
last W positions only, and no page before them is read (its table entry may be stale).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import (
    INTERPRET,
    cdiv,
    dot_dtype,
    dot_precision,
    next_pow2,
    num_sms,
    unit_last_stride,
    use_pdl,
    wait_for_prior_kernels,
)

# A split should stream at least this many tokens, else the merge costs more than it saves.
# Measured on the H200 (graph-timed, batch 1, 8k context): 128-token splits (64 of them) took
# 11.1 us, 256-token splits 13.1 us, 64-token splits 11.5 us.
_MIN_TOKENS_PER_SPLIT = 128
_MAX_SPLITS = 64


@triton.jit
def _context_share(
    seq_len, window, TILE_N: tl.constexpr, NUM_SPLITS: tl.constexpr, SLIDING: tl.constexpr
):
    """(first visible position, tokens per split) of a sequence of `seq_len` tokens: each split
    takes an equal, TILE_N-aligned share of the visible tokens, so at a short context only the
    first few splits hold any."""
    first = 0
    if SLIDING:
        first = tl.maximum(seq_len - window, 0)
    return first, tl.cdiv(tl.cdiv(seq_len - first, NUM_SPLITS), TILE_N) * TILE_N


@triton.jit
def _decode_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    kv_scales_ptr,
    out_ptr,
    partial_acc_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    scale_log2,
    window,
    stride_qb,
    stride_qh,
    stride_kc_page,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_page,
    stride_vc_slot,
    stride_vc_head,
    stride_bt,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    USE_PDL: tl.constexpr,
    SLIDING: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    if FP8_CACHE:  # K's scale folds into the scores, V's into the result: one head each
        scale_log2 = scale_log2 * tl.load(kv_scales_ptr + kv_head)
        v_scale = tl.load(kv_scales_ptr + tl.num_programs(1) + kv_head)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    first, per_split = _context_share(seq_len, window, TILE_N, NUM_SPLITS, SLIDING)
    start = first + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    g = tl.arange(0, BLOCK_G)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_mask = g_mask[:, None] & d_mask[None, :]
    q_offsets = seq * stride_qb + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=q_mask, other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max of the scores (log2 units)
    l_i = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)  # running sum of exp2(score - m_i) * v
    k_head = k_cache_ptr + kv_head * stride_kc_head
    v_head = v_cache_ptr + kv_head * stride_vc_head
    table = block_tables_ptr + seq * stride_bt
    for tile_start in range(start, end, TILE_N):
        tokens = tile_start + tl.arange(0, TILE_N)
        t_mask = tokens < end
        pages = tl.load(table + tokens // PAGE_SIZE, mask=t_mask, other=0).to(tl.int64)
        in_page = tokens % PAGE_SIZE
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_offsets = pages[:, None] * stride_kc_page + in_page[:, None] * stride_kc_slot + d[None, :]
        k = tl.load(k_head + k_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        scores = tl.where(t_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_offsets = pages[:, None] * stride_vc_page + in_page[:, None] * stride_vc_slot + d[None, :]
        v = tl.load(v_head + v_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        pv = tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if FP8_CACHE:
        acc = acc * v_scale

    if NUM_SPLITS == 1:
        # An empty sequence (a padding row) gives zeros, like the reference.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        out_offsets = seq * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        # Partials are laid out [B, Hq, NUM_SPLITS] (+ [D] for the accumulator). A split past
        # the end of the context writes nothing: the merge reads only the splits in use.
        num_q_heads = tl.num_programs(1) * GROUP
        rows = (seq * num_q_heads + heads) * NUM_SPLITS + split
        used = start < end
        tl.store(partial_acc_ptr + rows[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask & used)
        tl.store(partial_max_ptr + rows, m_i, mask=g_mask & used)
        tl.store(partial_sum_ptr + rows, l_i, mask=g_mask & used)


@triton.jit
def _merge_splits_kernel(
    partial_acc_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    seq_lens_ptr,
    out_ptr,
    window,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    TILE_N: tl.constexpr,
    SLIDING: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_prior_kernels(USE_PDL)
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    first_row = (seq * tl.num_programs(1) + head) * NUM_SPLITS
    s = tl.arange(0, BLOCK_S)
    seq_len = tl.load(seq_lens_ptr + seq)
    first, per_split = _context_share(seq_len, window, TILE_N, NUM_SPLITS, SLIDING)
    s_mask = s < tl.cdiv(seq_len - first, tl.maximum(per_split, 1))  # the splits that hold tokens
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)  # this program's share of the head
    d_mask = d < HEAD_DIM
    split_max = tl.load(partial_max_ptr + first_row + s, mask=s_mask, other=float("-inf"))
    split_sum = tl.load(partial_sum_ptr + first_row + s, mask=s_mask, other=0.0)
    overall_max = tl.max(split_max, axis=0)
    # Empty splits (max = -inf) weigh exp2(-inf) = 0. When all are empty (an empty sequence),
    # subtract 0 instead of -inf to keep -inf - -inf = NaN out.
    overall_max = tl.where(overall_max > float("-inf"), overall_max, 0.0)
    weight = tl.exp2(split_max - overall_max)
    total = tl.sum(split_sum * weight, axis=0)
    acc_offsets = (first_row + s)[:, None] * HEAD_DIM + d[None, :]
    acc_mask = s_mask[:, None] & d_mask[None, :]
    split_acc = tl.load(partial_acc_ptr + acc_offsets, mask=acc_mask, other=0.0)
    out = tl.sum(split_acc * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def _operand_dtype(dtype: torch.dtype, fp8_cache: bool) -> tl.dtype:
    """The operand type of the kernel's tl.dot for queries of `dtype`.

    With FP8 (e4m3) pages, 16-bit queries multiply in FP16: sm_90 widens e4m3 to FP16 in one
    packed instruction per two values, where BF16 takes a further F2F per value, and those
    conversions bounded the FP8 read. Measured on the H200 (BENCHMARKS.md run 97, batch 1,
    graph-timed): 61.5 -> 49.5 us at 100k tokens, 23.0 -> 19.3 at 32k, 161 -> 143 us for 256
    sequences of 1k, each as far from the FP32 reference as before. Every e4m3 value is exact
    in FP16, a BF16 query keeps its 8 mantissa bits in FP16's 11 (queries beyond FP16's 65,504
    aside), and products accumulate in FP32 either way. The prefill kernel keeps BF16: in FP16
    its wgmma path needs 140 registers a thread against 110, a CTA fewer per SM.
    """
    if fp8_cache and not INTERPRET and dtype in (torch.bfloat16, torch.float16):
        return tl.float16
    return dot_dtype(dtype)


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, sms: int) -> int:
    """Context slices per (sequence, KV head), from shapes only.

    No split when B * Hkv programs already give every SM two; otherwise enough slices for
    about four programs per SM, each slice at least `_MIN_TOKENS_PER_SPLIT` tokens of the
    longest context the block tables can describe.
    """
    programs = batch * num_kv_heads
    if programs >= 2 * sms:
        return 1
    wanted = cdiv(4 * sms, max(1, programs))
    by_length = cdiv(max_context, _MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, by_length, _MAX_SPLITS))


def default_num_splits(
    batch: int,
    num_kv_heads: int,
    block_tables: torch.Tensor,
    page_size: int,
    sliding_window: int | None,
    device: torch.device,
) -> int:
    """`choose_num_splits` for a call of `batch` sequences: the longest context their block
    tables (or the sliding window) allow, on `device`'s SMs."""
    max_context = block_tables.shape[1] * page_size
    if sliding_window is not None:
        max_context = min(max_context, sliding_window)
    return choose_num_splits(batch, num_kv_heads, max_context, num_sms(device))


def _default_launch(
    block_d: int, fp8_cache: bool, programs: int, num_splits: int, sms: int
) -> tuple[int, int, int]:
    """(tokens per inner step, warps, pipeline stages) for `programs` = B * Hkv programs.

    Measured at 64-wide heads on the H200 (scripts/decode_attention_sweep.py, graph-timed;
    only what separate runs agree on is a default here):
    - split contexts (small batches, long contexts): 128-token steps, four warps, three
      stages; at batch 1, 32k tokens, 22.8 us against 28.2 with 64-token steps (runs 67, 117,
      119), and fewer warps do not help (run 136: 20.7 against 18.6 us with FP8 pages); FP8
      pages at 2 to 16 sequences excepted (below);
    - BF16 pages, unsplit: four warps; many programs per SM (256 sequences of 1k tokens) take
      64-token steps and two stages (134.2 against 148.7 us with three, run 119), at most four
      programs per SM (64 sequences of 4k) 128-token steps and two stages (133.6 against
      176.9 us);
    - FP8 pages, unsplit: fewer warps and deeper pipelines. With four warps a tile's row
      maxima and sums cross warps through shared memory, and the loop waits at each barrier;
      one warp reduces by shuffles (runs 136-137, two processes agreeing within 0.3%: 256 x
      1k, 64-token steps, three stages, 117.2 -> 97.5 us). Five stages instead of three then
      keep more copies in flight (runs 139-140): 256 x 1k, one warp, 97.9 -> 83.7 us (0.76 of
      copy), 128 x 1k 51.8 -> 43.2; at most four programs per SM, two warps, 128-token steps:
      64 x 4k 114.5 -> 95.1, 48 x 1k 30.6 -> 27.7 (four warps, two stages: 25.5, but 153 us at
      64 x 4k). Four stages measured as three, six as five;
    - FP8 pages split into more than 4 slices but fewer than `_MAX_SPLITS` (measured at 5 to
      33: 2 to 16 sequences at 8 KV heads): two warps and five stages as well (run 142): 2 x
      16k 24.8 -> 20.0 us, 4 x 16k 43.7 -> 32.2, 8 x 8k 43.9 -> 35.4, 16 x 4k 40.4 -> 37.9.
      Into at most 4 slices (17 to 32 sequences): four warps and five stages (runs 140, 142,
      143: 32 x 2k 37.4 -> 34.0). At the most slices (batch 1) four warps and three stages
      stayed best (1 x 32k 18.7 against 20.0).
    Wider heads keep the shape they were measured with (32-token steps, three stages)."""
    if block_d > 64:
        return 32, 4, 3
    if num_splits > 1:
        if not fp8_cache or num_splits >= _MAX_SPLITS:
            return 128, 4, 3
        return (128, 4, 5) if num_splits <= 4 else (128, 2, 5)
    many = programs > 4 * sms
    if fp8_cache:
        return (64, 1, 5) if many else (128, 2, 5)
    return (64, 4, 2) if many else (128, 4, 2)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    kv_scales: torch.Tensor | None = None,
    sliding_window: int | None = None,
    *,
    num_splits: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query per sequence over its paged K/V. See `reference.paged_decode_attention`.

    `out` ([B, Hq, D], q's dtype, unit last stride): where to write, e.g. the decode rows of a
    packed step's output (`prefill_attention`'s decode tail); a new tensor by default.
    `num_splits` forces the number of context slices (1 = no flash-decoding merge); by default
    `choose_num_splits` picks it from B, Hkv, the SM count and block_tables' width. `tile_n`
    (tokens per inner step), `num_warps` and `num_stages` are the kernel's launch shape,
    settable for tuning sweeps; each defaults to `_default_launch`'s.
    """
    q = unit_last_stride(q)
    block_tables, seq_lens = unit_last_stride(block_tables), seq_lens.contiguous()
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    if out is None:
        out = torch.empty((batch, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    sms = num_sms(q.device)
    if num_splits is None:
        num_splits = default_num_splits(
            batch, num_kv_heads, block_tables, page_size, sliding_window, q.device
        )
    num_splits = max(1, int(num_splits))
    if num_splits > 1:
        partial_acc = torch.empty(
            (batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        partial_max = torch.empty(
            (batch, num_q_heads, num_splits), dtype=torch.float32, device=q.device
        )
        partial_sum = torch.empty_like(partial_max)
    else:  # unused by the kernel
        partial_acc = partial_max = partial_sum = out
    block_d = max(16, next_pow2(head_dim))  # tl.dot needs K >= 16
    default_tile, default_warps, default_stages = _default_launch(
        block_d, kv_scales is not None, batch * num_kv_heads, num_splits, sms
    )
    tile_n = tile_n or default_tile
    num_warps = num_warps or default_warps
    num_stages = num_stages or default_stages
    pdl = use_pdl(q.device)
    _decode_attention_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        kv_scales if kv_scales is not None else seq_lens,  # unread without an FP8 cache
        out,
        partial_acc,
        partial_max,
        partial_sum,
        scale * math.log2(math.e),
        sliding_window or 0,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        # tl.dot needs at least 16 rows; the padding rows are masked.
        BLOCK_G=max(16, next_pow2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE_SIZE=page_size,
        TILE_N=tile_n,
        NUM_SPLITS=num_splits,
        DOT_DTYPE=_operand_dtype(q.dtype, fp8_cache=kv_scales is not None),
        PRECISION=dot_precision(q.dtype),
        FP8_CACHE=kv_scales is not None,
        USE_PDL=pdl,
        SLIDING=sliding_window is not None,
        num_warps=num_warps,
        num_stages=num_stages,
        launch_pdl=pdl,
    )
    if num_splits > 1:
        # Two programs a head, each merging half of head_dim, one warp each: measured on the
        # H200 at batch 1 (BENCHMARKS.md run 189, attention + merge graph-timed), 1 x 32k
        # 22.47 -> 22.00 us, 1 x 4k 8.42 -> 7.78, FP8 pages 1 x 32k 18.72 -> 18.28; the 32k
        # decode row +0.9% (run 190). Four warps stay for heads of 128 and wider (not measured).
        d_parts = 2 if block_d >= 32 else 1
        _merge_splits_kernel[(batch, num_q_heads, d_parts)](
            partial_acc,
            partial_max,
            partial_sum,
            seq_lens,
            out,
            sliding_window or 0,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d // d_parts,
            NUM_SPLITS=num_splits,
            BLOCK_S=next_pow2(num_splits),
            TILE_N=tile_n,
            SLIDING=sliding_window is not None,
            USE_PDL=pdl,
            num_warps=4 if block_d >= 128 else 1,
            launch_pdl=pdl,
        )
    return out
