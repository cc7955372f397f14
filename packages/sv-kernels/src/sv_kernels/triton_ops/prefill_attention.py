# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# (Triton kernels are typed by Triton when it specializes them, not by Python annotations.)
"""Causal flash attention for prompts packed varlen, with K/V read from the paged cache.

Grid (query tiles, Hq, B). A program owns TILE_M consecutive queries of one sequence and one
query head. Its queries are the last q_len positions of the sequence (a prefix may already be
in the cache), so query row i sits at position `seq_len - q_len + i`. Key tiles wholly below
the tile's first query position are attended without a mask; the few tiles that cross the
diagonal are masked; key tiles past the tile's last query are never visited.

A sliding window of W positions (query p sees keys p - W < k <= p) bounds the key tiles from
below as well: tiles wholly before every row's window are never visited (so their pages are
never read and their table entries may be stale), and the tiles at the window's lower edge are
masked like the diagonal ones.

A mixed step's decodes (sequences feeding one token, packed after the prompt chunks) would each
cost this kernel Hq programs of TILE_M-row tiles with one live row, every one reading the
sequence's whole context: 32 reads of it where the decode kernel, one program per KV head,
makes 8 (Llama 3.2 1B), and 128 rows of tensor-core work per key for one. Given the step's
`decode_tail`, its last sequences run through `decode_attention` instead, into the same output,
when there are enough of them that the decode kernel runs unsplit (`default_num_splits` gives 1:
the launch shapes every large decode graph has compiled). Fewer stay here: split, the decode
kernel would compile a variant per slice count mid-run, and a handful of rows costs little.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import cdiv, dot_dtype, dot_precision, next_pow2, unit_last_stride
from .decode_attention import default_num_splits, paged_decode_attention


@triton.jit
def _attend_key_tile(
    q,
    acc,
    m_i,
    l_i,
    k_head,
    v_head,
    table,
    tile_start,
    key_start,
    key_end,
    q_pos,
    scale_log2,
    window,
    stride_kc_page,
    stride_kc_slot,
    stride_vc_page,
    stride_vc_slot,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    SLIDING: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One online-softmax step over keys tile_start .. tile_start + TILE_N - 1."""
    keys = tile_start + tl.arange(0, TILE_N)
    key_valid = keys < key_end
    if SLIDING:
        # Keys before key_start lie in pages that may have been given back: never loaded.
        key_valid &= keys >= key_start
    pages = tl.load(table + keys // PAGE_SIZE, mask=key_valid, other=0).to(tl.int64)
    in_page = keys % PAGE_SIZE
    d = tl.arange(0, BLOCK_D)
    kv_mask = key_valid[:, None] & (d < HEAD_DIM)[None, :]
    k_offsets = pages[:, None] * stride_kc_page + in_page[:, None] * stride_kc_slot + d[None, :]
    k = tl.load(k_head + k_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    if CAUSAL_MASK:
        visible = (keys[None, :] <= q_pos[:, None]) & key_valid[None, :]
        if SLIDING:
            visible &= keys[None, :] > q_pos[:, None] - window
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    if SLIDING:
        # A row may see no key of a window-edge tile yet (max -inf): subtract 0, not -inf.
        m_new = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v_offsets = pages[:, None] * stride_vc_page + in_page[:, None] * stride_vc_slot + d[None, :]
    v = tl.load(v_head + v_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _prefill_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cu_seqlens_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    kv_scales_ptr,
    out_ptr,
    scale_log2,
    window,
    stride_qt,
    stride_qh,
    stride_kc_page,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_page,
    stride_vc_slot,
    stride_vc_head,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    FP8_CACHE: tl.constexpr,
    SLIDING: tl.constexpr,
):
    # Later query tiles see more keys: launch them first so the longest programs do not trail.
    q_tile = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    q_first = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_first
    row_start = q_tile * TILE_M
    if row_start >= q_len:  # the grid is sized for the longest prompt
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len  # tokens before the first query: a prefix already cached

    rows = row_start + tl.arange(0, TILE_M)
    row_mask = rows < q_len
    q_pos = context + rows
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    io_mask = row_mask[:, None] & d_mask[None, :]
    q_offsets = (q_first + rows)[:, None].to(tl.int64) * stride_qt + head * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=io_mask, other=0.0).to(DOT_DTYPE)

    m_i = tl.full([TILE_M], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_M], tl.float32)
    acc = tl.zeros([TILE_M, BLOCK_D], tl.float32)
    kv_head = head // GROUP
    if FP8_CACHE:  # K's scale folds into the scores, V's into the result: one head each
        scale_log2 = scale_log2 * tl.load(kv_scales_ptr + kv_head)
    k_head = k_cache_ptr + kv_head * stride_kc_head
    v_head = v_cache_ptr + kv_head * stride_vc_head
    table = block_tables_ptr + seq * stride_bt
    # One past the last key any row of this tile may see.
    key_end = tl.minimum(seq_len, context + row_start + TILE_M)
    # Key tiles that end at or before the first row's position are visible to every row.
    unmasked_end = ((context + row_start + 1) // TILE_N) * TILE_N
    # With a window: the first tile any row sees, and the first one every row sees whole.
    key_start = 0
    first_tile = 0
    unmasked_start = 0
    if SLIDING:
        key_start = tl.maximum(context + row_start - window + 1, 0)
        first_tile = (key_start // TILE_N) * TILE_N
        unmasked_start = tl.cdiv(tl.maximum(key_end - window, 0), TILE_N) * TILE_N
        unmasked_start = tl.minimum(tl.maximum(unmasked_start, first_tile), unmasked_end)
    for tile_start in range(first_tile, unmasked_start, TILE_N):
        acc, m_i, l_i = _attend_key_tile(
            q, acc, m_i, l_i, k_head, v_head, table, tile_start, key_start, key_end, q_pos, scale_log2,
            window, stride_kc_page, stride_kc_slot, stride_vc_page, stride_vc_slot,
            HEAD_DIM, BLOCK_D, PAGE_SIZE, TILE_N, True, SLIDING, DOT_DTYPE, PRECISION,
        )  # fmt: skip
    for tile_start in range(unmasked_start, unmasked_end, TILE_N):
        acc, m_i, l_i = _attend_key_tile(
            q, acc, m_i, l_i, k_head, v_head, table, tile_start, key_start, key_end, q_pos, scale_log2,
            window, stride_kc_page, stride_kc_slot, stride_vc_page, stride_vc_slot,
            HEAD_DIM, BLOCK_D, PAGE_SIZE, TILE_N, False, SLIDING, DOT_DTYPE, PRECISION,
        )  # fmt: skip
    for tile_start in range(unmasked_end, key_end, TILE_N):
        acc, m_i, l_i = _attend_key_tile(
            q, acc, m_i, l_i, k_head, v_head, table, tile_start, key_start, key_end, q_pos, scale_log2,
            window, stride_kc_page, stride_kc_slot, stride_vc_page, stride_vc_slot,
            HEAD_DIM, BLOCK_D, PAGE_SIZE, TILE_N, True, SLIDING, DOT_DTYPE, PRECISION,
        )  # fmt: skip

    if FP8_CACHE:
        acc = acc * tl.load(kv_scales_ptr + tl.num_programs(1) // GROUP + kv_head)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_offsets = (q_first + rows)[:, None].to(tl.int64) * stride_ot + head * stride_oh + d[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_seqlen_q: int,
    kv_scales: torch.Tensor | None = None,
    sliding_window: int | None = None,
    decode_tail: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    tile_m: int | None = None,
    tile_n: int | None = None,
) -> torch.Tensor:
    """Causal varlen attention over paged K/V. See `reference.prefill_attention`.

    `max_seqlen_q` (a host int, >= every q_len) sizes the grid. `decode_tail`: (seq_lens,
    block_tables) of the batch's last sequences when each feeds one token (see the module doc).
    `tile_m` / `tile_n` override the query / key tile sizes (powers of two >= 16), for tests.
    """
    q = unit_last_stride(q)
    block_tables = unit_last_stride(block_tables)
    cu_seqlens_q, seq_lens = cu_seqlens_q.contiguous(), seq_lens.contiguous()
    num_tokens, num_q_heads, head_dim = q.shape
    batch = seq_lens.shape[0]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or batch == 0 or max_seqlen_q <= 0:
        return out
    if decode_tail is not None:
        tail_lens, tail_tables = decode_tail
        decodes = tail_lens.shape[0]
        if (
            decodes
            and default_num_splits(
                decodes, num_kv_heads, tail_tables, page_size, sliding_window, q.device
            )
            == 1
        ):
            first = num_tokens - decodes
            paged_decode_attention(
                q[first:],
                k_cache,
                v_cache,
                tail_tables,
                tail_lens,
                scale,
                kv_scales,
                sliding_window,
                num_splits=1,
                out=out[first:],
            )
            batch -= decodes
            if batch == 0:
                return out
    block_d = max(16, next_pow2(head_dim))  # tl.dot needs K >= 16
    # 128 x 64 tiles for 16-bit inputs. FP32 (tests, mostly) multiplies on the FMA units in
    # full precision and needs far more registers per tile: 32 x 32 tiles over 8 warps.
    wide = q.dtype != torch.float32
    if tile_m is None:
        tile_m = min(128 if wide else 32, max(16, next_pow2(max_seqlen_q)))
    if tile_n is None:
        tile_n = 64 if wide else 32
    grid = (cdiv(max_seqlen_q, tile_m), num_q_heads, batch)
    _prefill_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        seq_lens,
        block_tables,
        kv_scales if kv_scales is not None else seq_lens,  # unread without an FP8 cache
        out,
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
        GROUP=num_q_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE_SIZE=page_size,
        TILE_M=tile_m,
        TILE_N=tile_n,
        DOT_DTYPE=dot_dtype(q.dtype),
        PRECISION=dot_precision(q.dtype),
        FP8_CACHE=kv_scales is not None,
        SLIDING=sliding_window is not None,
        num_warps=8 if tile_m >= 128 or not wide else 4,
        num_stages=3 if block_d <= 64 else 2,
    )
    return out
